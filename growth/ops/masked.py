"""Masked Structural Growth (MSG, Yao et al. 2023, arXiv 2305.02869, sections 3-4): grow n_layer, n_embd, n_head and
n_inner, alone or together, to any larger size, exactly preserving the function whatever the new weights are.

Old values sit in the leading positions of each grown axis (attention: head h, dim r -> h * Q' + r), new units are
initialised from a seed and masked (model/masks.py); new blocks are gated. Torch only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from growlm.growth.errors import GrowthError
from growlm.growth.ops.common import BLOCK_PARAMS, check_no_shrink, layer_map
from growlm.growth.ops.rules import Map, Rule, RuleSet, seeded_normal
from growlm.model.config import GPTConfig
from growlm.model.masks import MaskSpec, attn_index

NEW_LAYER_INITS = ("copy", "fresh")
# mask ramp defaults (masked_growth): a fraction of the run left at growth; MSG's code default (cofe-ai/MSG,
# run_grow_bert.py, --grow_time) of 5000 steps where the run's length is unknown
DEFAULT_RAMP_FRAC = 0.25
DEFAULT_RAMP_STEPS = 5000


def _axis_kinds(suffix: str) -> tuple[str | None, ...]:
    """Per axis of a parameter: h hidden, a attention, qkv fused q|k|v attention, f FFN, None unchanged."""
    return {
        "transformer.wte.weight": (None, "h"),
        "transformer.wpe.weight": (None, "h"),
        "attn.c_attn.weight": ("h", "qkv"),
        "attn.c_attn.bias": ("qkv",),
        "attn.c_proj.weight": ("a", "h"),
        "mlp.c_fc.weight": ("h", "f"),
        "mlp.c_fc.bias": ("f",),
        "mlp.c_proj.weight": ("f", "h"),
    }.get(suffix, ("h",))  # LayerNorm weights/biases and c_proj biases


def _embed(index: tuple[Tensor, ...], scale: Tensor | None, fill: Map) -> Map:
    """x -> fill(x) with x (times ``scale`` along its last axis) written at the positions ``index`` (one int64
    index vector per axis)."""

    def f(x: Tensor) -> Tensor:
        out = fill(x)
        val = x if scale is None else x * scale.to(dtype=x.dtype, device=x.device)
        if out.is_meta:
            return out
        ix = [i.to(x.device) for i in index]
        if len(ix) == 2:
            out[ix[0][:, None], ix[1][None, :]] = val
        else:
            out[ix[0]] = val
        return out

    return f


def _check_masked(old: GPTConfig, new: GPTConfig, new_layers: str) -> None:
    """The refusals of ``masked_growth`` (see its Raises)."""
    check_no_shrink(old, new)
    if new.head_dim < old.head_dim:
        raise GrowthError(
            f"head dim would shrink from {old.head_dim} to {new.head_dim} (n_embd={new.n_embd}, n_head={new.n_head}); "
            f"the masked family keeps old heads whole: set n_embd >= {new.n_head * old.head_dim}"
        )
    if new_layers not in NEW_LAYER_INITS:
        raise GrowthError(f"unknown new_layers={new_layers!r}; use one of {NEW_LAYER_INITS}")
    if (old.n_layer, old.n_embd, old.n_head, old.ffn_dim) == (new.n_layer, new.n_embd, new.n_head, new.ffn_dim):
        raise GrowthError(f"nothing grows: target {new.shape_str()} equals the current shape; change the target")


@dataclass(frozen=True)
class _Ctx:
    """What every parameter's rule of one masked growth shares."""

    new: GPTConfig
    index: dict[str, Tensor]  # axis kind -> positions of the old entries in the grown axis
    a_new: int  # grown attention width H'Q'
    c: float  # q scale sqrt(Q'/Q)
    q_scale: Tensor
    init_std: float
    bias_std: float
    seed: int
    new_layers: str


