"""Growth operator families; each returns a growth.ops.rules.RuleSet. Torch only.

``make_rules(old, new, family, **options)`` picks, by the model family (``old.arch``), and chains the operators that
take ``old`` to ``new``. GPT-2:
- family 'masked': ops.masked.masked_growth (every dimension at once, any size, exact).
- family 'duplicate': ops.width.width_growth (n_embd x k, heads x k), then ops.width.ffn_growth (n_inner beyond
  k F), then ops.depth.depth_growth (n_layer), composed per parameter.
Llama (ops.llama; DESIGN.md, "Llama growth"):
- family 'masked': llama_masked_growth (n_layer, n_embd, n_head, n_kv_head, n_inner, any size; head_dim kept).
- family 'duplicate': llama_width_growth (x k), llama_heads_growth (n_head, n_kv_head at fixed n_embd),
  llama_ffn_growth, llama_depth_growth, composed per parameter (llama_duplicate_growth).
"""

from __future__ import annotations

from typing import Any

from growlm.growth.errors import GrowthError
from growlm.growth.ops.common import check_same_arch
from growlm.growth.ops.depth import depth_growth
from growlm.growth.ops.llama import llama_duplicate_growth, llama_masked_growth
from growlm.growth.ops.masked import masked_growth
from growlm.growth.ops.rules import RuleSet, chain
from growlm.growth.ops.width import check_width_target, ffn_growth, width_growth
from growlm.model.config import ModelConfig

FAMILIES = ("masked", "duplicate")
_DUP_OPTIONS = {"layer_order", "exact", "pattern", "alpha", "symmetry", "noise_std", "seed"}
_MASKED_OPTIONS = {
    "layer_order", "new_layers", "init_std", "bias_std", "seed", "ramp_steps", "ramp_frac", "start_step"
}  # fmt: skip


def make_rules(old: ModelConfig, new: ModelConfig, family: str, **options: Any) -> RuleSet:
    """The growth plan from ``old`` to ``new`` with the given operator family, for either model family (GPT-2 or
    Llama, by ``old.arch``; both configs must be of the same one).

    Options, masked: layer_order ('stack'|'interleave'), new_layers ('copy'|'fresh'), init_std, bias_std, seed,
    ramp_steps or ramp_frac (of the run left at growth; default 0.25), start_step. Duplicate: layer_order (default
    'interleave'), exact (depth copies as identity blocks, default True), pattern ('block'|'split'), alpha (split
    weight), symmetry ('none'|'noise': zero-sum noise that breaks the copies' symmetry exactly), noise_std (its std
    relative to each matrix's RMS), seed (the noise's seed).

    Raises:
        GrowthError: unknown family or option, a target of another model family, or a target the family cannot
            reach (see each operator).
    """
    if family not in FAMILIES:
        raise GrowthError(f"unknown growth family {family!r}; use one of {FAMILIES}")
    allowed = _MASKED_OPTIONS if family == "masked" else _DUP_OPTIONS
    unknown = set(options) - allowed
    if unknown:
        raise GrowthError(f"unknown options {sorted(unknown)} for family {family!r}; allowed: {sorted(allowed)}")
    check_same_arch(old, new)
    if old.arch == "llama":
        if family == "masked":
            return llama_masked_growth(old, new, **options)
        return llama_duplicate_growth(old, new, **options)
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
