"""Transformers GPT-2 folders for the --init_from tests (tests/unit/test_init_from_unit.py and
tests/distributed/test_init_from.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from growlm.data import tokenizer as tok
from growlm.model.config import GPTConfig
from growlm.model.gpt2.hf import to_hf
from growlm.model.gpt2.model import GPT

# the "tiny" preset's shape with a shorter context: GPT-2 BPE, so the built-in corpus fits its vocabulary
TINY = GPTConfig(n_layer=2, n_embd=64, n_head=4, n_positions=64)


def make_hf_folder(path: Path, cfg: GPTConfig = TINY, seed: int = 7, tokenizer: bool = True) -> Path:
    """Write a transformers GPT-2 folder as ``growlm-grow --export_hf`` does: config.json, model.safetensors (fp32,
    GPT-2 init seeded by ``seed`` with the biases and LayerNorms perturbed, so no value is a default) and, if
    ``tokenizer``, the GPT-2 BPE tokenizer files."""
    torch.manual_seed(seed)
    model = GPT(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.05 * torch.randn_like(p))
    to_hf(model, tok.EOT_TOKEN_ID).save_pretrained(str(path), safe_serialization=True)
    if tokenizer:
        tok.gpt2().save_hf(path, model_max_length=cfg.n_positions)
    return path


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of ``path``/model.safetensors."""
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "model.safetensors"))
