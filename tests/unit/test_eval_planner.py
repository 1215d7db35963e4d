"""Stage scheduling: the slope trigger on a synthetic power law, FLOPs accounting against 6N + 12LHQT counted from a
real model, and the Kaplan-form fits of the scaling advisor (eval.experiments.scaling)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from growlm.eval.experiments import scaling
from growlm.growth.stages.trigger import SLOPE_THRESHOLDS, first_trigger_index, loglog_slope
from growlm.model.config import GPTConfig, flops_per_token
from growlm.model.gpt2.model import GPT


def power_law(c, floor=2.0, c_c=1e9, alpha=0.3):
    return floor + (c_c / np.asarray(c, dtype=float)) ** alpha


@pytest.mark.parametrize("kind", ["depth", "width", "both"])
def test_slope_trigger_fires_where_the_power_law_reaches_the_threshold(kind):
    thr = SLOPE_THRESHOLDS[kind]
    floor, alpha = 2.0, 0.3
    # analytic: d log L / d log C = -alpha (L - floor) / L = thr  <=>  L* = floor / (1 + thr / alpha)
    l_star = floor / (1 + thr / alpha)
    c_star = 1e9 / (l_star - floor) ** (1 / alpha)
    c = np.geomspace(c_star / 300, c_star * 300, 200)  # evenly spaced in log C, like the trigger's regression
    i = first_trigger_index(c, power_law(c), thr, window=10, beta=0.0)
    assert i is not None
    # the window's least-squares slope is the slope near its middle (4.5 points back): fires within a few points
    assert abs(math.log10(c[i]) - math.log10(c_star)) < 6 * math.log10(c[1] / c[0])
    assert (
        loglog_slope(c[: i + 1], power_law(c[: i + 1]), 10, 0.0) >= thr > loglog_slope(c[:i], power_law(c[:i]), 10, 0.0)
    )
    # the planner predicts the same point from a fitted curve (C proportional to steps)
    fit = scaling.fit_step_curve(c / 1e6, power_law(c), flops_per_step=1e6, alpha=None)
    assert fit.alpha == pytest.approx(alpha, abs=0.03)
    assert fit.steps_at_slope(thr) * 1e6 == pytest.approx(c_star, rel=0.15)


def test_smoothing_delays_the_trigger_on_a_noisy_curve():
    c = np.geomspace(1e8, 1e14, 120)
    noisy = power_law(c) * (1 + 0.01 * np.random.default_rng(0).standard_normal(c.size))
    plain = first_trigger_index(c, power_law(c), -0.05, beta=0.0)
    smoothed = first_trigger_index(c, noisy, -0.05, beta=0.9)
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
    small = GPTConfig(n_layer=1, n_embd=64, n_head=4, n_positions=32, vocab_size=300)
    stages = scaling.stage_flops([(small, 10), (cfg, 5)], tokens_per_step=8 * 16, seq_len=16)
    assert stages[0].flops == flops_per_token(small, 16) * 128 * 10
    assert stages[1].cumulative_flops == stages[0].flops + flops_per_token(cfg, 16) * 128 * 5
    with pytest.raises(ValueError, match="seq_len"):
        scaling.stage_flops([(small, 1)], 64, seq_len=64)


def test_kaplan_forms_and_growth_proposal():
    assert scaling.kaplan_loss_n(8.8e13) == pytest.approx(1.0)
    assert scaling.kaplan_loss_ns(8.8e13, 2.1e3) == pytest.approx(2.0)
    assert scaling.critical_batch_tokens(1.0) == pytest.approx(2.1e8)
    assert scaling.kaplan_compute(1e6, 2048, 10) == 6e6 * 2048 * 10
    # a small model (cheap, higher floor) and a target (4x the cost, lower floor)
    small = scaling.StepCurve(floor=3.0, s_c=20.0, alpha=0.76, flops_per_step=1.0)
    target = scaling.StepCurve(floor=2.5, s_c=30.0, alpha=0.76, flops_per_step=4.0)
    steps = np.arange(1, 400)
    fit = scaling.fit_step_curve(steps, small.loss(steps), 1.0)
    assert (fit.floor, fit.s_c) == (pytest.approx(3.0, abs=1e-6), pytest.approx(20.0, rel=1e-4))
    p = scaling.propose_growth(small, target, target_steps=2000, threshold=SLOPE_THRESHOLDS["width"])
    assert p.best_saving is not None and p.best_saving > 0
    assert p.slope_saving is None or p.slope_saving <= p.best_saving + 1e-9
    assert scaling.predicted_saving(small, target, 10**6, 2000) < 0  # growing far too late costs compute
    assert scaling.predicted_saving(small, target, 10**6, 5) is None  # the target never gets that low in 5 steps
