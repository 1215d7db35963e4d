"""What the operators of every model family share (growth/ops/<family>.py): the checks of a target, the layer
orders of depth growth, the duplication patterns and their Adam rules, Net2Net's replica map, the rule of a copied or
zeroed block parameter, and the masked family's placement and ramp options. Torch only.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from growlm.growth.errors import GrowthError
from growlm.growth.ops.rules import Map, Rule, identity, noise_dtype, rms, seeded_normal, zeros

LAYER_ORDERS = ("stack", "interleave")
PATTERNS = ("block", "split")
SYMMETRIES = ("none", "noise")
# first-update scale of entries that are 0 at growth and must move without shocking the function (block pattern's
# off-diagonal blocks, depth copies' zeroed projections): exp_avg 0, exp_avg_sq / ZERO_ENTRY_UPDATE^2 (DESIGN.md,
# "Growth dynamics"; one-step logit ratio of block width after 200 steps: 1.20 at 0.5, 1.10 at 0.25, 1.04 at 0.1)
ZERO_ENTRY_UPDATE = 0.25
NEW_LAYER_INITS = ("copy", "fresh")
# mask ramp defaults (masked family): a fraction of the run left at growth; MSG's code default (cofe-ai/MSG,
# run_grow_bert.py, --grow_time) of 5000 steps where the run's length is unknown
DEFAULT_RAMP_FRAC = 0.25
DEFAULT_RAMP_STEPS = 5000


def check_same_arch(old: Any, new: Any) -> None:
    """Raises GrowthError if ``old`` and ``new`` belong to different model families (``arch``): no operator turns a
    GPT-2 into a Llama or back."""
    if old.arch != new.arch:
        raise GrowthError(
            f"the target is a {new.arch!r} model but the model grown is {old.arch!r}; growth keeps the model family: "
            f"give a {old.arch!r} target (e.g. a {old.arch!r} preset with larger sizes)"
        )


def check_no_shrink(old: Any, new: Any) -> None:
    """Raises GrowthError if the families differ, any dimension the family grows shrinks (its config's
    ``grown_dims``: n_layer, n_embd, n_head, n_inner, and n_kv_head where there are key/value heads), or a field
    growth keeps changes (``kept_fields``: vocab_size, n_positions; Llama-shaped also head_dim, the rotary and norm
    constants and the tie). A head_dim change of a Llama-shaped model is refused with its reason: it changes the
    rotary frequencies, so no old head would compute what it did."""
    check_same_arch(old, new)
    for attr, name in old.grown_dims:
        a, b = getattr(old, attr), getattr(new, attr)
        if b < a:
            raise GrowthError(f"{name} would shrink from {a} to {b}; growth only grows: set {name} >= {a}")
    for name in old.kept_fields:
        a, b = getattr(old, name), getattr(new, name)
        if a == b:
            continue
        if name == "head_dim":
            raise GrowthError(
                f"head_dim changes from {a} to {b}; a {old.arch} growth keeps head_dim, because it sets the rotary "
                f"frequencies rope_theta^(-2i/head_dim) of every head: set head_dim={a} in the target (and grow "
                "n_head / n_kv_head instead)"
            )
        raise GrowthError(f"{name} changes from {a} to {b}; growth keeps it: set {name}={a} in the target")


def layer_map(n_old: int, n_new: int, order: str) -> list[tuple[int, bool]]:
    """For each block of the grown model: (old block it comes from, whether it is a new copy).

    'stack' (progressive stacking / G_stack, Du et al. 2024 arXiv 2405.15319): old blocks keep positions 0..L-1 and
    copies of blocks 0, 1, ... (cyclically) follow. 'interleave' (staged training): each copy sits right after its
    original, spread evenly over the old blocks (L' = 2L gives L0 L0' L1 L1' ...).

    Raises:
        GrowthError: unknown order or n_new < n_old.
    """
    if order not in LAYER_ORDERS:
        raise GrowthError(f"unknown layer order {order!r}; use one of {LAYER_ORDERS}")
    if n_new < n_old:
        raise GrowthError(f"n_layer would shrink from {n_old} to {n_new}; set n_layer >= {n_old}")
    k = n_new - n_old
    if order == "stack":
        return [(i, False) for i in range(n_old)] + [(i % n_old, True) for i in range(k)]
    out = []
    for j in range(n_old):
        out.append((j, False))
        out += [(j, True)] * ((j + 1) * k // n_old - j * k // n_old)
    return out


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
        z = seeded_normal((k, n, k, m), std * rms(w), name, seed, w, noise_dtype(w))
        z.sub_(z.mean(dim=0, keepdim=True))
        return z.reshape(k * n, k * m).to(w.dtype)

    return f


def replica_map(n_old: int, n_new: int) -> tuple[Tensor, Tensor]:
    """Net2Net mapping g (int64, (n_new,)): unit j < n_old is itself, new units copy 0, 1, ... cyclically; and the
    replica count of every old unit (float64, (n_old,))."""
    g = torch.cat([torch.arange(n_old), torch.arange(n_new - n_old) % n_old])
    return g, torch.bincount(g, minlength=n_old).to(torch.float64)


def zero_entry_v(v: Tensor) -> Tensor:
    """exp_avg_sq of a zeroed projection of an exact copy: its source's, / ZERO_ENTRY_UPDATE^2 (see depth_growth)."""
    return v / ZERO_ENTRY_UPDATE**2


zero_entry_v.elementwise = True  # a rank maps its own ZeRO-3 shard (growth.live.transfer.local_maps)


def block_copy_rule(name: str, source: str, is_copy: bool, *, zeroed: bool) -> Rule:
    """The Rule of block parameter ``name`` of a depth growth, read from ``source`` (the old block's parameter):
    an old block's parameter stays as it is; a new block's copies its source, or, ``zeroed`` (an exact copy's output
    projection), is zero with exp_avg 0 and the source's exp_avg_sq / ZERO_ENTRY_UPDATE^2 (``zero_entry_v``). A new
    block's "carry old" placement is zeros. Shared by both families' depth operators."""
    return Rule(
        weight=zeros if zeroed else identity,
        exp_avg=zeros if zeroed else identity,
        exp_avg_sq=zero_entry_v if zeroed else identity,
        source=source if source != name else None,
        place=zeros if is_copy else identity,
    )


def embed_at(index: tuple[Tensor, ...], scale: Tensor | None, fill: Map) -> Map:
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


def ramp_options(ramp_steps: int | None, ramp_frac: float | None) -> tuple[int, float | None]:
    """(fixed ramp steps, ramp fraction or None) from the masked family's ramp options.

    Raises:
        GrowthError: both given, ramp_steps < 1 or ramp_frac outside (0, 1].
    """
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
