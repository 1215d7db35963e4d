"""The IsoFLOP experiment's arithmetic (pure functions of numbers; numpy, scipy for the t quantile): the envelope,
compute-to-reach-a-loss by interpolation between finished runs (never extrapolation), compute savings, the
crossover budget of two sizes, paired 95% t-intervals, and the sign and Wilcoxon signed-rank tests.

Envelope (Hoffmann et al. 2022, arXiv 2203.15556, section 3.2, IsoFLOP profiles): E(B) = min over sizes of the
validation loss of a scratch run with its own fully decayed schedule ending at budget B.

Compute saving at a loss L (Shen et al. 2022, arXiv 2203.06211, section 4; here against any reference curve of
finished runs): saving = 1 - C_arm / C_ref(L), C_ref(L) read off the reference points (budget, loss) by linear
interpolation of log budget between the two finished budgets whose losses bracket L; None when L lies outside
the losses the reference runs reached (extrapolation is never done).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def t975(dof: int) -> float:
    """Two-sided 95% Student t quantile t_{0.975, dof} (scipy.stats.t.ppf).

    Raises:
        ValueError: dof < 1.
    """
    if dof < 1:
        raise ValueError(f"dof={dof}: a t-interval needs at least 2 values")
    from scipy import stats  # lazy: about 0.5 s, statistics only

    return float(stats.t.ppf(0.975, dof))


def mean_ci95(values: Sequence[float]) -> tuple[float, float | None, float | None]:
    """Mean and 95% t-interval (mean -/+ t_{0.975, n-1} s / sqrt(n), s the sample s.d.) of ``values``; the interval
    is (None, None) for fewer than 2 values.

    Raises:
        ValueError: no values.
    """
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci95 of no values")
    m = sum(values) / n
    if n < 2:
        return m, None, None
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    h = t975(n - 1) * sd / math.sqrt(n)
    return m, m - h, m + h


def sign_test_p(values: Sequence[float]) -> float | None:
    """Two-sided exact sign test of median zero: the binomial probability (p = 1/2) of a split of negative and
    positive values at least as uneven as the one observed, zeros dropped (Dixon and Mood 1946; scipy.stats.binomtest);
    None when every value is zero or there are none."""
    neg, pos = sum(v < 0 for v in values), sum(v > 0 for v in values)
    if neg + pos == 0:
        return None
    from scipy import stats  # lazy: about 0.5 s, statistics only

    return float(stats.binomtest(neg, neg + pos, 0.5, alternative="two-sided").pvalue)


def wilcoxon_p(values: Sequence[float]) -> float | None:
    """Two-sided Wilcoxon signed-rank test of a distribution symmetric about zero (Wilcoxon 1945;
    scipy.stats.wilcoxon: exact null distribution for fewer than 50 values without ties or zeros, zeros dropped);
    None for fewer than 2 non-zero values."""
    if sum(v != 0 for v in values) < 2:
        return None
    from scipy import stats  # lazy: about 0.5 s, statistics only

    return float(stats.wilcoxon(list(values), zero_method="wilcox", alternative="two-sided").pvalue)


def envelope(losses: Mapping[float, Mapping[str, float]]) -> dict[float, tuple[str, float]]:
    """Per budget, the best scratch size and its loss: {budget: (size, loss)} from {budget: {size: loss}}."""
    out = {}
    for b in sorted(losses):
        size = min(losses[b], key=losses[b].get)
        out[b] = (size, float(losses[b][size]))
    return out


def compute_to_reach(points: Sequence[tuple[float, float]], loss: float) -> float | None:
    """The compute at which a reference curve of finished runs reaches ``loss``.

    Args:
        points: (budget, final loss) of finished runs, any order (budgets > 0, e.g. FLOPs or fractions of C).
        loss: the loss to reach (nats).

    Returns:
        exp of the linear interpolation of log budget between the first pair of consecutive budgets whose losses
        bracket ``loss`` (L_i >= loss >= L_{i+1}); None when no pair brackets it (the loss is above the smallest
        budget's or below every budget's loss): the answer would need extrapolation.
    """
    pts = sorted(points)
    for (b0, l0), (b1, l1) in zip(pts, pts[1:], strict=False):
        if l0 >= loss >= l1:
            if l0 == l1:
                return float(b0)
            w = (l0 - loss) / (l0 - l1)
            return float(math.exp(math.log(b0) + w * (math.log(b1) - math.log(b0))))
    return None


def saving(arm_budget: float, needed: float | None) -> float | None:
    """1 - arm_budget / needed (fraction of compute saved; negative = more compute), None when ``needed`` is."""
    return None if needed is None else 1.0 - arm_budget / needed


def crossover(small: Mapping[float, float], big: Mapping[float, float]) -> tuple[float, str]:
    """The budget at which the bigger size's envelope point drops below the smaller's.

    Args:
        small, big: {budget: final loss} of the two sizes at the same budgets (at least 2).

    Returns:
        (budget, flag). With d(B) = L_big(B) - L_small(B) at the sorted budgets: the first sign change from d > 0
        to d <= 0, log-linear between the two budgets, flag ''. If d <= 0 already at the smallest budget: (that
        budget, 'below'); if d > 0 at every budget: (the largest budget, 'beyond'). The flags say that the true
        crossover lies outside the measured budgets.

    Raises:
        ValueError: fewer than 2 common budgets.
    """
    bs = sorted(set(small) & set(big))
    if len(bs) < 2:
        raise ValueError(f"a crossover needs at least 2 common budgets, got {bs}")
    d = [big[b] - small[b] for b in bs]
    if d[0] <= 0:
        return float(bs[0]), "below"
    for (b0, d0), (b1, d1) in zip(zip(bs, d, strict=True), zip(bs[1:], d[1:], strict=True), strict=False):
        if d0 > 0 >= d1:
            w = d0 / (d0 - d1)
            return float(math.exp(math.log(b0) + w * (math.log(b1) - math.log(b0)))), ""
    return float(bs[-1]), "beyond"


def best_lr(tried: Mapping[float, float]) -> float:
    """The LR of the lowest final loss in {lr: loss}.

    Raises:
        ValueError: nothing tried.
    """
    if not tried:
        raise ValueError("best_lr of no runs")
    return min(tried, key=tried.get)


# ------------------------------------------------------------------------------- numbers as the reports print them
def r4(x: float | None, nd: int = 4) -> float | None:
    """``x`` rounded to ``nd`` decimals (None stays None): how results.json stores a loss, a delta or a share."""
    return None if x is None else round(float(x), nd)


def ci(values: Sequence[float], nd: int = 4) -> dict:
    """{mean, ci95: [low, high]} of ``values`` (``mean_ci95``) rounded to ``nd`` decimals; the interval None below
    2 values."""
    m, lo, hi = mean_ci95(values)
    return {"mean": r4(m, nd), "ci95": [r4(lo, nd), r4(hi, nd)]}


def p4(x: float | None, none: str = "n/a") -> str:
    """A loss in a table: 4 decimals, ``none`` for a missing value."""
    return none if x is None else f"{x:.4f}"


def pv(x: float | None) -> str:
    """A p-value in text: 3 significant digits, 'n/a' when there is none."""
    return "n/a" if x is None else f"{x:.3g}"


def pct(x: float | None, none: str = "n/a (outside the finished runs)") -> str:
    """A share (a saving) as a signed percentage with one decimal, ``none`` for a missing value."""
    return none if x is None else f"{100 * x:+.1f}%"


def fmt_delta(a: Mapping) -> str:
    """A paired difference and its interval from a row's ``delta_vs_envelope_mean`` / ``_ci95_low`` / ``_ci95_high``
    (nats): '+0.0123 [-0.0045, +0.0291]'."""
    lo, hi = a["delta_vs_envelope_ci95_low"], a["delta_vs_envelope_ci95_high"]
    return f"{a['delta_vs_envelope_mean']:+.4f} [{lo:+.4f}, {hi:+.4f}]"
