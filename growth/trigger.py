"""When to grow: the slope trigger. Growth fires once the smoothed log-log slope of the validation loss against
training compute, d log10 L / d log10 C, has flattened to a threshold: the small model has stopped being the
compute-efficient way down (Shen et al. 2022, "Staged Training for Transformer Language Models", arXiv 2203.06211,
section 4). Pure functions of numbers; growth.scaling predicts where the trigger fires and what a growth saves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from growth.errors import GrowthError

# d log10 L / d log10 C at which to grow, per growth dimension (Shen et al. 2022, section 4)
SLOPE_THRESHOLDS = {"depth": -0.0575, "width": -0.0475, "both": -0.03}
COMPUTE_OPTIMAL_SLOPE = -0.052


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


def first_trigger_index(
    compute_flops: Sequence[float], losses: Sequence[float], threshold: float, window: int = 10, beta: float = 0.9
) -> int | None:
    """Index of the first evaluation at which ``slope_trigger`` fires on the points so far (None: never)."""
    for i in range(max(window, 2), len(losses) + 1):
        if slope_trigger(compute_flops[:i], losses[:i], threshold, window, beta):
            return i - 1
    return None
