"""Apply a RuleSet between two parameter stores, one parameter at a time, with an optimizer-state policy.

At any moment only one old parameter's and one new parameter's tensors (weight and moments) are held, so the same
loop serves an in-memory state, a live sharded engine and a checkpoint on disk. Torch only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from growlm.growth.errors import GrowthError
from growlm.growth.ops.rules import Rule, RuleSet
from growlm.growth.ops.stores import ParamState, ParamStore

MOMENT_POLICIES = ("carry", "carry_old", "reset")
FRESH_POLICIES = ("zero", "mean")


@dataclass(frozen=True)
class OptimizerPolicy:
    """What becomes of Adam's state in a growth (DESIGN.md, "Growth operators"). The Adam step is always carried.

    moments: 'carry' transforms exp_avg / exp_avg_sq by the operator's gradient rule (e.g. duplication: /k, /k^2);
    'carry_old' keeps old entries unscaled at their own positions and zeroes everything else (copies included);
    'reset' zeroes all state.
    fresh_exp_avg_sq: state of *fresh* entries (no old counterpart). 'zero' is plain Adam; with a carried (large)
    step, bias correction is ~1 and the first update of such an entry is about (1-b1)/sqrt(1-b2) * lr * sign(g)
    = 3.2 lr for b = (0.9, 0.999). 'mean' starts their exp_avg_sq at the mean exp_avg_sq of the tensor's carried
    entries (or of the old tensor when none are carried), which makes their first updates of the tensor's usual
    size. A linear LR re-warm (runtime.schedule) is the other remedy.
    """

    moments: str = "carry"
    fresh_exp_avg_sq: str = "zero"

    def __post_init__(self) -> None:
        if self.moments not in MOMENT_POLICIES:
            raise GrowthError(f"unknown moments policy {self.moments!r}; use one of {MOMENT_POLICIES}")
        if self.fresh_exp_avg_sq not in FRESH_POLICIES:
            raise GrowthError(f"unknown fresh_exp_avg_sq policy {self.fresh_exp_avg_sq!r}; use one of {FRESH_POLICIES}")


def fresh_entries(rule: Rule, old: Tensor) -> Tensor:
    """Bool tensor (new shape): True where the grown parameter has no old counterpart (its moments start empty)."""
    return rule.exp_avg_sq(torch.ones_like(old)) == 0


def grow_param(rule: Rule, old: ParamState, policy: OptimizerPolicy) -> ParamState:
    """One grown parameter (weight, exp_avg, exp_avg_sq) from the old one under ``policy``."""
    w = rule.weight(old.weight)
    if policy.moments == "carry":
        m, v = rule.exp_avg(old.exp_avg), rule.exp_avg_sq(old.exp_avg_sq)
    elif policy.moments == "carry_old":
        place = rule.place or rule.exp_avg
        m, v = place(old.exp_avg), place(old.exp_avg_sq)
    else:
        m, v = torch.zeros_like(w), torch.zeros_like(w)
    if policy.fresh_exp_avg_sq == "mean":
        fresh = fresh_entries(rule, old.weight) if policy.moments == "carry" else (v == 0)
        if fresh.any():
            carried = v[~fresh]
            fill = carried.mean() if carried.numel() else old.exp_avg_sq.mean()
            v = torch.where(fresh, fill, v)
    # identity maps return the old tensor itself; two grown parameters (depth copies) must not share storage
    ptrs = {t.data_ptr() for t in old}
    w, m, v = (t.clone() if t.data_ptr() in ptrs else t for t in (w, m, v))
    return ParamState(w, m, v)


def check_sources(rules: RuleSet, have: Iterable[str]) -> None:
    """Every parameter a rule of ``rules`` reads is among ``have`` (the old state's parameter names).

    Raises:
        GrowthError: names the missing parameters (the old state is not a ``rules.old`` model).
    """
    missing = sorted({rule.source or name for name, rule in rules.rules.items()} - set(have))
    if missing:
        raise GrowthError(f"the old state lacks {missing[:5]}: it is not a {rules.old.shape_str()} model")


def apply_rules(
    rules: RuleSet,
    old: ParamStore,
    new: ParamStore,
    policy: OptimizerPolicy | None = None,
    *,
    release: bool = False,
) -> None:
    """Write every parameter of ``rules.new`` into ``new`` by its Rule (weight and both Adam moments, with the
    Adam-state ``policy``), reading ``old`` one parameter at a time.

    With ``release`` the old store is told when a parameter has been read for the last time (an in-memory store
    then frees it, so peak memory is about one model plus one parameter, not two models).

    Raises:
        GrowthError: (before anything is written) the old store lacks a parameter that a rule reads.
    """
    policy = policy or OptimizerPolicy()
    check_sources(rules, old.names())
    sources = [rule.source or name for name, rule in rules.rules.items()]
    last_read = {src: i for i, src in enumerate(sources)}
    for i, (name, rule) in enumerate(rules.rules.items()):
        src = sources[i]
        new.write(name, grow_param(rule, old.read(src), policy))
        if release and last_read[src] == i:
            old.release(src)
