"""Schedule placement, re-warm and the slope trigger."""

import math

import pytest
import torch

from growth.errors import GrowthError
from growth.schedule import (
    ScheduleRule,
    ScheduleState,
    loglog_slope,
    place_schedule,
    rewarm_factor,
    slope_trigger,
    warmup_cosine_ratio,
)


@pytest.mark.parametrize("warmup_type", ["log", "linear"])
def test_ratio_matches_deepspeed_warmup_cosine(warmup_type):
    from deepspeed.runtime.lr_schedules import WarmupCosineLR

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    kw = dict(total_num_steps=50, warmup_num_steps=10, warmup_min_ratio=0.1, cos_min_ratio=0.01)
    sched = WarmupCosineLR(opt, warmup_type=warmup_type, **kw)
    for lbi in range(0, 60):
        sched.step(lbi)
        assert warmup_cosine_ratio(lbi, warmup_type=warmup_type, **kw) == pytest.approx(sched.get_lr_ratio(), abs=1e-12)


def test_rewarm_is_linear_and_in_effect_at_the_first_step():
    assert [rewarm_factor(j, 4) for j in (-1, 0, 1, 2, 3, 10)] == [1.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    assert rewarm_factor(0, 0) == 1.0


def test_place_schedule_rules():
    s = ScheduleState(total_num_steps=1000, warmup_num_steps=100, last_batch_iteration=499)
    target = place_schedule(s, 500, ScheduleRule(kind="target", constant_op=2.5, rewarm_steps=20))
    assert target.last_batch_iteration == 200 and target.rewarm_start == 500
    assert target.ratio(500) == pytest.approx(warmup_cosine_ratio(200, 1000, 100) / 20)
    assert target.ratio(519) == pytest.approx(warmup_cosine_ratio(200, 1000, 100))
    assert place_schedule(s, 500, ScheduleRule()).last_batch_iteration == 499
    rewound = place_schedule(s, 500, ScheduleRule(kind="rewind"))
    assert rewound.ratio(500) == pytest.approx(1.0, abs=1e-4)
    with pytest.raises(GrowthError, match="unknown schedule rule"):
        ScheduleRule(kind="restart")


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
