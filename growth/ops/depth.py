"""Duplication-family depth operator: L -> L' blocks by interleaving (staged training, Shen et al. 2022, arXiv
2203.06211, section 3.2 "depth operator") or stacking (progressive stacking; G_stack, Du et al. 2024, arXiv
2405.15319, section 3). Torch only.
"""

from __future__ import annotations

from torch import Tensor

from growlm.growth.errors import GrowthError
from growlm.growth.ops.common import BLOCK_PARAMS, check_no_shrink, layer_map
from growlm.growth.ops.rules import Rule, RuleSet, identity, zeros
from growlm.growth.ops.width import ZERO_ENTRY_UPDATE
from growlm.model.config import GPTConfig


def zero_entry_v(v: Tensor) -> Tensor:
    """exp_avg_sq of a zeroed projection of an exact copy: its source's, / ZERO_ENTRY_UPDATE^2 (see depth_growth)."""
    return v / ZERO_ENTRY_UPDATE**2


zero_entry_v.elementwise = True  # a rank maps its own ZeRO-3 shard (growth.live.transfer.local_maps)

ZEROED_IN_EXACT = ("attn.c_proj.weight", "attn.c_proj.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")


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
