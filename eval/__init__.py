"""Evaluation by job: metrics/ (perplexity, cloze, text sets, model loading, growlm-eval), bench/ (benchmarks,
growlm-bench), experiments/ (the staged-training experiment, growlm-experiment); committed results in results/."""
