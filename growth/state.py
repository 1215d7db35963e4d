"""TrainingState: everything a growth carries, and ``grow_state``, the whole-state growth. Torch only.

Conversion to and from a single process's model + torch AdamW + WarmupCosineLR is in growth/single_process.py.
"""

from __future__ import annotations

import pickle
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from growth.apply import OptimizerPolicy, apply_plan
from growth.errors import GrowthError
from growth.plan import GrowthPlan, check_plan, param_shapes
from growth.prepare import check_ramp_done, prepare_growth
from growth.schedule import ScheduleRule, ScheduleState
from growth.stores import DictStore, ParamState
from model.config import GPTConfig
from model.masks import MaskSpec
from runtime.atomic import atomic_path


def default_optimizer() -> dict[str, Any]:
    """AdamW hyperparameters of a TrainingState built without an optimizer (lr, betas, eps, weight decay)."""
    return {"lr": 6e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}


@dataclass
class TrainingState:
    """The training state of one GPT, independent of how it is stored or sharded.

    A different thing from runtime.run_state.RunState: this holds the tensors (weights, Adam moments) in one process
    for the growth operators; RunState is the small JSON record stored beside a DeepSpeed checkpoint's shards. Where
    they overlap they use the same types: config / RunState.model_config (GPTConfig), schedule (ScheduleState), masks
    / RunState.growth_masks (MaskSpec), consumed_samples.

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
        """torch.save ``to_dict()`` to ``path`` atomically (runtime.atomic; an existing file is replaced). ``rng``
        must hold only tensors and plain values (as runtime.checkpoint.rng_state does) for ``load`` to read it."""
        with atomic_path(path, overwrite=True) as tmp:
            torch.save(self.to_dict(), tmp)

    @classmethod
    def load(cls, path: str) -> TrainingState:
        """Read what ``save`` wrote, with ``torch.load(weights_only=True)``: tensors and plain values only.

        Raises:
            GrowthError: the file holds any other pickled object (nothing of it is executed), or is damaged.
        """
        try:
            return cls.from_dict(torch.load(path, map_location="cpu", weights_only=True))
        except (pickle.UnpicklingError, RuntimeError, EOFError) as e:
            found = re.search(r"GLOBAL ([\w.]+)", str(e))
            first = f"it names {found.group(1)}" if found else f"{type(e).__name__}: {str(e)[:200]}"
            raise GrowthError(
                f"{path}: refusing to load it as a TrainingState: it is damaged or holds pickled objects other than "
                f"tensors and plain values ({first})"
            ) from None


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
    check_ramp_done(state.masks, state.adam_step)
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
    """The training state of the grown model (DESIGN.md, "What growth carries"): parameters and Adam moments by the
    plan's rules and ``policy``; Adam step carried; LR schedule placed by ``schedule`` (default: continue); loss scaler,
    consumed samples and RNG carried unchanged; masks (masked family) start their ramp now (at ``adam_step``) and run
    for ``ramp_steps`` (default: the plan's). With ``release`` the old state's tensors are freed as they are consumed
    (the old state is unusable afterwards; peak memory about one model, not two).

    Raises:
        GrowthError: see ``validate_growth``; all checks run before any tensor is touched.
    """
    validate_growth(state, plan)
    prep = prepare_growth(
        plan,
        state.config,
        state.adam_step,
        masks=state.masks,
        schedule=state.schedule,
        rule=schedule or ScheduleRule(),
        ramp_steps=ramp_steps,
    )
    new_params: dict[str, ParamState] = {}
    apply_plan(plan, DictStore(state.params), DictStore(new_params), policy, release=release)
    return TrainingState(
        config=plan.new,
        params=new_params,
        adam_step=state.adam_step,
        optimizer=dict(state.optimizer),
        schedule=prep.schedule,
        loss_scaler=None if state.loss_scaler is None else dict(state.loss_scaler),
        consumed_samples=state.consumed_samples,
        rng=state.rng,
        masks=prep.masks,
    )
