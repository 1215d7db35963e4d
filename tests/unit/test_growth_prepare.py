"""growth.ops.preparation: the one growth preparation that live, offline and single-process growth share."""

from dataclasses import replace

import pytest

from growlm.growth.errors import GrowthError
from growlm.growth.ops import make_rules
from growlm.growth.ops.preparation import prepare_growth
from growlm.growth.ops.schedule_rule import ScheduleRule
from growlm.model.config import GPTConfig
from growlm.runtime.schedule import ScheduleState, warmup_cosine_ratio

OLD = GPTConfig(n_layer=1, n_embd=32, n_head=2, n_positions=16, vocab_size=97)
DEEPER = replace(OLD, n_layer=2)
SCHED = ScheduleState(total_num_steps=100, warmup_num_steps=10, last_batch_iteration=21)


def test_masks_start_at_the_growth_step_and_the_schedule_is_placed():
    plan = make_rules(OLD, DEEPER, "masked", ramp_steps=5)
    rule = ScheduleRule(kind="target", constant_op=2.0, rewarm_steps=4)
    prep = prepare_growth(plan, OLD, 20, masks=None, schedule=SCHED, rule=rule, ramp_steps=8)
    assert (prep.masks.start_step, prep.masks.ramp_steps) == (20, 8)  # ramp_steps overrides the plan's 5
    assert prep.masks.value(20) == 0.0 and prep.masks.value(28) == 1.0
    assert prep.schedule.last_batch_iteration == round(21 / 2.0) == 10
    assert (prep.schedule.rewarm_start, prep.schedule.rewarm_steps) == (20, 4)
    assert prep.schedule.ratio(20) == pytest.approx(warmup_cosine_ratio(10, 100, 10) / 4)
    assert prep.schedule_changed and prep.step == 20
    same = prepare_growth(plan, OLD, 20, masks=None, schedule=SCHED, rule=ScheduleRule())  # continue, no re-warm
    assert same.schedule == SCHED and not same.schedule_changed and same.masks.ramp_steps == 5


def test_duplication_has_no_masks_and_no_schedule_is_fine_when_the_rule_keeps_it():
    prep = prepare_growth(make_rules(OLD, DEEPER, "duplicate"), OLD, 3, masks=None, schedule=None, rule=ScheduleRule())
    assert prep.masks is None and prep.schedule is None and not prep.schedule_changed


def test_refusals():
    plan = make_rules(OLD, DEEPER, "masked", ramp_steps=5)
    ramping = plan.masks  # an earlier growth's masks, ramp of 5 steps
    with pytest.raises(GrowthError, match=r"mask ramp is still running \(value 0.400 at step 12, reaches 1 at step 15"):
        prepare_growth(plan, OLD, 12, masks=replace(ramping, start_step=10), schedule=SCHED, rule=ScheduleRule())
    # a finished ramp does not block the next growth
    prepare_growth(plan, OLD, 15, masks=replace(ramping, start_step=10), schedule=SCHED, rule=ScheduleRule())
    with pytest.raises(GrowthError, match="the plan grows"):
        prepare_growth(plan, DEEPER, 3, masks=None, schedule=SCHED, rule=ScheduleRule())
    with pytest.raises(GrowthError, match="needs a WarmupCosineLR"):
        prepare_growth(plan, OLD, 3, masks=None, schedule=None, rule=ScheduleRule(rewarm_steps=2))
    with pytest.raises(GrowthError, match="total_num_steps=5 < warmup_num_steps=10"):
        prepare_growth(plan, OLD, 3, masks=None, schedule=SCHED, rule=ScheduleRule(kind="target", total_num_steps=5))
