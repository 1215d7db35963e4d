"""LR schedule: DeepSpeed's WarmupCosineLR arithmetic, placement after growth and the re-warm."""

import math
from dataclasses import replace

import pytest
import torch

from growlm.growth.errors import GrowthError
from growlm.growth.ops.schedule_rule import ScheduleRule, place_schedule
from growlm.runtime.schedule import (
    FIRST_ITERATION,
    ScheduleError,
    ScheduleState,
    checkpoint_schedule,
    engine_schedule,
    rewarm_factor,
    start_schedule,
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


class _Engine:
    """The one attribute runtime.schedule's engine functions use."""

    def __init__(self, scheduler):
        self.lr_scheduler = scheduler


def _fresh_scheduler(warmup_type="linear", warmup=4, total=20, lr=1.0):
    from deepspeed.runtime.lr_schedules import WarmupCosineLR

    opt = torch.optim.AdamW([{"params": [torch.nn.Parameter(torch.zeros(1))]}, {"params": []}], lr=lr)
    return WarmupCosineLR(opt, total_num_steps=total, warmup_num_steps=warmup, warmup_type=warmup_type), opt


@pytest.mark.parametrize("warmup_type, first", [("linear", 1 / 4), ("log", math.log(2) / math.log(4))])
def test_a_fresh_schedule_trains_step_1_at_the_first_nonzero_warmup_value(warmup_type, first):
    sched, opt = _fresh_scheduler(warmup_type)
    assert sched.last_batch_iteration == -1 and opt.param_groups[0]["lr"] == 0.0  # DeepSpeed's start: LR 0
    assert warmup_cosine_ratio(0, 20, 4, warmup_type=warmup_type) == 0.0  # and its next position is 0 again
    assert start_schedule(_Engine(sched)) == pytest.approx(first)
    assert sched.last_batch_iteration == FIRST_ITERATION == 1
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([first, first])
    lrs = [opt.param_groups[0]["lr"]]
    for _ in range(3):  # the engine steps the scheduler after each optimizer step: step k trains at ratio(k)
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs == pytest.approx([warmup_cosine_ratio(k, 20, 4, warmup_type=warmup_type) for k in (1, 2, 3, 4)])
    assert start_schedule(_Engine(sched)) is None and sched.last_batch_iteration == 4  # a started one is left alone


def test_placement_never_goes_back_to_a_zero_lr_position():
    s = ScheduleState(total_num_steps=100, warmup_num_steps=10, last_batch_iteration=4)
    placed = place_schedule(s, 3, ScheduleRule(kind="target", constant_op=10.0, rewarm_steps=2))
    assert placed.last_batch_iteration == FIRST_ITERATION  # round(4 / 10) = 0 would train at LR 0
    assert placed.ratio(3) == pytest.approx(warmup_cosine_ratio(1, 100, 10) / 2) and placed.ratio(3) > 0


def test_engine_schedule_refuses_another_scheduler_and_checkpoint_schedule_reads_the_config():
    with pytest.raises(ScheduleError, match="WarmupCosineLR"):
        engine_schedule(_Engine(None))
    ds = {"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 50, "warmup_num_steps": 5}}}
    assert checkpoint_schedule(None, ds, 7) == ScheduleState(
        total_num_steps=50, warmup_num_steps=5, last_batch_iteration=7
    )
    saved = vars(ScheduleState(total_num_steps=80, warmup_num_steps=5, rewarm_start=3, rewarm_steps=2))
    assert checkpoint_schedule(saved, ds, 9) == ScheduleState(80, 5, 9, rewarm_start=3, rewarm_steps=2)
    assert checkpoint_schedule(None, {"scheduler": {"type": "WarmupLR"}}, 7) is None


def test_rewarm_from_current_starts_at_the_old_lr_not_at_1_over_r():
    """A regression: 'target' placement with a 20-step re-warm from zero trained the first post-growth step at 5% of the
    placed LR; rewarm_from='current' starts at the LR the run had (capped at the placed LR) and reaches the placed
    schedule after R steps."""
    s = ScheduleState(total_num_steps=240, warmup_num_steps=10, last_batch_iteration=81)
    before = s.ratio(80)
    zero = place_schedule(s, 80, ScheduleRule(kind="target", constant_op=1.8, rewarm_steps=20))
    cur = place_schedule(s, 80, ScheduleRule(kind="target", constant_op=1.8, rewarm_steps=20, rewarm_from="current"))
    base = replace(cur, rewarm_start=-1).ratio(80)
    assert zero.ratio(80) == pytest.approx(base / 20)
    assert cur.ratio(80) == pytest.approx(before + (base - before) / 20)  # f + (1 - f) / R, f = before / base
    assert cur.ratio(99) == pytest.approx(base) and cur.rewarm(99) == 1.0
    assert [rewarm_factor(j, 4, 0.5) for j in (-1, 0, 1, 3)] == [1.0, 0.625, 0.75, 1.0]
    later = place_schedule(s, 80, ScheduleRule(kind="target", constant_op=0.5, rewarm_steps=20, rewarm_from="current"))
    assert later.rewarm_floor == 1.0 and later.ratio(80) < before  # placed below the old LR: no re-warm at all
    with pytest.raises(GrowthError, match="rewarm_from"):
        ScheduleRule(rewarm_from="peak")
