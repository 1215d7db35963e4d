"""Growth operators; each returns a growth.ops.rules.RuleSet. Torch only.

``make_rules(old, new, family, **options)`` hands the growth to the operators file of the model's family (named by
model.registry: growth/ops/gpt2.py, growth/ops/llama.py for Llama and Qwen 2), whose ``make_rules`` picks and
chains the operators that take ``old`` to ``new``:
- family 'masked': Masked Structural Growth, every dimension at once, any size, exact;
- family 'duplicate': width x k, heads (Llama-shaped), FFN, depth, composed per parameter.
What every family's operators share is in common.py; the rules as data in rules.py.
"""

from __future__ import annotations

import importlib
from typing import Any

from growlm.growth.errors import GrowthError
from growlm.growth.ops.common import check_same_arch
from growlm.growth.ops.rules import RuleSet
from growlm.model.config import ModelConfig
from growlm.model.registry import family as model_family

FAMILIES = ("masked", "duplicate")
_DUP_OPTIONS = {"layer_order", "exact", "pattern", "alpha", "symmetry", "noise_std", "seed"}
_MASKED_OPTIONS = {
    "layer_order", "new_layers", "init_std", "bias_std", "seed", "ramp_steps", "ramp_frac", "start_step"
}  # fmt: skip


def make_rules(old: ModelConfig, new: ModelConfig, family: str, **options: Any) -> RuleSet:
    """The growth plan from ``old`` to ``new`` with the given operator family, by the operators of ``old``'s model
    family (``model.registry``; both configs must be of the same one).

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
    operators = importlib.import_module(model_family(old).operators)
    return operators.make_rules(old, new, family, **options)
