"""Evaluation by job: ``metrics/`` (perplexity, cloze, text sets, model loading, training-dynamics measures and the
tiny grow-and-measure harness; growlm-eval) sits below trainer, which uses its perplexity; ``bench/`` (growlm-bench)
and ``experiments/`` (growlm-experiment) launch train.py and sit above it. Committed measurements are data in
``results/`` (no Python package)."""
