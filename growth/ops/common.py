"""Checks and layer orders shared by the operator families of both model families (GPT-2 and Llama). Torch only."""

from __future__ import annotations

from growlm.growth.errors import GrowthError
from growlm.model.config import ModelConfig

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
# a Llama block's parameters (model.layers.{i}.<suffix>), in named_parameters order
LLAMA_BLOCK_PARAMS = (
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)
LAYER_ORDERS = ("stack", "interleave")
# Llama fields a growth keeps as they are (head_dim: RoPE's frequencies theta_i = rope_theta^(-2i/Q) depend on it)
LLAMA_KEPT = ("head_dim", "rope_theta", "rms_norm_eps", "tie_word_embeddings")


def check_same_arch(old: ModelConfig, new: ModelConfig) -> None:
    """Raises GrowthError if ``old`` and ``new`` belong to different model families (``arch``): no operator turns a
    GPT-2 into a Llama or back."""
    if old.arch != new.arch:
        raise GrowthError(
            f"the target is a {new.arch!r} model but the model grown is {old.arch!r}; growth keeps the model family: "
            f"give a {old.arch!r} target (e.g. a {old.arch!r} preset with larger sizes)"
        )


def check_no_shrink(old: ModelConfig, new: ModelConfig) -> None:
    """Raises GrowthError if the families differ, any dimension shrinks (n_layer, n_embd, n_head, n_inner; Llama
    also n_kv_head), or a field growth keeps changes (vocab_size, n_positions; Llama also head_dim, rope_theta,
    rms_norm_eps, tie_word_embeddings). A Llama head_dim change is refused with its reason: it changes the rotary
    frequencies, so no old head would compute what it did."""
    check_same_arch(old, new)
    dims = [
        ("n_layer", old.n_layer, new.n_layer),
        ("n_embd", old.n_embd, new.n_embd),
        ("n_head", old.n_head, new.n_head),
        ("n_inner (FFN width)", old.ffn_dim, new.ffn_dim),
    ]
    if old.arch == "llama":
        dims.append(("n_kv_head", old.n_kv_head, new.n_kv_head))
    for name, a, b in dims:
        if b < a:
            raise GrowthError(f"{name} would shrink from {a} to {b}; growth only grows: set {name} >= {a}")
    kept = ["vocab_size", "n_positions"]
    if old.arch == "llama":
        if old.head_dim != new.head_dim:
            raise GrowthError(
                f"head_dim changes from {old.head_dim} to {new.head_dim}; a Llama growth keeps head_dim, because it "
                f"sets the rotary frequencies rope_theta^(-2i/head_dim) of every head: set head_dim={old.head_dim} "
                f"in the target (and grow n_head / n_kv_head instead)"
            )
        kept += list(LLAMA_KEPT[1:])
    for name in kept:
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
