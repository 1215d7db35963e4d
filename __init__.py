"""growlm: DeepSpeed pretraining of GPT-2, Llama and Qwen 2 models that grows the model while it trains.

One import namespace, the repository's top level: ``model`` (the growth-aware model families) < ``runtime`` (DeepSpeed:
process group, engine, checkpoints) < ``data`` (tokenizer, corpus, token files) < ``growth`` (operators, live and
offline growth, the plan's stages) < ``trainer`` (the run behind ``train``, its held-out scoring included) < the
tools (``train``, ``trainer.driver``, all of ``eval``: growlm-eval, growlm-bench, growlm-experiment). An import only
points down this list (DESIGN.md, "Layers"; checked by tests/unit/test_layers.py).
"""

from pathlib import Path

__version__ = "0.2.0"

PACKAGE_DIR = Path(__file__).resolve().parent  # the repository in a clone, site-packages/growlm when installed
DS_CONFIG_DIR = PACKAGE_DIR / "ds_configs"  # the shipped DeepSpeed configs (package data)
TRAIN_SCRIPT = PACKAGE_DIR / "train.py"  # the script every launcher runs on each rank (growlm.train)
