"""The LR schedule: DeepSpeed's WarmupCosineLR arithmetic, its start, its re-warm (growth.ops.schedule_rule places it
after a growth).

The schedule is DeepSpeed's ``WarmupCosineLR`` (``deepspeed.runtime.lr_schedules``), whose only state is
``last_batch_iteration`` (lbi): the LR in force for the next optimizer step is peak_lr * ratio(lbi) (peak_lr is the
optimizer's lr), and the engine calls ``scheduler.step()`` (lbi += 1) after every optimizer step that is not
skipped. growlm multiplies that by a re-warm factor for R steps after a growth. A training loop drives it so:

    engine = build_engine(...); start_schedule(engine)     # a fresh run: step 1 trains at ratio(FIRST_ITERATION)
    engine.step()                                          # scheduler.step() inside; adam_step += 1
    apply_rewarm(engine, sched, adam_step)                 # no-op when no re-warm is running

Why ``start_schedule``: DeepSpeed builds the scheduler at lbi = -1, where the LR is 0, so step 1 would train at
LR 0; its ``step()`` then moves to lbi = 0, where the warm-up ratio is warmup_min_ratio + 0 (log: log(0 + 1) = 0,
linear: 0 / W), so with warmup_min_ratio 0 step 2 would train at LR 0 as well, and the weights after two steps
would equal the initial ones. growlm therefore starts every fresh schedule at lbi = FIRST_ITERATION = 1: step k
trains at ratio(k), whose warm-up part is log(k + 1) / log(W) (or k / W), non-zero from step 1 on and at the peak
at step W - 1 (log). The same position is the floor of every placement after growth, so the first post-growth step
never trains at LR 0 either. Everything else here is pure arithmetic on step numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

# the position of a fresh schedule before optimizer step 1, and the lowest position a growth places it at
FIRST_ITERATION = 1

# attribute of a live WarmupCosineLR holding growlm's re-warm floor (DeepSpeed's scheduler has no such field)
REWARM_FLOOR_ATTR = "growlm_rewarm_floor"


class ScheduleError(ValueError):
    """A schedule growlm cannot place: the engine has none, or another kind than WarmupCosineLR."""


def warmup_cosine_ratio(
    lbi: int,
    total_num_steps: int,
    warmup_num_steps: int,
    warmup_min_ratio: float = 0.0,
    cos_min_ratio: float = 1e-4,
    warmup_type: str = "log",
) -> float:
    """LR / peak LR of DeepSpeed's WarmupCosineLR at last_batch_iteration ``lbi`` (same formula, same clamps:
    warmup_num_steps is raised to 2, progress past the end stays at cos_min_ratio). 0.0 for lbi < 0."""
    if lbi < 0:
        return 0.0
    warmup = max(2, warmup_num_steps)
    if lbi < warmup:
        r = math.log(lbi + 1) / math.log(warmup) if warmup_type == "log" else lbi / warmup
        return warmup_min_ratio + r * (1.0 - warmup_min_ratio)
    progress = min(1.0, (lbi - warmup + 1) / max(1, total_num_steps - warmup))
    return max(0.0, cos_min_ratio + (1.0 - cos_min_ratio) * (1 + math.cos(math.pi * progress)) / 2)


def rewarm_factor(steps_since_growth: int, rewarm_steps: int, floor: float = 0.0) -> float:
    """Linear re-warm multiplier f + (1 - f) (j+1)/R for the j-th optimizer step after growth (j = 0 is the first
    post-growth step, which must already use it; f = ``floor``, 0: from (1/R)), 1 from j = R - 1 on, and 1 when
    R = 0 or before the growth (j < 0)."""
    if rewarm_steps <= 0 or steps_since_growth < 0:
        return 1.0
    return min(1.0, floor + (1.0 - floor) * (steps_since_growth + 1) / rewarm_steps)


@dataclass(frozen=True)
class ScheduleState:
    """A WarmupCosineLR schedule (its constructor arguments) at position ``last_batch_iteration``, plus growlm's
    re-warm: ``rewarm_steps`` steps counted from Adam step ``rewarm_start`` (the growth's step; -1: none), starting
    at ``rewarm_floor`` of the schedule's LR (``rewarm_factor``)."""

    total_num_steps: int
    warmup_num_steps: int
    last_batch_iteration: int = -1
    warmup_min_ratio: float = 0.0
    cos_min_ratio: float = 1e-4
    warmup_type: str = "log"
    rewarm_start: int = -1
    rewarm_steps: int = 0
    rewarm_floor: float = 0.0

    def ratio(self, adam_step: int) -> float:
        """LR / peak LR for the next optimizer step, when ``adam_step`` steps have been taken."""
        base = warmup_cosine_ratio(
            self.last_batch_iteration,
            self.total_num_steps,
            self.warmup_num_steps,
            self.warmup_min_ratio,
            self.cos_min_ratio,
            self.warmup_type,
        )
        return base * self.rewarm(adam_step)

    def rewarm(self, adam_step: int) -> float:
        """The re-warm multiplier of the next optimizer step when ``adam_step`` steps have been taken (1: none)."""
        steps = self.rewarm_steps if self.rewarm_start >= 0 else 0
        return rewarm_factor(adam_step - self.rewarm_start, steps, self.rewarm_floor)

    @classmethod
    def of_scheduler(cls, s: object, rewarm_start: int = -1, rewarm_steps: int = 0) -> ScheduleState:
        """The state of a live ``WarmupCosineLR`` ``s`` (its position and constructor arguments), the inverse of
        ``scheduler_kwargs``, with the given re-warm."""
        kwargs = {k: getattr(s, k) for k in ("total_num_steps", "warmup_num_steps", "last_batch_iteration",
                                              "warmup_min_ratio", "cos_min_ratio", "warmup_type")}  # fmt: skip
        floor = getattr(s, REWARM_FLOOR_ATTR, 0.0) if rewarm_start >= 0 else 0.0  # set by apply_schedule
        return cls(**kwargs, rewarm_start=rewarm_start, rewarm_steps=rewarm_steps, rewarm_floor=floor)

    def scheduler_kwargs(self) -> dict[str, object]:
        """Arguments for ``deepspeed.runtime.lr_schedules.WarmupCosineLR`` (except the optimizer)."""
        return dict(
            total_num_steps=self.total_num_steps,
            warmup_num_steps=self.warmup_num_steps,
            warmup_min_ratio=self.warmup_min_ratio,
            cos_min_ratio=self.cos_min_ratio,
            warmup_type=self.warmup_type,
            last_batch_iteration=self.last_batch_iteration,
        )


def checkpoint_schedule(saved: dict | None, ds_config: dict | None, lbi: int) -> ScheduleState | None:
    """The WarmupCosineLR schedule of a saved checkpoint at position ``lbi`` (its saved LR-scheduler position).

    Args:
        saved: the schedule a growth placed (growlm_state.json's ``schedule``: ScheduleState fields), or None.
        ds_config: the DeepSpeed config the checkpoint was trained with (its ``scheduler`` section is used when
            ``saved`` is None).

    Returns:
        The schedule, or None when the checkpoint has another scheduler or none (or non-integer step counts).
    """
    if saved:
        return replace(ScheduleState(**saved), last_batch_iteration=lbi)
    sch = (ds_config or {}).get("scheduler") or {}
    if sch.get("type") != "WarmupCosineLR":
        return None
    p = sch.get("params", {})
    keys = ("total_num_steps", "warmup_num_steps", "warmup_min_ratio", "cos_min_ratio", "warmup_type")
    kwargs = {k: p[k] for k in keys if k in p}
    if not all(isinstance(kwargs.get(k), int) for k in keys[:2]):
        return None
    return ScheduleState(**kwargs, last_batch_iteration=lbi)


# ----- on a live engine (duck-typed: ``engine.lr_scheduler`` is a DeepSpeed WarmupCosineLR) ---------------------


def engine_schedule(engine: Any, rewarm_start: int = -1, rewarm_steps: int = 0) -> ScheduleState:
    """The engine's WarmupCosineLR as a ScheduleState (position and constructor arguments) with the given re-warm.

    Raises:
        ScheduleError: the engine has no scheduler or another kind (growth places WarmupCosineLR only).
    """
    s = engine.lr_scheduler
    if s is None or type(s).__name__ != "WarmupCosineLR":
        raise ScheduleError(
            f"growth places a WarmupCosineLR schedule, this run has {type(s).__name__}; use a ds_config whose "
            "scheduler type is WarmupCosineLR (ds_configs/*.json)"
        )
    return ScheduleState.of_scheduler(s, rewarm_start, rewarm_steps)


def apply_schedule(engine: Any, sched: ScheduleState, adam_step: int) -> float:
    """Put the engine's WarmupCosineLR at ``sched`` and set the LR of the next optimizer step (re-warm included).

    Call after loading or growing, and after every optimizer step while a re-warm runs. Returns that LR."""
    s = engine.lr_scheduler
    s.total_num_steps, s.warmup_num_steps = sched.total_num_steps, max(2, sched.warmup_num_steps)
    s.inverse_log_warm_up = 1.0 / math.log(s.warmup_num_steps)  # DeepSpeed derives it once, in its constructor
    s.warmup_type, s.warmup_min_ratio, s.cos_min_ratio = sched.warmup_type, sched.warmup_min_ratio, sched.cos_min_ratio
    s.last_batch_iteration = sched.last_batch_iteration
    setattr(s, REWARM_FLOOR_ATTR, sched.rewarm_floor)  # so that engine_schedule reads the floor back
    factor = sched.rewarm(adam_step)
    if s.last_batch_iteration >= 0:
        lrs = [lr * factor for lr in s.get_lr()]
    else:  # not started: LR 0 (asking DeepSpeed's get_lr here only makes it warn and return 0)
        lrs = [0.0] * len(s.optimizer.param_groups)
    for group, lr in zip(s.optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    return lrs[0]


def start_schedule(engine: Any) -> float | None:
    """Move a fresh engine's WarmupCosineLR (lbi -1, LR 0) to FIRST_ITERATION, so optimizer step 1 trains at the
    warm-up's first non-zero LR (see the module docstring). A scheduler already past its start (a loaded
    checkpoint), another scheduler type or none is left alone.

    Returns:
        The LR of step 1, or None when nothing was changed.
    """
    s = getattr(engine, "lr_scheduler", None)
    if s is None or type(s).__name__ != "WarmupCosineLR" or s.last_batch_iteration >= 0:
        return None
    sched = replace(engine_schedule(engine), last_batch_iteration=FIRST_ITERATION)
    return apply_schedule(engine, sched, 0)


def apply_rewarm(engine: Any, sched: ScheduleState, adam_step: int) -> None:
    """Scale the LR that the scheduler just set for the next step by the re-warm factor (no-op outside a re-warm).
    Call after every optimizer step; ``adam_step`` is the number of steps taken."""
    if sched.rewarm_start < 0 or adam_step - sched.rewarm_start >= sched.rewarm_steps:
        return
    factor = sched.rewarm(adam_step)
    s = engine.lr_scheduler  # set, not multiply: an fp16 overflow skips scheduler.step() but not this call
    for group, lr in zip(s.optimizer.param_groups, s.get_lr(), strict=True):
        group["lr"] = lr * factor
