"""Checks and layer orders shared by the operator families. Torch only."""

from __future__ import annotations

from growlm.growth.errors import GrowthError
from growlm.model.config import GPTConfig

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
LAYER_ORDERS = ("stack", "interleave")


def check_no_shrink(old: GPTConfig, new: GPTConfig) -> None:
    """Raises GrowthError if any dimension shrinks or a dimension growth does not support changes."""
    for name, a, b in (
        ("n_layer", old.n_layer, new.n_layer),
        ("n_embd", old.n_embd, new.n_embd),
        ("n_head", old.n_head, new.n_head),
        ("n_inner (FFN width)", old.ffn_dim, new.ffn_dim),
    ):
        if b < a:
            raise GrowthError(f"{name} would shrink from {a} to {b}; growth only grows: set {name} >= {a}")
    for name in ("vocab_size", "n_positions"):
        if getattr(old, name) != getattr(new, name):
            raise GrowthError(
                f"{name} changes from {getattr(old, name)} to {getattr(new, name)}; growth keeps it: "
                f"set {name}={getattr(old, name)} in the target"
            )


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
