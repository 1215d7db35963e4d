"""Duplication-family width operators: width x k (staged training, Shen et al. 2022, arXiv 2203.06211, section 3.2
"width operator"; k > 2 and the split patterns follow Net2Net, Chen et al. 2016, arXiv 1511.05641, and LEMON,
Wang et al. 2023, arXiv 2310.07999, section 4) and FFN-only growth to any width (Net2Net's WiderNet, eq. 2).
Torch only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from growth.errors import GrowthError
from growth.ops.common import check_no_shrink
from growth.plan import GrowthPlan, Map, Rule, kron_map, leading_block, per_qkv, repeat_last
from model.config import GPTConfig

PATTERNS = ("block", "split")


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


def width_growth(old: GPTConfig, factor: int, *, pattern: str = "block", alpha: float = 0.75) -> GrowthPlan:
    """Width x k: n_embd d -> k d, n_head H -> k H (head dim Q unchanged), n_inner F -> k F. Exact in eval mode.

    Shapes (HF (in, out)): wte (V, d) -> (V, k d) = [E, ..., E]; c_attn.weight (d, 3d) -> (k d, 3 k d) with q, k, v
    grown separately; every matrix W -> kron(P, W) (see ``width_pattern``); biases and LayerNorms repeated k times;
    ln_f gain and bias divided by k, which cancels the k-fold dot product with the tied [E, ..., E].

    Adam (DESIGN.md, "Growth operators: Duplication family"): the grown model's gradient on a copied entry is 1/k of the
    small model's (exactly, for 'block'), so exp_avg / k and exp_avg_sq / k^2; entries that are 0 in P (off-diagonal
    blocks) start at zero state; ln_f's gradient is unchanged, so its state is repeated unscaled. For 'split' the
    per-copy gradients differ (that is the point), and the same rule is an approximation. Note Adam's update is
    scale-free: ln_f (value 1/k, same update size) moves the function k times faster in the first steps than in the
    small model.

    Raises:
        GrowthError: factor < 2, or a bad pattern.
    """
    if not isinstance(factor, int) or factor < 2:
        raise GrowthError(f"width factor={factor!r} must be an integer >= 2 (use ffn_growth for the FFN alone)")
    k = factor
    p = width_pattern(k, pattern, alpha)
    nz = (p != 0).to(torch.float64)
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

    def matrix(qkv: bool) -> Rule:
        w = [kron_map(p), kron_map(nz / k), kron_map(nz / k**2), kron_map(e11)]
        return _copies(*(per_qkv(f) if qkv else f for f in w))

    def vector(qkv: bool, scale: float = 1.0, moment_scale: tuple[float, float] = (1.0 / k, 1.0 / k**2)) -> Rule:
        w = [repeat_last(k, scale), repeat_last(k, moment_scale[0]), repeat_last(k, moment_scale[1])]
        place = leading_block((k,))
        return _copies(*(per_qkv(f) if qkv else f for f in (*w, place)))

    def embedding() -> Rule:
        return _copies(repeat_last(k), repeat_last(k, 1.0 / k), repeat_last(k, 1.0 / k**2), leading_block((1, k)))

    block = {
        "ln_1.weight": vector(False),
        "ln_1.bias": vector(False),
        "attn.c_attn.weight": matrix(True),
        "attn.c_attn.bias": vector(True),
        "attn.c_proj.weight": matrix(False),
        "attn.c_proj.bias": vector(False),
        "ln_2.weight": vector(False),
        "ln_2.bias": vector(False),
        "mlp.c_fc.weight": matrix(False),
        "mlp.c_fc.bias": vector(False),
        "mlp.c_proj.weight": matrix(False),
        "mlp.c_proj.bias": vector(False),
    }
    rules = {f"transformer.h.{i}.{s}": r for i in range(old.n_layer) for s, r in block.items()}
    rules["transformer.wte.weight"] = embedding()
    rules["transformer.wpe.weight"] = embedding()
    for s in ("weight", "bias"):
        rules[f"transformer.ln_f.{s}"] = vector(False, scale=1.0 / k, moment_scale=(1.0, 1.0))
    notes = () if pattern == "split" else (f"width x{k} with pattern 'block': copies stay identical without noise",)
    return GrowthPlan(old=old, new=new, rules=rules, family="duplicate", exact=True, notes=notes)


def replica_map(n_old: int, n_new: int) -> tuple[Tensor, Tensor]:
    """Net2Net mapping g (int64, (n_new,)): unit j < n_old is itself, new units copy 0, 1, ... cyclically; and the
    replica count of every old unit (float64, (n_old,))."""
    g = torch.cat([torch.arange(n_old), torch.arange(n_new - n_old) % n_old])
    return g, torch.bincount(g, minlength=n_old).to(torch.float64)


def ffn_growth(old: GPTConfig, n_inner: int) -> GrowthPlan:
    """FFN width F -> F' (any F' > F; d, H unchanged) by Net2Net replication (Chen et al. 2016, section 3.1, eq. 2).

    c_fc (d, F) -> (d, F'): column j copies column g(j) (bias too). mlp c_proj (F, d) -> (F', d): row j is row g(j)
    divided by the replica count n(g(j)), so the FFN output is unchanged (exact). Adam: a replica's pre-activation
    gradient is 1/n of the old unit's, so c_fc state gets exp_avg / n and exp_avg_sq / n^2 per column; c_proj rows see
    the old gradient unchanged (state copied unscaled).

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
        rules[pre + "c_proj.weight"] = Rule(weight=rows(inv), exp_avg=rows(None), exp_avg_sq=rows(None), place=pad_rows)
    for name in _names_except(old, rules):
        rules[name] = Rule(weight=same, exp_avg=same, exp_avg_sq=same)
    return GrowthPlan(old=old, new=new, rules=rules, family="duplicate", exact=True)


def _names_except(cfg: GPTConfig, taken: dict[str, Rule]) -> list[str]:
    from growth.plan import param_shapes

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
