"""Duplication-family width operators: width x k (staged training, Shen et al. 2022, arXiv 2203.06211, section 3.2
"width operator"; k > 2 and the split patterns follow Net2Net, Chen et al. 2016, arXiv 1511.05641, and LEMON,
Wang et al. 2023, arXiv 2310.07999, section 4) and FFN-only growth to any width (Net2Net's WiderNet, eq. 2).
Torch only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from growlm.growth.errors import GrowthError
from growlm.growth.ops.common import check_no_shrink
from growlm.growth.ops.rules import (
    Map,
    Rule,
    RuleSet,
    kron_map,
    leading_block,
    param_shapes,
    per_qkv,
    repeat_last,
    seeded_normal,
)
from growlm.model.config import GPTConfig

PATTERNS = ("block", "split")
SYMMETRIES = ("none", "noise")
# first-update scale of entries that are 0 at growth and must move without shocking the function (block pattern's
# off-diagonal blocks, depth copies' zeroed projections): exp_avg 0, exp_avg_sq / ZERO_ENTRY_UPDATE^2 (DESIGN.md,
# "Growth dynamics"; one-step logit ratio of block width after 200 steps: 1.20 at 0.5, 1.10 at 0.25, 1.04 at 0.1)
ZERO_ENTRY_UPDATE = 0.25


def width_pattern(k: int, pattern: str = "block", alpha: float = 0.75) -> Tensor:
    """The (k, k) mixing pattern P of a grown matrix kron(P, W) (row block = input copy, column block = output copy).

    'block': P = I (staged training's block diagonal [[W, 0], [0, W]]); the k copies never interact, and without
    dropout or noise they stay identical forever. 'split' (LEMON's unequal split): P[i, j] = a_i with
    a = (alpha, (1 - alpha) / (k - 1), ...): every output copy reads alpha of input copy 0 and the rest of the others.
    Each column sums to 1, so the function is exact, while the inputs copies now see different gradients (alpha vs
    1 - alpha) and the copies diverge. alpha = 1 / k would be Net2Net's equal split, which keeps the symmetry.

    Raises:
        GrowthError: unknown pattern, or alpha not in (0, 1), or alpha = 1/k with 'split'.
    """
    if pattern == "block":
        return torch.eye(k, dtype=torch.float64)
    if pattern != "split":
        raise GrowthError(f"unknown width pattern {pattern!r}; use one of {PATTERNS}")
    if not 0.0 < alpha < 1.0 or abs(alpha - 1.0 / k) < 1e-9:
        raise GrowthError(f"split alpha={alpha} must be in (0, 1) and differ from 1/k={1 / k} (which keeps symmetry)")
    a = torch.full((k,), (1.0 - alpha) / (k - 1), dtype=torch.float64)
    a[0] = alpha
    return a[:, None].expand(k, k).clone()


def _copies(grow: Map, grow_m: Map, grow_v: Map, place: Map) -> Rule:
    return Rule(weight=grow, exp_avg=grow_m, exp_avg_sq=grow_v, place=place)


def moment_patterns(p: Tensor) -> tuple[Tensor, Tensor]:
    """The (k, k) patterns of exp_avg and exp_avg_sq for a matrix grown as kron(P, W) (``width_pattern``).

    Every entry of kron(P, W) gets 1/k of the small model's gradient at growth (exactly for 'block', to first order
    for 'split'), so the gradient rule is exp_avg / k, exp_avg_sq / k^2. Dynamics preservation (DESIGN.md, "Growth
    dynamics") further asks that the first Adam update of an entry holding P_ij W be P_ij times the small model's
    update dW, so that output copy j moves by sum_i P_ij dW = dW: Adam's update is m / sqrt(v), so
    exp_avg_sq is divided by P_ij^2 as well (exact for the first step when the new gradient's share of v is small,
    i.e. 1 - beta2 small; it relaxes to the plain rule over about 1 / (1 - beta2) steps). Entries with P_ij = 0 (the
    off-diagonal blocks of 'block') have the same gradient as their diagonal copies: they get that exp_avg_sq but
    exp_avg 0 and exp_avg_sq / ZERO_ENTRY_UPDATE^2, so their first update is about 0.25 (1 - beta1) g / sqrt(v)
    instead of Adam's (1 - beta1) / sqrt(1 - beta2) lr sign(g) for an empty state (the shock that made one step
    move the logits 1.8-3.3x as much as in the small model).

    Returns:
        (m_pattern, v_pattern), float64 (k, k).
    """
    k = p.shape[0]
    nz = p != 0
    s = torch.where(nz, p, torch.full_like(p, ZERO_ENTRY_UPDATE))
    return nz.to(torch.float64) / k, 1.0 / (k**2 * s**2)


def zero_sum_noise(k: int, std: float, name: str, seed: int) -> Map:
    """Map W (n, m) -> N (k n, k m): blocks N_ij ~ N(0, (std * rms(W))^2), minus their mean over i, so that
    sum_i N_ij = 0 for every output copy j. Added to kron(P, W) it keeps the function exact whenever the k input
    copies are equal (they are at growth: every grown activation is k equal copies), yet row block i differs from
    row block i', so the input copies receive gradients of different *directions* from the first step on (DESIGN.md,
    "Growth dynamics": unequal gradient scales, as in the split, are undone by Adam's normalisation)."""

    def f(w: Tensor) -> Tensor:
        n, m = w.shape
        if w.is_meta:
            return torch.empty(k * n, k * m, dtype=w.dtype, device="meta")
        rms = w.double().square().mean().sqrt().item()
        z = seeded_normal((k, n, k, m), std * rms, name, seed, w.double())
        z = z - z.mean(dim=0, keepdim=True)
        return z.reshape(k * n, k * m).to(w.dtype)

    return f


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


def replica_map(n_old: int, n_new: int) -> tuple[Tensor, Tensor]:
    """Net2Net mapping g (int64, (n_new,)): unit j < n_old is itself, new units copy 0, 1, ... cyclically; and the
    replica count of every old unit (float64, (n_old,))."""
    g = torch.cat([torch.arange(n_old), torch.arange(n_new - n_old) % n_old])
    return g, torch.bincount(g, minlength=n_old).to(torch.float64)


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
