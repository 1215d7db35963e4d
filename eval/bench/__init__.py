"""Benchmarks: training throughput through train.py (growlm-bench, eval.bench.throughput), the plain PyTorch
baseline, device peaks, reports, and the cost of live growth, offline growth and the growth operators."""
