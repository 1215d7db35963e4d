"""The one growth preparation, shared by every growth path: live growth (growth.live.grow.grow_engine, fired by the
training loop's stage trigger), offline growth (growth.offline.pipeline.grow_checkpoint, the growlm-grow command) and
the
single-process state (growth.ops.single_process.grow_state).

It makes every check a growth needs before any tensor is touched, and decides what the grown model starts with
besides its parameters: the growth masks (masked family) and the LR schedule placed by the stage's rule. The paths
differ only in where the parameters live (an engine, universal-checkpoint folders, a dict), which growth.ops.apply's
stores hide.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from growlm.growth.errors import GrowthError
from growlm.growth.ops.rules import RuleSet, check_rules, ramp_length
from growlm.growth.ops.schedule_rule import ScheduleRule, place_schedule
from growlm.model.config import ModelConfig
from growlm.model.masks import MaskSpec
from growlm.runtime.schedule import ScheduleState


@dataclass(frozen=True)
class GrowthPrep:
    """What a growth at optimizer step ``step`` starts the grown model with.

    plan: the per-parameter growth plan (checked against the current shape).
    masks: the grown model's growth masks, their ramp starting at ``step`` (None: no masks, e.g. duplication).
    schedule: the LR schedule placed by the stage's rule (``ratio(step)`` is the first post-growth step's LR / peak
        LR), or None when the run has no WarmupCosineLR and the rule leaves the schedule alone.
    schedule_changed: the placement moved the schedule or starts a re-warm (False: the LR continues as it was).
    """

    plan: RuleSet
    step: int
    masks: MaskSpec | None
    schedule: ScheduleState | None
    schedule_changed: bool


def same_shape(a: ModelConfig, b: ModelConfig) -> bool:
    """Whether two configs give the same parameter shapes: the same family and everything but dropout equal."""
    return a.arch == b.arch and replace(a, dropout=0.0) == replace(b, dropout=0.0)


def check_ramp_done(masks: MaskSpec | None, step: int) -> None:
    """Refuse to grow while a mask ramp of an earlier growth still runs (its masks would be lost).

    Raises:
        GrowthError: ``masks`` is not None and its ramp value at ``step`` is below 1.
    """
    if masks is not None and masks.value(step) < 1.0:
        end = masks.end_step()
        raise GrowthError(
            f"a mask ramp is still running (value {masks.value(step):.3f} at step {step}, reaches 1 at step {end}); "
            f"grow again at step >= {end}"
        )


def rule_moves_schedule(rule: ScheduleRule) -> bool:
    """Whether ``rule`` changes the LR schedule at all ('continue' without re-warm or new lengths does not)."""
    return bool(rule.kind != "continue" or rule.rewarm_steps or rule.total_num_steps or rule.warmup_num_steps)


def prepare_growth(
    plan: RuleSet,
    current: ModelConfig,
    step: int,
    *,
    masks: MaskSpec | None,
    schedule: ScheduleState | None,
    rule: ScheduleRule,
    ramp_steps: int | None = None,
) -> GrowthPrep:
    """Check a growth of a model of shape ``current`` at optimizer step ``step`` and decide its masks and schedule.

    Args:
        plan: the stage's per-parameter plan (growth.ops.make_rules / growth.stages.plan.Stage.plan).
        current: the shape being grown (the engine's, the checkpoint's or the state's config).
        step: optimizer steps taken so far (the growth happens before step ``step + 1``).
        masks: the current model's masks (None when it has none or their ramp has ended).
        schedule: the current LR schedule (a WarmupCosineLR with its position and re-warm), or None without one.
        rule: where the LR schedule goes (growth.ops.schedule_rule.ScheduleRule).
        ramp_steps: the new masks' ramp length in optimizer steps (default: the plan's, ``ramp_length``: its
            ramp_frac of the steps the LR schedule has left, or its fixed ramp_steps without a schedule).

    Returns:
        GrowthPrep.

    Raises:
        GrowthError: the plan grows another shape; a mask ramp is still running; a grown parameter would get another
            shape than the grown config's; the new masks do not fit the grown config; the rule moves the schedule
            but there is no WarmupCosineLR schedule; the target schedule is shorter than its warm-up.
    """
    if not same_shape(plan.old, current):
        raise GrowthError(
            f"the plan grows {plan.old.shape_str()} but the model is {current.shape_str()}; "
            "build the plan from the model's config"
        )
    check_ramp_done(masks, step)
    check_rules(plan)  # every grown parameter gets the grown config's shape (meta tensors, no memory)
    new_masks = None
    if plan.masks is not None:
        placed = place_schedule(schedule, step, rule) if schedule is not None else None
        remaining = None if placed is None else max(1, placed.total_num_steps - placed.last_batch_iteration)
        new_masks = replace(plan.masks, start_step=step, ramp_steps=ramp_steps or ramp_length(plan, remaining))
        try:
            new_masks.check(plan.new)
        except ValueError as e:
            raise GrowthError(f"the growth masks do not fit {plan.new.shape_str()}: {e}") from e
    moves = rule_moves_schedule(rule)
    if schedule is None:
        if moves:
            raise GrowthError(
                f"schedule rule {rule.kind!r} with re-warm {rule.rewarm_steps} needs a WarmupCosineLR scheduler in "
                "the DeepSpeed config; use kind 'continue'"
            )
        return GrowthPrep(plan, step, new_masks, None, False)
    placed = place_schedule(schedule, step, rule)
    return GrowthPrep(plan, step, new_masks, placed, moves and (placed != schedule or rule.rewarm_steps > 0))
