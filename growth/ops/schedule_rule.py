"""Where the LR schedule continues after a growth: ``ScheduleRule`` (a stage's ``schedule:``) and ``place_schedule``.
Pure arithmetic on runtime.schedule.ScheduleState (DESIGN.md, "What growth carries").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from growlm.growth.errors import GrowthError
from growlm.runtime.schedule import FIRST_ITERATION, ScheduleState

SCHEDULE_RULES = ("target", "continue", "rewind")
REWARM_FROM = ("zero", "current")
# S' = S_small / constant_op (Shen et al. 2022's measured constants; DESIGN.md, "What growth carries")
CONSTANT_OP = {"depth": 1.4, "width": 1.8, "both": 2.5}


@dataclass(frozen=True)
class ScheduleRule:
    """How the LR schedule continues after a growth (DESIGN.md, "What growth carries").

    'target' (staged training, Shen et al. 2022 section 3.3): the grown model joins the *target* model's schedule
    (``total_num_steps`` / ``warmup_num_steps`` when given, else the current ones) at lbi' = round(lbi /
    constant_op), and re-warms linearly over ``rewarm_steps``. 'continue' (MSG): same schedule, same position.
    'rewind': back to the peak (lbi' = warmup_num_steps). Any rule may re-warm: ``rewarm_from`` 'zero' ramps the
    LR linearly from 1/R of the placed schedule's LR ((j+1)/R); 'current' from the LR the run had before the growth
    (never above the placed LR), so the first post-growth step trains at the LR the old schedule gave instead of
    collapsing to 1/R of it (DESIGN.md, "Growth dynamics": the duplication operators preserve the training dynamics,
    a ratio of 1.0-1.1, so they need no re-warm from zero).
    """

    kind: str = "continue"
    constant_op: float = 1.0
    rewarm_steps: int = 0
    total_num_steps: int | None = None
    warmup_num_steps: int | None = None
    rewarm_from: str = "zero"

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULE_RULES:
            raise GrowthError(f"unknown schedule rule {self.kind!r}; use one of {SCHEDULE_RULES}")
        if self.constant_op <= 0:
            raise GrowthError(f"constant_op={self.constant_op} must be > 0 (e.g. 1.4 depth, 1.8 width, 2.5 both)")
        if self.rewarm_steps < 0:
            raise GrowthError(f"rewarm_steps={self.rewarm_steps} must be >= 0")
        if self.rewarm_from not in REWARM_FROM:
            raise GrowthError(f"unknown rewarm_from {self.rewarm_from!r}; use one of {REWARM_FROM}")


def place_schedule(sched: ScheduleState, adam_step: int, rule: ScheduleRule) -> ScheduleState:
    """The schedule of the grown model, growth happening after ``adam_step`` optimizer steps. The returned state's
    ``ratio(adam_step)`` is the LR ratio of the first post-growth step; its position is at least FIRST_ITERATION
    (a 'target' placement of an early growth, round(lbi / constant_op), may otherwise land on the zero-LR lbi 0).

    Raises:
        GrowthError: the target schedule is shorter than its warmup.
    """
    total = rule.total_num_steps or sched.total_num_steps
    warmup = rule.warmup_num_steps or sched.warmup_num_steps
    if total < warmup:
        raise GrowthError(f"target total_num_steps={total} < warmup_num_steps={warmup}; lengthen the schedule")
    lbi = sched.last_batch_iteration
    if rule.kind == "target":
        lbi = round(lbi / rule.constant_op) if lbi >= 0 else lbi
    elif rule.kind == "rewind":
        lbi = warmup
    lbi = max(lbi, FIRST_ITERATION)  # never back to a position of LR 0 (lbi -1, or 0 with warmup_min_ratio 0)
    placed = replace(
        sched,
        total_num_steps=total,
        warmup_num_steps=warmup,
        last_batch_iteration=lbi,
        rewarm_start=adam_step if rule.rewarm_steps > 0 else -1,
        rewarm_steps=rule.rewarm_steps,
        rewarm_floor=0.0,
    )
    if rule.rewarm_steps > 0 and rule.rewarm_from == "current":
        new_base = replace(placed, rewarm_start=-1).ratio(adam_step)
        floor = 1.0 if new_base <= 0 else min(1.0, sched.ratio(adam_step) / new_base)
        placed = replace(placed, rewarm_floor=floor)
    return placed
