"""The slope trigger: the smoothed log-log slope of loss against compute, and when it fires."""

import json
import math

import pytest

from growlm.growth.errors import GrowthError
from growlm.growth.stages.trigger import equal_rate_reached, loglog_slope, slope_trigger
from growlm.runtime.metrics_file import MetricsFileError, read_val_curve


def test_slope_of_a_power_law_and_trigger():
    compute = [1e15 * 1.5**i for i in range(30)]
    losses = [10 * c**-0.05 for c in compute]
    assert loglog_slope(compute, losses, window=10, beta=0.0) == pytest.approx(-0.05, abs=1e-9)
    assert slope_trigger(compute, losses, threshold=-0.0575, beta=0.0)  # flatter than depth's threshold: grow
    assert not slope_trigger(compute, losses, threshold=-0.03, beta=0.0)
    assert not slope_trigger(compute[:3], losses[:3], threshold=-0.0575)
    with pytest.raises(GrowthError, match="at least"):
        loglog_slope(compute[:3], losses[:3])
    assert math.isfinite(loglog_slope(compute, losses))


def test_the_trigger_on_the_evaluations_so_far_fires_once_a_window_of_them_exists():
    compute = [1e15 * 1.5**i for i in range(30)]
    losses = [10 * c**-0.05 for c in compute]
    # as a run asks it at each evaluation: on the points up to and including that one
    fired = [slope_trigger(compute[: k + 1], losses[: k + 1], -0.0575, window=10, beta=0.0) for k in range(30)]
    assert fired == [False] * 9 + [True] * 21  # as soon as 10 points exist, and from then on
    assert not any(slope_trigger(compute[: k + 1], losses[: k + 1], -0.03, beta=0.0) for k in range(30))  # never


def curves():
    """A target model's curve and a small model's (half the cost per step, higher floor): the small model is ahead
    per FLOP at first, then its rate falls below the target's at the same loss."""
    n = [10.0 * k for k in range(1, 81)]
    target_c, small_c = [k * 1e12 for k in n], [k * 0.5e12 for k in n]
    target_l = [2.0 + 10 * k**-0.5 for k in n]
    small_l = [2.2 + 6 * (k / 2) ** -0.5 for k in n]
    return small_c, small_l, target_c, target_l


EQUAL_RATE_AT = 49  # the evaluation of curves() at which the small model's rate falls to the target's


def test_equal_rate_reached_fires_where_the_small_models_rate_falls_to_the_targets():
    small_c, small_l, target_c, target_l = curves()
    live = [equal_rate_reached(small_c[: k + 1], small_l[: k + 1], target_c, target_l) for k in range(len(small_l))]
    i = live.index(True)
    assert i == EQUAL_RATE_AT and all(live[i:])  # not at the first possible point, and it stays fired
    assert not any(live[:9])  # fewer than the window's 10 evaluations: never
    # a target that learns twice as fast per FLOP at every loss makes the small model's rate fall below it sooner
    faster = [c / 2 for c in target_c]
    fast = [equal_rate_reached(small_c[: k + 1], small_l[: k + 1], faster, target_l) for k in range(len(small_l))]
    assert fast.index(True) < i


def test_read_val_curve_keeps_one_point_per_step_in_flops_order(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [
        {"event": "val", "step": 0, "val_loss": 9.0, "flops": 0},  # before training: no FLOPs yet, skipped
        {"event": "train", "step": 1, "loss": 8.0, "flops": 10},
        {"event": "val", "step": 2, "val_loss": 7.0, "flops": 20},
        {"event": "val", "step": 4, "val_loss": 6.0, "flops": 40},
        {"event": "val", "step": 4, "val_loss": 5.9, "flops": 40},  # the final evaluation repeats the last step
    ]
    path.write_text("\n".join(json.dumps(r) for r in lines) + '\n{"event": "val", "st')  # a half-written line
    assert read_val_curve(path) == ([20.0, 40.0], [7.0, 5.9])
    with pytest.raises(MetricsFileError, match="needs --eval_interval"):
        read_val_curve(_write(tmp_path / "none.jsonl", lines[:2]))
    with pytest.raises(MetricsFileError, match="cannot read the metrics file"):
        read_val_curve(tmp_path / "missing.jsonl")


def _write(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records))
    return path


def test_a_plan_stage_with_a_reference_fires_at_the_equal_rate_point(tmp_path):
    from growlm.growth.stages.plan import parse_stages
    from growlm.growth.stages.trigger import stage_due

    small_c, small_l, target_c, target_l = curves()
    pairs = zip(target_c, target_l, strict=True)
    ref = _write(
        tmp_path / "metrics.jsonl",
        [{"event": "val", "step": k, "val_loss": v, "flops": c} for k, (c, v) in enumerate(pairs)],
    )
    doc = {"start": {"preset": "tiny", "vocab_size": 97}, "stages": [
        {"target": {"n_layer": 3}, "family": "duplicate", "when": {"slope": "auto", "reference": str(ref)}},
    ]}  # fmt: skip
    stage = parse_stages(doc).stages[0]
    due = [
        stage_due(stage, k, 0, list(zip(small_c[: k + 1], small_l[: k + 1], strict=True))) for k in range(len(small_l))
    ]
    assert due.index(True) == EQUAL_RATE_AT  # the reference read from its metrics.jsonl, as from memory above
    gpt2 = parse_stages(doc | {"stages": [doc["stages"][0] | {"when": {"slope": "auto"}}]}).stages[0]
    points = list(zip(small_c, small_l, strict=True))
    assert stage_due(gpt2, 0, 0, points) == slope_trigger(small_c, small_l, -0.0575)
