"""Conversion between growlm's GPT and ``transformers.GPT2LMHeadModel`` (both directions).

Both models use the same parameter names and the same (in, out) Conv1D layout, so conversion is a name filter:
HF adds ``lm_head.weight`` (tied) and, in some versions, non-persistent ``attn.bias`` causal-mask buffers.
This is the only module of model/ that imports ``transformers`` (lazily, inside functions).
"""

from __future__ import annotations

import json
import os
import struct
from typing import TYPE_CHECKING

import torch

from growlm.model.config import GPTConfig
from growlm.model.gpt import GPT

if TYPE_CHECKING:
    from transformers import GPT2Config, GPT2LMHeadModel


def to_hf_config(cfg: GPTConfig, eot_token_id: int | None = None) -> GPT2Config:
    """The ``transformers.GPT2Config`` describing the same model (pre-LN, tanh GELU, tied head).

    ``eot_token_id``: the tokenizer's end-of-text id, written as bos/eos_token_id (None: GPT-2's 50256 when the
    vocabulary holds it, else none).
    """
    from transformers import GPT2Config  # lazy: heavy (about 2 s), only for the transformers GPT-2

    if eot_token_id is None and cfg.vocab_size > 50256:
        eot_token_id = 50256

    return GPT2Config(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.n_positions,
        n_embd=cfg.n_embd,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_inner=cfg.n_inner,
        activation_function="gelu_new",
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.dropout,
        layer_norm_epsilon=cfg.layer_norm_epsilon,
        tie_word_embeddings=True,
        bos_token_id=eot_token_id,
        eos_token_id=eot_token_id,
    )


def from_hf_config(hf_cfg: GPT2Config) -> GPTConfig:
    """The GPTConfig of a ``transformers.GPT2Config``.

    Raises:
        ValueError: the HF config uses a feature growlm's GPT does not implement (another activation, untied
            head, scaled or reordered attention, or unequal dropouts).
    """
    unsupported = []
    if hf_cfg.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        unsupported.append(f"activation_function={hf_cfg.activation_function!r} (need 'gelu_new')")
    if not getattr(hf_cfg, "tie_word_embeddings", True):
        unsupported.append("tie_word_embeddings=False")
    if getattr(hf_cfg, "scale_attn_by_inverse_layer_idx", False) or getattr(hf_cfg, "reorder_and_upcast_attn", False):
        unsupported.append("scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn")
    if not getattr(hf_cfg, "scale_attn_weights", True):
        unsupported.append("scale_attn_weights=False")
    drops = {hf_cfg.resid_pdrop, hf_cfg.embd_pdrop, hf_cfg.attn_pdrop}
    if len(drops) > 1:
        unsupported.append(f"unequal dropouts {sorted(drops)}")
    if unsupported:
        raise ValueError("cannot convert this GPT2Config: " + "; ".join(unsupported))
    return GPTConfig(
        n_layer=hf_cfg.n_layer,
        n_embd=hf_cfg.n_embd,
        n_head=hf_cfg.n_head,
        n_inner=hf_cfg.n_inner,
        n_positions=hf_cfg.n_positions,
        vocab_size=hf_cfg.vocab_size,
        dropout=float(drops.pop()),
        layer_norm_epsilon=hf_cfg.layer_norm_epsilon,
    )


def to_hf(model: GPT, eot_token_id: int | None = None) -> GPT2LMHeadModel:
    """A ``GPT2LMHeadModel`` holding copies of ``model``'s weights (fp32), in eval mode (``eot_token_id``: as in
    ``to_hf_config``).

    Raises:
        ValueError: the model still carries growth masks (finish the ramp first; a masked model is not GPT-2).
    """
    from transformers import GPT2LMHeadModel  # lazy: heavy (about 2 s), only for the transformers GPT-2

    if any("mask" in name or "gate" in name for name, _ in model.named_buffers()):
        raise ValueError("model still has growth masks; let the mask ramp finish (masks at 1 are removed) first")
    hf = GPT2LMHeadModel(to_hf_config(model.config, eot_token_id))
    ours = {k: v.detach().float() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    missing, unexpected = hf.load_state_dict(ours, strict=False)
    missing = [k for k in missing if not k.endswith((".attn.bias", ".attn.masked_bias")) and k != "lm_head.weight"]
    if missing or unexpected:
        raise ValueError(f"state dict mismatch converting to HF: missing {missing}, unexpected {unexpected}")
    hf.tie_weights()
    return hf.eval()


def from_hf(hf_model: GPT2LMHeadModel) -> GPT:
    """A growlm GPT with copies of ``hf_model``'s weights (fp32).

    Raises:
        ValueError: the HF config is not convertible (see ``from_hf_config``) or parameters are missing.
    """
    model = GPT(from_hf_config(hf_model.config))
    theirs = {
        k: v.detach().float()
        for k, v in hf_model.state_dict().items()
        if not k.endswith((".attn.bias", ".attn.masked_bias")) and k != "lm_head.weight"
    }
    with torch.no_grad():
        missing, unexpected = model.load_state_dict(theirs, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ValueError(f"state dict mismatch converting from HF: missing {missing}, unexpected {unexpected}")
    return model


def safetensors_problem(path: str | os.PathLike) -> str | None:
    """What is wrong with the safetensors file ``path``, as the middle of a one-line refusal ("is truncated: ..."),
    or None for a whole file. Reads the 8-byte header length and the JSON header only (no tensor data) and checks
    that the file is exactly as long as the header says: a copy cut short, an empty file, or another format fails
    here rather than deep inside a loader. Bytes changed inside the tensor data are not detected.

    Raises:
        OSError: the file cannot be opened or read (missing, permissions).
    """
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"is {size} bytes, too short for a safetensors file (empty or truncated)"
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            return (
                f"is {size:,} bytes, shorter than its own {n:,}-byte header says (truncated, or not a safetensors file)"
            )
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError, KeyError, IndexError, TypeError, ValueError):
        return "has a damaged header (not the JSON table of a safetensors file)"
    want = 8 + n + max(ends, default=0)
    if size < want:
        return f"is truncated: {size:,} bytes, its header describes {want:,}"
    if size > want:
        return f"is {size:,} bytes, {size - want:,} more than its header describes (damaged, or two files joined)"
    return None


def tensors_differ(a: tuple[str | os.PathLike, str], b: tuple[str | os.PathLike, str], rows: int = 4096) -> bool:
    """Whether two tensors of safetensors files, each ``(file, tensor name)``, differ in shape or in any value,
    compared ``rows`` rows at a time (memory: two slices; e.g. a folder that declares its LM head tied to the token
    embedding but holds a head of its own: transformers ties it, or does not, by version).

    Raises:
        OSError, safetensors.SafetensorError: a file cannot be read.
    """
    from safetensors import safe_open  # lazy: only for a folder's weights

    with safe_open(str(a[0]), framework="pt") as fa, safe_open(str(b[0]), framework="pt") as fb:
        sa, sb = fa.get_slice(a[1]), fb.get_slice(b[1])
        shape = sa.get_shape()
        if shape != sb.get_shape():
            return True
        if not shape:
            return not torch.equal(fa.get_tensor(a[1]), fb.get_tensor(b[1]))
        return any(not torch.equal(sa[i : i + rows], sb[i : i + rows]) for i in range(0, shape[0], rows))
