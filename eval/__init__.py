"""Metrics and benchmarks: perplexity, accuracy, throughput."""
