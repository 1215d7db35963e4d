"""The growth operators of the GPT-2 family (model/gpt2), as RuleSets over ``GPT2LMHeadModel`` names (Conv1D
weights (in, out)), and ``make_rules``, the family's chain. Torch only.

Duplication family: width x k (staged training, Shen et al. 2022, arXiv 2203.06211, section 3.2 "width operator";
k > 2 and the split patterns follow Net2Net, Chen et al. 2016, arXiv 1511.05641, and LEMON, Wang et al. 2023, arXiv
2310.07999, section 4), FFN-only growth to any width (Net2Net's WiderNet, eq. 2) and depth L -> L' by interleaving
(staged training, section 3.2 "depth operator") or stacking (G_stack, Du et al. 2024, arXiv 2405.15319, section 3).
Masked family: Masked Structural Growth (MSG, Yao et al. 2023, arXiv 2305.02869, sections 3-4) grows n_layer,
n_embd, n_head and n_inner, alone or together, to any larger size, exactly preserving the function whatever the new
weights are: old values sit in the leading positions of each grown axis (attention: head h, dim r -> h * Q' + r),
new units are initialised from a seed and masked (model/masks.py); new blocks are gated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from growlm.growth.errors import GrowthError
from growlm.growth.ops.common import (
    NEW_LAYER_INITS,
    SYMMETRIES,
    block_copy_rule,
    check_no_shrink,
    embed_at,
    layer_map,
    moment_patterns,
    ramp_options,
    replica_map,
    width_pattern,
    zero_sum_noise,
)
from growlm.growth.ops.rules import (
    Map,
    Rule,
    RuleSet,
    chain,
    identity,
    kron_map,
    leading_block,
    param_shapes,
    per_qkv,
    repeat_last,
    seeded_normal,
)
from growlm.model.gpt2.config import GPTConfig, attn_index
from growlm.model.masks import MaskSpec

BLOCK_PARAMS = (
    "ln_1.weight",
    "ln_1.bias",
    "attn.c_attn.weight",
    "attn.c_attn.bias",
    "attn.c_proj.weight",
    "attn.c_proj.bias",
    "ln_2.weight",
    "ln_2.bias",
    "mlp.c_fc.weight",
    "mlp.c_fc.bias",
    "mlp.c_proj.weight",
    "mlp.c_proj.bias",
)
ZEROED_IN_EXACT = ("attn.c_proj.weight", "attn.c_proj.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")


def _copies(grow: Map, grow_m: Map, grow_v: Map, place: Map) -> Rule:
    return Rule(weight=grow, exp_avg=grow_m, exp_avg_sq=grow_v, place=place)


def _per_part(parts: list[Map]) -> Map:
    """Apply parts[i] to the i-th third (q, k, v) of a fused c_attn weight and concatenate the results."""
    return lambda t: torch.cat([f(x) for f, x in zip(parts, t.chunk(3, dim=-1), strict=True)], dim=-1)


def _noisy(grow: Map, noise: Map | None) -> Map:
    return grow if noise is None else (lambda w: grow(w) + noise(w))


def width_growth(
    old: GPTConfig,
    factor: int,
    *,
    pattern: str = "block",
    alpha: float = 0.75,
    symmetry: str = "none",
    noise_std: float = 0.3,
    seed: int = 0,
) -> RuleSet:
    """Width x k: n_embd d -> k d, n_head H -> k H (head dim Q unchanged), n_inner F -> k F. Exact in eval mode.

    Shapes (HF (in, out)): wte (V, d) -> (V, k d) = [E, ..., E]; c_attn.weight (d, 3d) -> (k d, 3 k d) with q, k, v
    grown separately; every matrix W -> kron(P, W) (see ``width_pattern``); biases and LayerNorms repeated k times;
    ln_f gain and bias divided by k, which cancels the k-fold dot product with the tied [E, ..., E].

    Adam (DESIGN.md, "Growth operators: Duplication family" and "Growth dynamics"): matrices by
    ``moment_patterns``; embeddings, biases and block LayerNorms exp_avg / k, exp_avg_sq / k^2 (gradient / k, same
    update, which moves each copy as the small model moves the original). ln_f's gradient is unchanged but each of
    its k copies acts on the logits, so its exp_avg_sq is multiplied by k^2: its first update is 1/k of the small
    model's and the k copies together move the logits as the small model's ln_f does.

    Symmetry breaking: 'block' copies never come apart; 'split' makes the input copies' gradients unequal in scale,
    which Adam's per-entry normalisation mostly undoes (the embedding halves come apart slowly).
    ``symmetry='noise'`` adds ``zero_sum_noise`` (relative std ``noise_std``, seeded by parameter name and ``seed``)
    to every block matrix: still exact (to rounding) at any noise_std, and every copy of the residual stream and
    embedding gets its own gradient direction from the first step on. The trade-off (DESIGN.md, "Growth dynamics"):
    the one-step logit ratio after 200 steps is 1.11 at noise_std 0.3 (the default) and 1.26 at 1.0 (1.10 without
    noise); the copies part sooner than with the split alone, not further.

    Raises:
        GrowthError: factor < 2, a bad pattern or symmetry, or noise_std < 0.
    """
    if not isinstance(factor, int) or factor < 2:
        raise GrowthError(f"width factor={factor!r} must be an integer >= 2 (use ffn_growth for the FFN alone)")
    if symmetry not in SYMMETRIES or noise_std < 0:
        raise GrowthError(f"symmetry={symmetry!r} must be one of {SYMMETRIES} and noise_std={noise_std} >= 0")
    k = factor
    p = width_pattern(k, pattern, alpha)
    m_pat, v_pat = moment_patterns(p)
    new = GPTConfig(
        **{
            **old.to_dict(),
            "n_embd": k * old.n_embd,
            "n_head": k * old.n_head,
            "n_inner": None if old.n_inner is None else k * old.n_inner,
        }
    )
    e11 = torch.zeros(k, k, dtype=torch.float64)
    e11[0, 0] = 1.0

    def matrix(qkv: bool, name: str) -> Rule:
        noise = None
        if symmetry == "noise" and noise_std > 0:
            parts = [zero_sum_noise(k, noise_std, f"{name}#{i}", seed) for i in range(3 if qkv else 1)]
            noise = _per_part(parts) if qkv else parts[0]
        w = [kron_map(p), kron_map(m_pat), kron_map(v_pat), kron_map(e11)]
        w = [per_qkv(f) if qkv else f for f in w]
        return _copies(_noisy(w[0], noise), *w[1:])

    def vector(qkv: bool, scale: float = 1.0, moment_scale: tuple[float, float] = (1.0 / k, 1.0 / k**2)) -> Rule:
        w = [repeat_last(k, scale), repeat_last(k, moment_scale[0]), repeat_last(k, moment_scale[1])]
        place = leading_block((k,))
        return _copies(*(per_qkv(f) if qkv else f for f in (*w, place)))

    def embedding() -> Rule:
        return _copies(repeat_last(k), repeat_last(k, 1.0 / k), repeat_last(k, 1.0 / k**2), leading_block((1, k)))

    matrices = {"attn.c_attn.weight": True, "attn.c_proj.weight": False, "mlp.c_fc.weight": False,
                "mlp.c_proj.weight": False}  # fmt: skip
    vectors = {"ln_1.weight": False, "ln_1.bias": False, "attn.c_attn.bias": True, "attn.c_proj.bias": False,
               "ln_2.weight": False, "ln_2.bias": False, "mlp.c_fc.bias": False, "mlp.c_proj.bias": False}  # fmt: skip
    rules: dict[str, Rule] = {}
    for i in range(old.n_layer):
        for s, qkv in matrices.items():
            rules[f"transformer.h.{i}.{s}"] = matrix(qkv, f"transformer.h.{i}.{s}")
        for s, qkv in vectors.items():
            rules[f"transformer.h.{i}.{s}"] = vector(qkv)
    rules["transformer.wte.weight"] = embedding()
    rules["transformer.wpe.weight"] = embedding()
    for s in ("weight", "bias"):
        rules[f"transformer.ln_f.{s}"] = vector(False, scale=1.0 / k, moment_scale=(1.0, float(k**2)))
    notes = ()
    if symmetry == "none":
        notes = (f"width x{k} with pattern {pattern!r}: copies stay (nearly) identical; symmetry 'noise' breaks that",)
    return RuleSet(old=old, new=new, rules=rules, family="duplicate", exact=True, notes=notes)


def ffn_growth(old: GPTConfig, n_inner: int) -> RuleSet:
    """FFN width F -> F' (any F' > F; d, H unchanged) by Net2Net replication (Chen et al. 2016, section 3.1, eq. 2).

    c_fc (d, F) -> (d, F'): column j copies column g(j) (bias too). mlp c_proj (F, d) -> (F', d): row j is row g(j)
    divided by the replica count n(g(j)), so the FFN output is unchanged (exact). Adam: a replica's pre-activation
    gradient is 1/n of the old unit's, so c_fc state gets exp_avg / n and exp_avg_sq / n^2 per column; c_proj rows see
    the old gradient unchanged (exp_avg copied) but hold 1/n of the weight, so exp_avg_sq * n^2 (first update 1/n).

    Raises:
        GrowthError: n_inner <= F.
    """
    f_old = old.ffn_dim
    if n_inner <= f_old:
        raise GrowthError(f"n_inner={n_inner} must exceed the current FFN width {f_old} (use a larger n_inner)")
    new = GPTConfig(**{**old.to_dict(), "n_inner": n_inner})
    g, n = replica_map(f_old, n_inner)
    inv = 1.0 / n[g]  # (F',)

    def cols(scale: Tensor | None) -> Map:
        def f(x: Tensor) -> Tensor:
            y = x[..., g.to(x.device)]
            return y if scale is None else y * scale.to(dtype=x.dtype, device=x.device)

        return f

    def rows(scale: Tensor | None) -> Map:
        def f(x: Tensor) -> Tensor:
            y = x[g.to(x.device)]
            return y if scale is None else y * scale.to(dtype=x.dtype, device=x.device)[:, None]

        return f

    def pad_cols(x: Tensor) -> Tensor:
        return torch.cat([x, x.new_zeros(*x.shape[:-1], n_inner - f_old)], dim=-1)

    def pad_rows(x: Tensor) -> Tensor:
        return torch.cat([x, x.new_zeros(n_inner - f_old, *x.shape[1:])], dim=0)

    def same(x: Tensor) -> Tensor:
        return x

    rules: dict[str, Rule] = {}
    for i in range(old.n_layer):
        pre = f"transformer.h.{i}.mlp."
        for s in ("c_fc.weight", "c_fc.bias"):
            rules[pre + s] = Rule(weight=cols(None), exp_avg=cols(inv), exp_avg_sq=cols(inv**2), place=pad_cols)
        # weight / n, gradient unchanged: exp_avg_sq * n^2 makes each replica's first update 1/n of the old one, so
        # the n replicas together move the output as the old row did ("Growth dynamics", DESIGN.md)
        rules[pre + "c_proj.weight"] = Rule(
            weight=rows(inv), exp_avg=rows(None), exp_avg_sq=rows(inv**-2), place=pad_rows
        )
    for name in _names_except(old, rules):
        rules[name] = Rule(weight=same, exp_avg=same, exp_avg_sq=same)
    return RuleSet(old=old, new=new, rules=rules, family="duplicate", exact=True)


def _names_except(cfg: GPTConfig, taken: dict[str, Rule]) -> list[str]:

    return [n for n in param_shapes(cfg) if n not in taken]


def check_width_target(old: GPTConfig, new: GPTConfig) -> int:
    """The width factor k = new.n_embd / old.n_embd (1 if unchanged) for the duplication family.

    Raises:
        GrowthError: shrinking, a non-integer factor, or a head dim change (n_head must grow by the same factor).
    """
    check_no_shrink(old, new)
    if new.n_embd % old.n_embd:
        raise GrowthError(
            f"duplication grows n_embd by an integer factor; {old.n_embd} -> {new.n_embd} is not one: "
            f"set n_embd to a multiple of {old.n_embd}, or use the masked family for any size"
        )
    k = new.n_embd // old.n_embd
    if new.head_dim != old.head_dim:
        raise GrowthError(
            f"head dim changes from {old.head_dim} to {new.head_dim}; duplication copies whole heads: "
            f"set n_head={k * old.n_head} (or use the masked family)"
        )
    return k


def depth_growth(old: GPTConfig, n_layer: int, *, order: str = "interleave", exact: bool = True) -> RuleSet:
    """n_layer L -> L' (any L' > L): each new block is a copy of an old block (``Rule.source``), placed by ``order``
    (see ops.common.layer_map: 'interleave' L0 L0' L1 L1' ..., 'stack' L0..L(n-1) L0 L1 ...).

    exact=True zeroes the copies' output projections (attn c_proj and mlp c_proj, weights and biases), so every new
    block is the identity x + 0 + 0 and the function is unchanged (eval mode). Their exp_avg starts at zero and their
    exp_avg_sq at the source block's (DESIGN.md, "Growth dynamics"): with an empty state Adam's first update of every
    such entry is about (1 - beta1) / sqrt(1 - beta2) lr sign(g) (0.45 lr at beta2 0.95, 3.2 lr at 0.999), which moved
    the logits 1.4-2.1x as much as the small model's step; with the source's second moment / ZERO_ENTRY_UPDATE^2 it
    is about ZERO_ENTRY_UPDATE (1 - beta1) g / sqrt(v).
    exact=False is the plain copy (G_stack-style): **not** function-preserving (logits move by O(1)), kept because
    G_stack reports it trains well. Adam state of copied tensors: copied (DESIGN.md, "Growth operators: Duplication
    family"); Adam step carried.

    Raises:
        GrowthError: n_layer <= L, or an unknown order.
    """
    if n_layer <= old.n_layer:
        raise GrowthError(f"n_layer={n_layer} must exceed the current {old.n_layer} (depth growth only grows)")
    new = GPTConfig(**{**old.to_dict(), "n_layer": n_layer})
    check_no_shrink(old, new)
    rules: dict[str, Rule] = {}
    for i, (src, is_copy) in enumerate(layer_map(old.n_layer, n_layer, order)):
        for s in BLOCK_PARAMS:
            name, source = f"transformer.h.{i}.{s}", f"transformer.h.{src}.{s}"
            rules[name] = block_copy_rule(name, source, is_copy, zeroed=is_copy and exact and s in ZEROED_IN_EXACT)
    for name in (
        "transformer.wte.weight",
        "transformer.wpe.weight",
        "transformer.ln_f.weight",
        "transformer.ln_f.bias",
    ):
        rules[name] = Rule(weight=identity, exp_avg=identity, exp_avg_sq=identity)
    notes = () if exact else ("depth plain copy (G_stack-style): not function-preserving",)
    return RuleSet(old=old, new=new, rules=rules, family="duplicate", exact=exact, notes=notes)


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
            return embed_at(full_index(x), scales[kind], base)(x)

        return g

    def placed(x: Tensor) -> Tensor:
        return embed_at(full_index(x), None, zero_fill)(x)

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
    ramp_steps, ramp_frac = ramp_options(ramp_steps, ramp_frac)
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


def make_rules(old: GPTConfig, new: GPTConfig, family: str, **options: Any) -> RuleSet:
    """The GPT-2 growth plan from ``old`` to ``new`` (``growth.ops.make_rules`` checked the family and options):
    'masked' is ``masked_growth`` (every dimension at once, any size, exact); 'duplicate' chains ``width_growth``
    (n_embd x k, heads x k), ``ffn_growth`` (n_inner beyond k F) and ``depth_growth`` (n_layer), composed per
    parameter.

    Raises:
        GrowthError: a target the family cannot reach (see each operator).
    """
    if family == "masked":
        return masked_growth(old, new, **options)
    k = check_width_target(old, new)
    plans: list[RuleSet] = []
    cfg = old
    if k > 1:
        width_opts = {o: options[o] for o in ("pattern", "alpha", "symmetry", "noise_std", "seed") if o in options}
        plans.append(width_growth(cfg, k, **width_opts))
        cfg = plans[-1].new
    if new.ffn_dim > cfg.ffn_dim:
        plans.append(ffn_growth(cfg, new.ffn_dim))
        cfg = plans[-1].new
    elif new.ffn_dim < cfg.ffn_dim:
        raise GrowthError(
            f"width x{k} makes the FFN {cfg.ffn_dim} wide, more than the target's {new.ffn_dim}; "
            f"set n_inner >= {cfg.ffn_dim} (or None)"
        )
    if new.n_layer > cfg.n_layer:
        plans.append(
            depth_growth(
                cfg, new.n_layer, order=options.get("layer_order", "interleave"), exact=options.get("exact", True)
            )
        )
    return chain(plans, new)
