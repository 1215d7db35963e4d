"""Benchmarks: training throughput through train.py (growlm-bench, eval.bench.throughput), the plain PyTorch
baseline, device peaks, reports, the cost of live and offline growth, and the operators' dynamics. Commands: they
launch train.py and sit above trainer."""
