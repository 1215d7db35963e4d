"""TrainingState: everything a growth carries, and ``grow_state``, the whole-state growth. Torch only.

Conversion to and from a single process's model + torch AdamW + WarmupCosineLR is in growth/single_process.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from growth.apply import OptimizerPolicy, apply_plan
from growth.errors import GrowthError
from growth.plan import GrowthPlan, check_plan, param_shapes
from growth.schedule import ScheduleRule, ScheduleState, place_schedule
from growth.stores import DictStore, ParamState
from model.config import GPTConfig
from model.masks import MaskSpec


def default_optimizer() -> dict[str, Any]:
    """AdamW hyperparameters of a TrainingState built without an optimizer (lr, betas, eps, weight decay)."""
    return {"lr": 6e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}


@dataclass
class TrainingState:
    """The training state of one GPT, independent of how it is stored or sharded.

    params: name -> (weight, exp_avg, exp_avg_sq), fp32, full tensors of the parameter's shape (HF (in, out)).
    adam_step: optimizer steps taken (Adam's bias-correction step; the same for every parameter).
    optimizer: AdamW hyperparameters (lr is the peak LR; betas, eps, weight_decay).
    schedule: WarmupCosineLR position and re-warm (growth.schedule.ScheduleState), or None for a constant LR.
    loss_scaler: fp16 loss-scaler state, opaque (DeepSpeed DynamicLossScaler: cur_scale, cur_iter, ...), or None.
    consumed_samples: training samples consumed so far (the data position; never replayed after growth).
    rng: RNG states, opaque (e.g. per rank: python, numpy, torch CPU/CUDA), or None.
    masks: growth masks of the model and their ramp (model.masks.MaskSpec), or None for a plain GPT-2.
    """

    config: GPTConfig
    params: dict[str, ParamState]
    adam_step: int = 0
    optimizer: dict[str, Any] = field(default_factory=default_optimizer)
    schedule: ScheduleState | None = None
    loss_scaler: dict[str, Any] | None = None
    consumed_samples: int = 0
    rng: Any = None
    masks: MaskSpec | None = None

    def ramp_value(self) -> float:
        """Current mask ramp value (1.0 when there are no masks)."""
        return 1.0 if self.masks is None else self.masks.value(self.adam_step)

    def to_dict(self) -> dict[str, Any]:
        """A torch.save-able dict (tensors, plain Python values)."""
        return {
            "config": self.config.to_dict(),
            "params": {k: tuple(v) for k, v in self.params.items()},
            "adam_step": self.adam_step,
            "optimizer": dict(self.optimizer),
            "schedule": None if self.schedule is None else vars(self.schedule).copy(),
            "loss_scaler": self.loss_scaler,
            "consumed_samples": self.consumed_samples,
            "rng": self.rng,
            "masks": None if self.masks is None else self.masks.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainingState:
        return cls(
            config=GPTConfig.from_dict(d["config"]),
            params={k: ParamState(*v) for k, v in d["params"].items()},
            adam_step=d["adam_step"],
            optimizer=d["optimizer"],
            schedule=None if d["schedule"] is None else ScheduleState(**d["schedule"]),
            loss_scaler=d["loss_scaler"],
            consumed_samples=d["consumed_samples"],
            rng=d["rng"],
            masks=None if d["masks"] is None else MaskSpec.from_dict(d["masks"]),
        )

    def save(self, path: str) -> None:
        """torch.save to ``path`` atomically (temporary file, then rename)."""
        tmp = f"{path}.tmp"
        torch.save(self.to_dict(), tmp)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str) -> TrainingState:
        return cls.from_dict(torch.load(path, weights_only=False))


def validate_growth(state: TrainingState, plan: GrowthPlan) -> None:
    """All checks of ``grow_state``, without touching the state.

    Raises:
        GrowthError: the plan starts from another shape, a mask ramp is still running, the state's parameters do not
            match its config, or the plan is malformed.
    """
    if plan.old != state.config:
        raise GrowthError(
            f"the plan grows {plan.old.shape_str()} but the state is {state.config.shape_str()}; "
            "build the plan from the state's config"
        )
    if state.masks is not None and state.ramp_value() < 1.0:
        raise GrowthError(
            f"a mask ramp is still running (value {state.ramp_value():.3f} at step {state.adam_step}, reaches 1 at "
            f"step {state.masks.end_step()}); grow again at step >= {state.masks.end_step()}"
        )
    expected = param_shapes(state.config)
    got = {k: tuple(v.weight.shape) for k, v in state.params.items()}
    if got != expected:
        bad = sorted(k for k in set(got) | set(expected) if got.get(k) != expected.get(k))
        raise GrowthError(f"state parameters do not match its config {state.config.shape_str()}: {bad[:5]}")
    check_plan(plan)


def grow_state(
    state: TrainingState,
    plan: GrowthPlan,
    *,
    policy: OptimizerPolicy | None = None,
    schedule: ScheduleRule | None = None,
    ramp_steps: int | None = None,
    release: bool = False,
) -> TrainingState:
    """The training state of the grown model (DESIGN.md 3.3): parameters and Adam moments by the plan's rules and
    ``policy``; Adam step carried; LR schedule placed by ``schedule`` (default: continue); loss scaler, consumed
    samples and RNG carried unchanged; masks (masked family) start their ramp now (at ``adam_step``) and run for
    ``ramp_steps`` (default: the plan's). With ``release`` the old state's tensors are freed as they are consumed
    (the old state is unusable afterwards; peak memory about one model, not two).

    Raises:
        GrowthError: see ``validate_growth``; all checks run before any tensor is touched.
    """
    validate_growth(state, plan)
    masks = None
    if plan.masks is not None:
        masks = replace(plan.masks, start_step=state.adam_step, ramp_steps=ramp_steps or plan.masks.ramp_steps)
    sched = state.schedule
    if sched is not None:
        sched = place_schedule(sched, state.adam_step, schedule or ScheduleRule())
    new_params: dict[str, ParamState] = {}
    apply_plan(plan, DictStore(state.params), DictStore(new_params), policy, release=release)
    return TrainingState(
        config=plan.new,
        params=new_params,
        adam_step=state.adam_step,
        optimizer=dict(state.optimizer),
        schedule=sched,
        loss_scaler=None if state.loss_scaler is None else dict(state.loss_scaler),
        consumed_samples=state.consumed_samples,
        rng=state.rng,
        masks=masks,
    )
