"""The tools, all above trainer (DESIGN.md, "Layers"): ``metrics/`` (growlm-eval: document and word perplexity,
cloze, text sets, model loading), ``bench/`` (growlm-bench and the other benchmarks, the growth-dynamics measures and
their tiny grow-and-measure harness among them) and ``experiments/`` (growlm-experiment). The token scorer training
and growlm-eval share is trainer.scoring. Committed measurements are data in ``results/`` (no Python package)."""