def _ctx(old: GPTConfig, new: GPTConfig, **options: Any) -> _Ctx:
    """The shared context of a masked growth from ``old`` to ``new`` (``options``: init_std, bias_std, seed,
    new_layers)."""
    d, f = old.n_embd, old.ffn_dim
    ai = attn_index(old.n_head, old.head_dim, new.head_dim)
    a_new = new.n_embd  # attention width H'Q'
    index = {
        "h": torch.arange(d),
        "a": ai,
        "qkv": torch.cat([ai + t * a_new for t in range(3)]),
        "f": torch.arange(f),
    }
    c = math.sqrt(new.head_dim / old.head_dim)
    q_scale = torch.ones(3 * old.n_embd, dtype=torch.float64)
    q_scale[: old.n_embd] = c
    return _Ctx(new, index, a_new, c, q_scale, **options)


def _rule(ctx: _Ctx, new_name: str, old_name: str, suffix: str, is_new_block: bool) -> Rule:
    """The Rule of grown parameter ``new_name`` (from ``old_name``; ``suffix`` names its kind)."""
    new, index, a_new, c, q_scale = ctx.new, ctx.index, ctx.a_new, ctx.c, ctx.q_scale
    init_std, bias_std, seed, new_layers = ctx.init_std, ctx.bias_std, ctx.seed, ctx.new_layers
    kinds = _axis_kinds(suffix)
    sizes = {"h": new.n_embd, "a": a_new, "qkv": 3 * a_new, "f": new.ffn_dim}
    new_shapes = [None if k is None else sizes[k] for k in kinds]  # None: the axis keeps its old length

    def new_shape(x: Tensor) -> tuple[int, ...]:
        return tuple(x.shape[ax] if n is None else n for ax, n in enumerate(new_shapes))

    is_ln_gain = suffix.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight"))
    is_bias = suffix.endswith("bias")

    def fill(x: Tensor) -> Tensor:
        shape = new_shape(x)
        if is_ln_gain:
            return 1.0 + seeded_normal(shape, bias_std, new_name, seed, x)
        return seeded_normal(shape, bias_std if is_bias else init_std, new_name, seed, x)

    def zero_fill(x: Tensor) -> Tensor:
        return x.new_zeros(new_shape(x))

    def full_index(x: Tensor) -> tuple[Tensor, ...]:  # an unchanged axis is written whole
        return tuple(torch.arange(x.shape[ax]) if k is None else index[k] for ax, k in enumerate(kinds))

    scales = {"weight": None, "exp_avg": None, "exp_avg_sq": None}
    if "qkv" in kinds and c != 1.0:
        scales = {"weight": q_scale, "exp_avg": 1 / q_scale, "exp_avg_sq": 1 / q_scale**2}

    def embed(kind: str, base: Map) -> Map:
        def g(x: Tensor) -> Tensor:
            return _embed(full_index(x), scales[kind], base)(x)

        return g

    def placed(x: Tensor) -> Tensor:
        return _embed(full_index(x), None, zero_fill)(x)

    if is_new_block and new_layers == "fresh":
        return Rule(weight=fill, exp_avg=zero_fill, exp_avg_sq=zero_fill, source=old_name, place=zero_fill)
    if is_new_block:  # a gated copy: weights copied (+ new entries), Adam state zero (its gradient is 0 at g=0)
        return Rule(
            weight=embed("weight", fill), exp_avg=zero_fill, exp_avg_sq=zero_fill, source=old_name, place=zero_fill
        )
    return Rule(
        weight=embed("weight", fill),
        exp_avg=embed("exp_avg", zero_fill),
        exp_avg_sq=embed("exp_avg_sq", zero_fill),
        source=None if old_name == new_name else old_name,
        place=placed,
    )


