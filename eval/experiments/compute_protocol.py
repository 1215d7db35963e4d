"""The equal-compute protocol's arithmetic (pure functions; numpy, and scipy for the t quantile and the curve fit):
FLOPs budgets and step counts of staged arms, the scratch compute-loss reference curve and its inversion, paired
savings, and the 95% t-interval.

Equal compute (DESIGN.md, "When to grow"): every arm gets the FLOPs budget C of the scratch target run (T steps
of c_target FLOPs each). An arm that trains g_1 steps at c_1 FLOPs/step, then g_2 - g_1 steps at c_2, ..., and ends
at the target shape gets ``g_k + (C - spent) / c_target`` steps in all, where ``spent`` is the compute of its small
stages: the cheap stages buy it extra steps. Its LR schedule (cosine) ends at its own last step.

Paired saving of a seed (Shen et al. 2022, arXiv 2203.06211, section 4, "compute to reach a loss"): with L_a the
arm's final validation loss and C_a its compute, saving = 1 - C_a / C_scratch(L_a), where C_scratch(L) is the
compute the scratch target needs to reach L, read off the scratch reference curve of the same seed (below).
Positive = compute saved. The first-crossing saving is 1 - C_a(L_T) / C_T, C_a(L_T) the compute at which the arm's
validation curve first reaches the scratch run's final loss L_T.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def step_flops(flops_per_token: int, batch: int, seq_len: int) -> int:
    """FLOPs of one optimizer step: model FLOPs per token (model.config.flops_per_token) x batch x seq_len tokens."""
    return int(flops_per_token) * int(batch) * int(seq_len)


def arm_steps(stage_costs: Sequence[float], grow_steps: Sequence[int], budget_flops: float) -> int:
    """Total optimizer steps of an arm under an equal FLOPs budget.

    Args:
        stage_costs: FLOPs per step of each stage's model, the last one the target (len k + 1 for k growths).
        grow_steps: the global step after which each growth happens (len k, increasing, > 0).
        budget_flops: the compute budget C (FLOPs), e.g. T x c_target of the scratch target run.

    Raises:
        ValueError: lengths that do not match, steps not increasing, or small stages that spend the whole budget.
    """
    if len(stage_costs) != len(grow_steps) + 1:
        raise ValueError(
            f"{len(stage_costs)} stage costs need {len(stage_costs) - 1} growth steps, got {len(grow_steps)}"
        )
    if any(b <= a for a, b in zip([0, *grow_steps], grow_steps, strict=False)):
        raise ValueError(f"growth steps {list(grow_steps)} must be > 0 and increasing")
    spent, prev = 0.0, 0
    for cost, g in zip(stage_costs, grow_steps, strict=False):
        spent += (g - prev) * cost
        prev = g
    left = budget_flops - spent
    if left <= 0:
        raise ValueError(f"the small stages spend {spent:.3e} FLOPs of the {budget_flops:.3e} budget; grow earlier")
    return prev + max(1, round(left / stage_costs[-1]))


def equal_steps_cap(stage_costs: Sequence[float], grow_steps: Sequence[int], total_steps: int) -> float:
    """The saving an arm that tracks scratch step for step would have (the equal-steps view): the fraction of the
    target's compute for ``total_steps`` that its cheaper stages did not spend, sum_i (g_i - g_{i-1})(1 - c_i/c_T)
    / T. A staged run saves more only by learning faster per step than the target model."""
    c_t, prev, saved = stage_costs[-1], 0, 0.0
    for cost, g in zip(stage_costs, grow_steps, strict=False):
        saved += (g - prev) * (1 - cost / c_t)
        prev = g
    return saved / total_steps


def t975(dof: int) -> float:
    """Two-sided 95% Student t quantile t_{0.975, dof} (scipy.stats.t.ppf).

    Raises:
        ValueError: dof < 1.
    """
    if dof < 1:
        raise ValueError(f"dof={dof}: a t-interval needs at least 2 values")
    from scipy import stats  # lazy: heavy (about 0.5 s), only for statistics

    return float(stats.t.ppf(0.975, dof))


def mean_ci95(values: Sequence[float]) -> tuple[float, float | None, float | None]:
    """(mean, low, high) of the 95% t-interval mean +- t_{0.975, n-1} s / sqrt(n); (mean, None, None) for n = 1.

    Raises:
        ValueError: no values.
    """
    if not values:
        raise ValueError("no values to average")
    x = np.asarray(values, dtype=float)
    m = float(x.mean())
    if len(x) < 2:
        return m, None, None
    half = t975(len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return m, m - half, m + half


@dataclass(frozen=True)
class PowerLaw:
    """L(C) = a (C / c_ref)^-b + c: validation loss (nats/token) against compute C (FLOPs)."""

    a: float
    b: float
    c: float
    c_ref: float
    rmse: float

    def loss(self, flops: float | np.ndarray) -> np.ndarray:
        """L at compute ``flops`` (FLOPs)."""
        return self.a * (np.asarray(flops, dtype=float) / self.c_ref) ** (-self.b) + self.c


def fit_power_law(flops: Sequence[float], losses: Sequence[float]) -> PowerLaw:
    """Least-squares fit of L(C) = a (C / c_ref)^-b + c (a > 0, b in [0.01, 3]: monotone decreasing), c_ref = the
    largest compute: scipy.optimize.curve_fit from the best of a few starting exponents.

    Raises:
        ValueError: fewer than 3 points, non-positive compute, or no fit with a > 0 (a curve that does not fall).
    """
    from scipy.optimize import curve_fit  # lazy: heavy (about 0.5 s), only for statistics

    x = np.asarray(flops, dtype=float)
    y = np.asarray(losses, dtype=float)
    if len(x) < 3 or len(x) != len(y) or (x <= 0).any():
        raise ValueError("need >= 3 (compute > 0, loss) points of equal count to fit a power law")
    c_ref = float(x.max())
    u = x / c_ref

    def law(u: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
        return a * u ** (-b) + c

    best = None
    spread = max(float(y.max() - y.min()), 1e-6)
    for b0 in (0.05, 0.2, 0.5, 1.0, 2.0):  # starting exponents: curve_fit finds the local optimum near each
        try:
            (a, b, c), _ = curve_fit(law, u, y, p0=(spread, b0, float(y.min()) - spread),
                                     bounds=([1e-12, 0.01, -np.inf], [np.inf, 3.0, np.inf]), maxfev=20_000)  # fmt: skip
        except (RuntimeError, ValueError):  # no convergence from this start
            continue
        rmse = float(np.sqrt(np.mean((law(u, a, b, c) - y) ** 2)))
        if best is None or rmse < best.rmse:
            best = PowerLaw(float(a), float(b), float(c), c_ref, rmse)
    if best is None or best.a <= 1e-9:
        raise ValueError("no decreasing power law fits these points (the loss does not fall with compute)")
    return best


class ReferenceCurve:
    """The scratch target's compute-loss curve of one seed: a power law fitted to a longer scratch run's
    evaluations, corrected to pass through ``anchors`` (compute, loss) of scratch runs that *finished* their cosine
    schedule there (a mid-run point of a longer run still has a high LR and lies above what a run ending there
    reaches). The correction is linear in log10 C between anchors and constant outside; the curve is made monotone
    (running minimum) and inverted on a log grid from the smallest anchor / 100 to the largest x ``extrapolate``.
    """

    def __init__(self, law: PowerLaw, anchors: Sequence[tuple[float, float]], extrapolate: float = 100.0) -> None:
        if not anchors:
            raise ValueError("a reference curve needs at least one (compute, loss) anchor")
        self.law = law
        pts = sorted((float(c), float(v)) for c, v in anchors)
        self.anchors = pts
        self._log_c = np.array([math.log10(c) for c, _ in pts])
        self._corr = np.array([v - float(law.loss(c)) for c, v in pts])
        self.c_max_anchor = pts[-1][0]
        self.grid = np.logspace(self._log_c[0] - 2, self._log_c[-1] + math.log10(extrapolate), 4000)
        raw = law.loss(self.grid) + np.interp(np.log10(self.grid), self._log_c, self._corr)
        self.curve = np.minimum.accumulate(raw)

    def loss(self, flops: float) -> float:
        """Reference loss at compute ``flops`` (FLOPs), linear in log10 C on the grid."""
        return float(np.interp(math.log10(flops), np.log10(self.grid), self.curve))

    def flops_at(self, loss: float) -> tuple[float | None, bool]:
        """(compute the scratch target needs to reach ``loss``, whether that compute lies past the largest anchor,
        i.e. is extrapolated). (None, True) when the curve never gets that low within the grid."""
        idx = np.nonzero(self.curve <= loss)[0]
        if len(idx) == 0:
            return None, True
        i = int(idx[0])
        if i == 0:
            return float(self.grid[0]), False
        l0, l1 = self.curve[i - 1], self.curve[i]
        t = 0.0 if l0 == l1 else (l0 - loss) / (l0 - l1)
        lc = math.log10(self.grid[i - 1]) + t * (math.log10(self.grid[i]) - math.log10(self.grid[i - 1]))
        c = 10**lc
        return c, bool(c > self.c_max_anchor * 1.0001)


def paired_saving(ref: ReferenceCurve, arm_loss: float, arm_flops: float) -> dict:
    """The paired saving of one arm run against its seed's scratch reference: saving = 1 - C_arm / C_scratch(L_arm)
    (fraction of the scratch compute; positive = saved). When the reference never gets as low as L_arm within its
    grid, the saving is a lower bound computed at the grid's end (``bound: true``)."""
    c_need, extrapolated = ref.flops_at(arm_loss)
    bound = c_need is None
    if bound:
        c_need = float(ref.grid[-1])
    return {"saving": 1.0 - arm_flops / c_need, "scratch_flops_needed": float(c_need), "extrapolated": extrapolated,
            "bound": bound}  # fmt: skip
