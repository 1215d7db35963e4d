"""Transformers GPT-2 folders for the --init_from tests (tests/unit/test_init_from_unit.py and
tests/distributed/test_init_from.py), and any transformers model read back as --init_from reads a folder (the model
tests against transformers)."""

from __future__ import annotations

import contextlib
from argparse import Namespace
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from growlm.data import tokenizer as tok
from growlm.model.config import GPTConfig
from growlm.model.gpt2.hf import to_hf
from growlm.model.gpt2.model import GPT
from growlm.model.registry import build_model
from growlm.trainer.init_from import open_init_from

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


def read_as_init_from(hf_model: Any, folder: Path) -> Any:
    """``hf_model`` (a transformers GPT-2, Llama or Qwen 2 model) saved into ``folder`` by ``save_pretrained`` and
    read back as train.py --init_from reads a folder (trainer.init_from.open_init_from: the family and shape from
    config.json, each parameter's tensor by the name ``map_tensors`` matched it to), its tensors copied into a fresh
    growlm model of that shape as ``load_weights`` copies them into an engine; in eval mode."""
    hf_model.save_pretrained(str(folder), safe_serialization=True)
    src = open_init_from(Namespace(init_from=str(folder), resume=None, preset=None, dropout=None))
    model = build_model(src.config)
    with contextlib.ExitStack() as stack, torch.no_grad():
        opened = {f: stack.enter_context(safe_open(str(f), framework="pt")) for f in sorted(set(src.files.values()))}
        for name, p in model.named_parameters():
            key = src.keys[name]
            p.copy_(opened[src.files[key]].get_tensor(key).float())
    return model.eval()