def masked_growth(
    old: GPTConfig,
    new: GPTConfig,
    *,
    layer_order: str = "stack",
    new_layers: str = "copy",
    init_std: float = 0.02,
    bias_std: float = 0.0,
    seed: int = 0,
    ramp_steps: int | None = None,
    ramp_frac: float | None = None,
    start_step: int = 0,
) -> RuleSet:
    """MSG operator from ``old`` to ``new`` (any of n_layer, n_embd, n_head, n_inner larger or equal).

    Shapes (HF (in, out)): wte (V, d) -> (V, d'), c_attn.weight (d, 3HQ) -> (d', 3H'Q'), attn c_proj (HQ, d) ->
    (H'Q', d'), c_fc (d, F) -> (d', F'), mlp c_proj (F, d) -> (F', d'). New entries: N(0, init_std) for matrices
    and embeddings, N(0, bias_std) for biases, 1 + N(0, bias_std) for LayerNorm gains (seeded by parameter name and
    ``seed``; preservation does not depend on them). New blocks: copies of old ones (``new_layers='copy'``, placed by
    ``layer_order``, see ops.common.layer_map) or fresh random blocks; either way gated to 0.

    When the head dim grows (Q' > Q, e.g. n_embd grows with n_head fixed), the old q columns are scaled by
    sqrt(Q'/Q), which keeps q.k / sqrt(Q') equal to the old q.k / sqrt(Q); their moments are scaled by the gradient
    rule (exp_avg / c, exp_avg_sq / c^2). Adam state: old entries carried, new entries (and new blocks) zero
    (DESIGN.md, "Growth operators: Masked family"). The returned plan's ``masks`` (ramp from ``start_step``) must be
    added to the grown model.

    Ramp length: ``ramp_steps`` optimizer steps, or ``ramp_frac`` of the run left at growth
    (growth.ops.rules.ramp_length,
    resolved when the growth happens; DESIGN.md, "Growth dynamics"). Neither given: ramp_frac = DEFAULT_RAMP_FRAC
    (0.25), with DEFAULT_RAMP_STEPS (5000, MSG's code default ``grow_time``) where the run's length is unknown.
    Ramping the masks from 0 to 1 without training raises the loss (the new units' random weights enter): a longer
    ramp spreads that over more training steps, which absorb it.

    Raises:
        GrowthError: a dimension shrinks, the head dim would shrink (n_head grows faster than n_embd), vocab or
            positions change, an unknown layer order or new-layer init, nothing grows, both ramp_steps and ramp_frac
            given, ramp_steps < 1 or ramp_frac outside (0, 1].
    """
    _check_masked(old, new, new_layers)
    ramp_steps, ramp_frac = _ramp(ramp_steps, ramp_frac)
    lmap = layer_map(old.n_layer, new.n_layer, layer_order)
    ctx = _ctx(old, new, init_std=init_std, bias_std=bias_std, seed=seed, new_layers=new_layers)

    def rule(new_name: str, old_name: str, suffix: str, is_new_block: bool) -> Rule:
        return _rule(ctx, new_name, old_name, suffix, is_new_block)

    rules: dict[str, Rule] = {}
    for name in ("transformer.wte.weight", "transformer.wpe.weight"):
        rules[name] = rule(name, name, name, False)
    for i, (src, is_copy) in enumerate(lmap):
        for suffix in BLOCK_PARAMS:
            rules[f"transformer.h.{i}.{suffix}"] = rule(
                f"transformer.h.{i}.{suffix}", f"transformer.h.{src}.{suffix}", suffix, is_copy
            )
    for name in ("transformer.ln_f.weight", "transformer.ln_f.bias"):
        rules[name] = rule(name, name, name, False)

    spec = MaskSpec(
        old_n_embd=old.n_embd,
        old_n_head=old.n_head,
        old_head_dim=old.head_dim,
        old_ffn_dim=old.ffn_dim,
        new_layers=tuple(i for i, (_, is_copy) in enumerate(lmap) if is_copy),
        start_step=start_step,
        ramp_steps=ramp_steps,
    )
    return RuleSet(old=old, new=new, rules=rules, family="masked", exact=True, masks=spec, ramp_frac=ramp_frac)


def _ramp(ramp_steps: int | None, ramp_frac: float | None) -> tuple[int, float | None]:
    """(fixed ramp steps, ramp fraction or None) from the options of ``masked_growth`` (see its Raises)."""
    if ramp_steps is not None and ramp_frac is not None:
        raise GrowthError(f"give ramp_steps ({ramp_steps}) or ramp_frac ({ramp_frac}), not both")
    if ramp_steps is not None:
        if not isinstance(ramp_steps, int) or ramp_steps < 1:
            raise GrowthError(f"ramp_steps={ramp_steps!r} must be an integer >= 1 (optimizer steps)")
        return ramp_steps, None
    frac = DEFAULT_RAMP_FRAC if ramp_frac is None else ramp_frac
    if not 0.0 < frac <= 1.0:
        raise GrowthError(f"ramp_frac={frac!r} must be in (0, 1]: the fraction of the remaining run the ramp lasts")
    return DEFAULT_RAMP_STEPS, float(frac)
