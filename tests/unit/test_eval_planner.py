"""Stage scheduling: the slope trigger on a synthetic power law, and FLOPs accounting against 6N + 12LHQT counted
from a real model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from growlm.growth.stages.trigger import SLOPE_THRESHOLDS, loglog_slope, slope_trigger
from growlm.model.config import GPTConfig, flops_per_token
from growlm.model.gpt2.model import GPT


def power_law(c, floor=2.0, c_c=1e9, alpha=0.3):
    return floor + (c_c / np.asarray(c, dtype=float)) ** alpha


def first_firing(compute, losses, threshold, window=10, beta=0.9):
    """The first evaluation at which the slope trigger fires, asked as a run asks it (on the evaluations up to and
    including each one); None: never."""
    return next(
        (k for k in range(len(losses)) if slope_trigger(compute[: k + 1], losses[: k + 1], threshold, window, beta)),
        None,
    )


@pytest.mark.parametrize("kind", ["depth", "width", "both"])
def test_slope_trigger_fires_where_the_power_law_reaches_the_threshold(kind):
    thr = SLOPE_THRESHOLDS[kind]
    floor, alpha = 2.0, 0.3
    # analytic: d log L / d log C = -alpha (L - floor) / L = thr  <=>  L* = floor / (1 + thr / alpha)
    l_star = floor / (1 + thr / alpha)
    c_star = 1e9 / (l_star - floor) ** (1 / alpha)
    c = np.geomspace(c_star / 300, c_star * 300, 200)  # evenly spaced in log C, like the trigger's regression
    i = first_firing(c, power_law(c), thr, window=10, beta=0.0)
    assert i is not None
    # the window's least-squares slope is the slope near its middle (4.5 points back): fires within a few points
    assert abs(math.log10(c[i]) - math.log10(c_star)) < 6 * math.log10(c[1] / c[0])
    assert (
        loglog_slope(c[: i + 1], power_law(c[: i + 1]), 10, 0.0) >= thr > loglog_slope(c[:i], power_law(c[:i]), 10, 0.0)
    )


def test_smoothing_delays_the_trigger_on_a_noisy_curve():
    c = np.geomspace(1e8, 1e14, 120)
    noisy = power_law(c) * (1 + 0.01 * np.random.default_rng(0).standard_normal(c.size))
    plain = first_firing(c, power_law(c), -0.05, beta=0.0)
    smoothed = first_firing(c, noisy, -0.05, beta=0.9)
    assert plain is not None and smoothed is not None and smoothed >= plain - 3


@pytest.mark.parametrize(
    "cfg",
    [
        GPTConfig(n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=300),
        GPTConfig(n_layer=3, n_embd=48, n_head=3, n_inner=100, n_positions=16, vocab_size=50),
    ],
)
def test_flops_accounting_is_6n_plus_12lhqt_counted_from_the_model(cfg):
    model = GPT(cfg)
    n = sum(p.numel() for name, p in model.named_parameters() if "wpe" not in name)  # tied head counted once
    for t in (1, cfg.n_positions):
        assert flops_per_token(cfg, t) == 6 * n + 12 * cfg.n_layer * cfg.n_head * (cfg.n_embd // cfg.n_head) * t
