"""What every model family's shape shares: the ``ModelConfig`` type, reading a saved config of any family, the
presets of all families, and the numbers a shape implies (parameter count, FLOPs per token, the largest parameter,
the shape a growth targets), each asked of the family's config class (model/<family>/config.py; model.registry).

Shape symbols used across growlm: B batch, T tokens in a sequence, V vocab, L n_layer, d n_embd, H n_head,
Q head dim (d // H for GPT-2; Llama-shaped families may set it), F n_inner (FFN width), P n_positions, K n_kv_head
(key/value heads; GPT-2 has K = H).
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, TypeAlias

from growlm.model.gpt2.config import GPTConfig
from growlm.model.llama.config import LlamaConfig
from growlm.model.registry import FAMILIES, family

ModelConfig: TypeAlias = GPTConfig | LlamaConfig  # every family's config is one of these or a subclass (Qwen 2's)

PRESETS: dict[str, ModelConfig] = {name: cfg for f in FAMILIES.values() for name, cfg in f.presets.items()}


def config_from_dict(d: dict[str, Any]) -> ModelConfig:
    """The config a ``to_dict`` wrote, of any family: its ``"arch"`` names the family; no arch is GPT-2 (whose
    configs were saved without one).

    Raises:
        ValueError: an unknown arch or unknown fields.
    """
    return family(d.get("arch", "gpt2")).config.from_dict({k: v for k, v in d.items() if k != "arch"})


def from_preset(name: str, **overrides: Any) -> ModelConfig:
    """A named preset with some fields replaced, e.g. ``from_preset("gpt2", n_layer=6)``.

    Overrides whose value is None are ignored, except GPT-2's ``n_inner`` (None there means 4 * n_embd), so CLI
    arguments can be passed straight through. For a Llama-shaped preset, a changed n_embd or n_head re-derives
    head_dim (d // H) unless head_dim is given, and a changed n_embd re-derives n_inner unless n_inner is given
    (the family's ``preset_overrides``).

    Raises:
        ValueError: unknown preset name, a field the preset's family does not have, or the resulting shape is
            invalid.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; use one of: {', '.join(PRESETS)}")
    base = PRESETS[name]
    known = {f.name for f in fields(base)}
    unknown = set(overrides) - known
    if unknown:
        raise ValueError(
            f"unknown {type(base).__name__} fields {sorted(unknown)} for preset {name!r}; known fields are "
            f"{sorted(known)}"
        )
    return replace(base, **base.preset_overrides(overrides))


def grown_shape(base: ModelConfig, changes: dict[str, Any]) -> ModelConfig:
    """The shape a growth of ``base`` targets when only ``changes`` are given (a plan's target mapping, growlm-grow's
    shape flags): the fields given are taken as they are, and the ones that follow the width follow it unless given
    (the family's ``grown``). GPT-2: n_inner None means 4 x n_embd, head_dim is d // H. Llama-shaped: n_inner scales
    with n_embd, n_kv_head keeps the query heads per key/value head when n_head changes, head_dim stays when n_head is
    given and scales with n_embd when only n_embd is.

    Raises:
        ValueError: the resulting shape is invalid (e.g. a width that the head count does not divide).
    """
    return base.grown(changes)


def largest_param_numel(cfg: ModelConfig) -> int:
    """Elements of the model's largest parameter (the family's ``largest_param_numel``)."""
    return cfg.largest_param_numel()


def param_count(cfg: ModelConfig, *, include_position_embeddings: bool = True) -> int:
    """Number of trainable parameters, a tied LM head counted once, as transformers counts them (the family's
    ``param_count``; GPT-2's learned position embeddings only when ``include_position_embeddings``)."""
    return cfg.param_count(include_position_embeddings=include_position_embeddings)


def flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Training FLOPs per token (forward + backward, no activation recomputation): 6 N + 12 L H Q T.

    N counts every weight that takes part in a matmul (the family's ``matmul_params``: GPT-2 all but the position
    embeddings, with the tied embedding counted once as the LM head's matmul; Llama-shaped all but an untied
    embed_tokens, a lookup). The attention term 12 L H Q T covers QK^T and AV for a causal sequence of T tokens over
    the H query heads (GQA shares keys and values between heads but computes every head's scores), as in PaLM
    (Chowdhery et al. 2022, arXiv 2204.02311, appendix B) and nanoGPT's ``estimate_mfu``. Units: FLOPs per token.

    Raises:
        ValueError: seq_len is not in [1, n_positions].
    """
    if not 1 <= seq_len <= cfg.n_positions:
        raise ValueError(f"seq_len={seq_len} must be in [1, n_positions={cfg.n_positions}]")
    return 6 * cfg.matmul_params() + 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * seq_len
