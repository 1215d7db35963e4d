"""When to grow: the slope trigger. Growth fires once the smoothed log-log slope of the validation loss against
training compute, d log10 L / d log10 C, has flattened to a threshold: the small model has stopped being the
compute-efficient way down (Shen et al. 2022, "Staged Training for Transformer Language Models", arXiv 2203.06211,
section 4). Pure functions of numbers, and ``stage_due``, the decision whether a plan stage's trigger fires now
(which reads a reference run's validation curve once).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from growlm.growth.errors import GrowthError
from growlm.runtime.metrics_file import MetricsFileError, read_val_curve

# d log10 L / d log10 C at which to grow, per growth dimension (Shen et al. 2022, section 4)
SLOPE_THRESHOLDS = {"depth": -0.0575, "width": -0.0475, "both": -0.03}
SLOPE_WINDOW = 10  # evaluations in the least-squares slope of the live trigger


def smooth(values: Sequence[float], beta: float = 0.9) -> list[float]:
    """Bias-corrected exponential moving average (as TensorBoard's smoothing): s_t = EMA_t / (1 - beta^t)."""
    out, ema = [], 0.0
    for t, x in enumerate(values, start=1):
        ema = beta * ema + (1 - beta) * x
        out.append(ema / (1 - beta**t))
    return out


def loglog_slope(
    compute_flops: Sequence[float], losses: Sequence[float], window: int = SLOPE_WINDOW, beta: float = 0.9
) -> float:
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
    compute_flops: Sequence[float],
    losses: Sequence[float],
    threshold: float,
    window: int = SLOPE_WINDOW,
    beta: float = 0.9,
) -> bool:
    """True when the smoothed log-log slope has flattened to ``threshold`` or above (e.g. -0.0575 for depth; see
    SLOPE_THRESHOLDS), i.e. the small model has stopped being compute-efficient. False while too few points."""
    if len(losses) < max(window, 2):
        return False
    return loglog_slope(compute_flops, losses, window, beta) >= threshold


def _rate(compute_flops: Sequence[float], losses: Sequence[float], i: int, window: int, beta: float) -> float | None:
    """-dL/dC (nats per FLOP) of the smoothed curve at evaluation i: -slope * L / C from the log-log slope over the
    last min(window, i + 1) points (None with fewer than 3)."""
    w = min(window, i + 1)
    if w < 3:
        return None
    slope = loglog_slope(compute_flops[: i + 1], losses[: i + 1], w, beta)
    return -slope * smooth(losses[: i + 1], beta)[-1] / compute_flops[i]


def _rates_meet(
    small_flops: Sequence[float],
    small_losses: Sequence[float],
    target_flops: Sequence[float],
    target_losses: Sequence[float],
    target_smoothed: Sequence[float],
    i: int,
    window: int,
    beta: float,
) -> bool:
    """True when the small model's -dL/dC at evaluation i is at most the target's at the first target evaluation
    whose smoothed loss (``target_smoothed``: ``smooth(target_losses, beta)``) is at or below the small model's
    smoothed loss there (False when either rate is undefined or the target curve never gets that low)."""
    small_s = smooth(small_losses[: i + 1], beta)[-1]
    j = next((k for k, v in enumerate(target_smoothed) if v <= small_s), None)
    r_small = _rate(small_flops, small_losses, i, window, beta)
    r_target = None if j is None else _rate(target_flops, target_losses, j, window, beta)
    return r_small is not None and r_target is not None and r_small <= r_target


def equal_rate_reached(
    small_flops: Sequence[float],
    small_losses: Sequence[float],
    target_flops: Sequence[float],
    target_losses: Sequence[float],
    window: int = SLOPE_WINDOW,
    beta: float = 0.9,
) -> bool:
    """The equal-rate rule (a plan's ``when: {slope: auto, reference: ...}``): True once the small model's loss falls
    no faster per FLOP than the target model's did at the same loss (Shen et al. 2022, section 4), judged at the last
    of the small model's evaluations. The small model's rate is -dL/dC of its smoothed curve; the target's is taken
    at the first of its evaluations whose smoothed loss is at or below the small model's. False while there are
    fewer than ``window`` evaluations.

    Args:
        small_flops, small_losses: the small model's evaluations since its stage began (cumulative training FLOPs,
            nats/token).
        target_flops, target_losses: a scratch run of the target model (its metrics.jsonl validations).
    """
    if len(small_losses) < max(window, 2):
        return False
    target_s = smooth(target_losses, beta)
    i = len(small_losses) - 1
    return _rates_meet(small_flops, small_losses, target_flops, target_losses, target_s, i, window, beta)


def stage_due(stage: Any, step: int, tokens: int, slope_points: list[tuple[float, float]]) -> bool:
    """Whether ``stage``'s trigger fires (a growth.stages.plan.Stage, typed loosely: that module imports this one):
    ``{step: N}`` at step >= N, ``{tokens: N}`` once N training tokens are consumed, ``{slope: X}`` when
    ``slope_trigger`` fires on the validations since the last growth (``slope_points``: cumulative training FLOPs,
    validation loss), ``{slope: auto, reference: PATH}`` when ``equal_rate_reached`` does on them against the
    reference run's validation curve (``reference_curve``).

    Raises:
        GrowthError: the reference run's metrics file is missing or holds no validation record.
    """
    kind, value = stage.when.kind, stage.when.value
    if kind == "step":
        return step >= value
    if kind == "tokens":
        return tokens >= value
    flops, losses = [f for f, _ in slope_points], [v for _, v in slope_points]
    if stage.when.reference:
        return equal_rate_reached(flops, losses, *reference_curve(stage.when.reference))
    return slope_trigger(flops, losses, value)


@lru_cache(maxsize=8)
def reference_curve(path: str) -> tuple[list[float], list[float]]:
    """The validation curve of a ``{slope: auto, reference: PATH}`` trigger's reference run (read once).

    Raises:
        GrowthError: the file is missing or holds no validation record (runtime.metrics_file.read_val_curve).
    """
    try:
        return read_val_curve(path)
    except MetricsFileError as e:
        raise GrowthError(str(e)) from None
