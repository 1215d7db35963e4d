"""LR-schedule placement after growth, the re-warm, and the slope trigger (DESIGN.md 3.3-3.4). Pure functions of step
numbers and losses; no optimizer or scheduler is touched here.

The schedule is DeepSpeed's ``WarmupCosineLR`` (``deepspeed.runtime.lr_schedules``), whose only state is
``last_batch_iteration`` (lbi): the LR in force for the next optimizer step is peak_lr * ratio(lbi) (peak_lr is the
optimizer's lr). growlm multiplies that by a re-warm factor for R steps after a growth. A training loop drives it so:

    scheduler.step()                                       # as usual, after optimizer.step(); adam_step += 1
    f = rewarm_factor(adam_step - sched.rewarm_start, sched.rewarm_steps)
    for group in optimizer.param_groups: group["lr"] *= f  # no-op when no re-warm is running
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from growth.errors import GrowthError

SCHEDULE_RULES = ("target", "continue", "rewind")

# d log10 L / d log10 C at which to grow (Shen et al. 2022, arXiv 2203.06211, section 4; DESIGN.md 3.4)
SLOPE_THRESHOLDS = {"depth": -0.0575, "width": -0.0475, "both": -0.03}
COMPUTE_OPTIMAL_SLOPE = -0.052
# S' = S_small / constant_op (the seed's measured constants, DESIGN.md 3.3)
CONSTANT_OP = {"depth": 1.4, "width": 1.8, "both": 2.5}


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


def rewarm_factor(steps_since_growth: int, rewarm_steps: int) -> float:
    """Linear re-warm multiplier (j+1)/R for the j-th optimizer step after growth (j = 0 is the first post-growth
    step, which must already use it), 1 from j = R - 1 on, and 1 when R = 0 or before the growth (j < 0)."""
    if rewarm_steps <= 0 or steps_since_growth < 0:
        return 1.0
    return min(1.0, (steps_since_growth + 1) / rewarm_steps)


@dataclass(frozen=True)
class ScheduleState:
    """A WarmupCosineLR schedule (its constructor arguments) at position ``last_batch_iteration``, plus growlm's
    re-warm: ``rewarm_steps`` steps counted from Adam step ``rewarm_start`` (the growth's step; -1: none)."""

    total_num_steps: int
    warmup_num_steps: int
    last_batch_iteration: int = -1
    warmup_min_ratio: float = 0.0
    cos_min_ratio: float = 1e-4
    warmup_type: str = "log"
    rewarm_start: int = -1
    rewarm_steps: int = 0

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
        return base * rewarm_factor(adam_step - self.rewarm_start, self.rewarm_steps if self.rewarm_start >= 0 else 0)

    @classmethod
    def of_scheduler(cls, s: object, rewarm_start: int = -1, rewarm_steps: int = 0) -> ScheduleState:
        """The state of a live ``WarmupCosineLR`` ``s`` (its position and constructor arguments), the inverse of
        ``scheduler_kwargs``, with the given re-warm."""
        kwargs = {k: getattr(s, k) for k in ("total_num_steps", "warmup_num_steps", "last_batch_iteration",
                                              "warmup_min_ratio", "cos_min_ratio", "warmup_type")}  # fmt: skip
        return cls(**kwargs, rewarm_start=rewarm_start, rewarm_steps=rewarm_steps)

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


@dataclass(frozen=True)
class ScheduleRule:
    """How the LR schedule continues after a growth (DESIGN.md 3.3).

    'target' (staged training, Shen et al. 2022 section 3.3): the grown model joins the *target* model's schedule
    (``total_num_steps`` / ``warmup_num_steps`` when given, else the current ones) at lbi' = round(lbi /
    constant_op), and re-warms linearly over ``rewarm_steps``. 'continue' (MSG): same schedule, same position.
    'rewind': back to the peak (lbi' = warmup_num_steps). Any rule may re-warm.
    """

    kind: str = "continue"
    constant_op: float = 1.0
    rewarm_steps: int = 0
    total_num_steps: int | None = None
    warmup_num_steps: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULE_RULES:
            raise GrowthError(f"unknown schedule rule {self.kind!r}; use one of {SCHEDULE_RULES}")
        if self.constant_op <= 0:
            raise GrowthError(f"constant_op={self.constant_op} must be > 0 (e.g. 1.4 depth, 1.8 width, 2.5 both)")
        if self.rewarm_steps < 0:
            raise GrowthError(f"rewarm_steps={self.rewarm_steps} must be >= 0")


def place_schedule(sched: ScheduleState, adam_step: int, rule: ScheduleRule) -> ScheduleState:
    """The schedule of the grown model, growth happening after ``adam_step`` optimizer steps. The returned state's
    ``ratio(adam_step)`` is the LR ratio of the first post-growth step.

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
    return replace(
        sched,
        total_num_steps=total,
        warmup_num_steps=warmup,
        last_batch_iteration=lbi,
        rewarm_start=adam_step if rule.rewarm_steps > 0 else -1,
        rewarm_steps=rule.rewarm_steps,
    )


# ----- when to grow -----------------------------------------------------------------------------------------------


def smooth(values: Sequence[float], beta: float = 0.9) -> list[float]:
    """Bias-corrected exponential moving average (as TensorBoard's smoothing): s_t = EMA_t / (1 - beta^t)."""
    out, ema = [], 0.0
    for t, x in enumerate(values, start=1):
        ema = beta * ema + (1 - beta) * x
        out.append(ema / (1 - beta**t))
    return out


def loglog_slope(compute_flops: Sequence[float], losses: Sequence[float], window: int = 10, beta: float = 0.9) -> float:
    """d log10 L / d log10 C of the smoothed loss curve: least-squares slope over the last ``window`` points.

    Args:
        compute_flops: cumulative training compute at each evaluation (FLOPs, increasing, > 0).
        losses: validation loss at each evaluation (nats per token, > 0).

    Raises:
        GrowthError: fewer than ``window`` (>= 2) points, lengths differ, or non-positive values.
    """
    if len(compute_flops) != len(losses):
        raise GrowthError(f"{len(compute_flops)} compute values but {len(losses)} losses; pass one per evaluation")
    if window < 2 or len(losses) < window:
        raise GrowthError(f"need at least window={max(window, 2)} evaluations, have {len(losses)}")
    if min(compute_flops) <= 0 or min(losses) <= 0:
        raise GrowthError("compute and loss must be positive to take log10")
    xs = [math.log10(c) for c in compute_flops[-window:]]
    ys = [math.log10(v) for v in smooth(losses, beta)[-window:]]
    mx, my = sum(xs) / window, sum(ys) / window
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise GrowthError("compute values in the window are all equal; slope undefined")
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def slope_trigger(
    compute_flops: Sequence[float], losses: Sequence[float], threshold: float, window: int = 10, beta: float = 0.9
) -> bool:
    """True when the smoothed log-log slope has flattened to ``threshold`` or above (e.g. -0.0575 for depth; see
    SLOPE_THRESHOLDS), i.e. the small model has stopped being compute-efficient. False while too few points."""
    if len(losses) < max(window, 2):
        return False
    return loglog_slope(compute_flops, losses, window, beta) >= threshold
