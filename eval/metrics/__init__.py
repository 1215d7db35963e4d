"""Model quality: perplexity (token and word), LAMBADA-style cloze, the held-out text sets, model loading and the
growlm-eval command (eval.metrics.cli)."""
