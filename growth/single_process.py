"""TrainingState <-> the model, torch AdamW and DeepSpeed WarmupCosineLR of a single process (no engine), so growth
can be tested without DeepSpeed's runtime. The scheduler class is imported lazily from deepspeed.

Param groups follow growlm's training loop: 2-D weights with weight decay, everything else (biases, LayerNorms)
without.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from growth.errors import GrowthError
from growth.schedule import REWARM_FLOOR_ATTR, ScheduleState
from growth.state import TrainingState
from growth.stores import DictStore, ModuleStore
from model.gpt import GPT
from runtime.engine import param_groups  # the engine's AdamW groups, so both train alike


def make_optimizer(model: torch.nn.Module, hparams: dict[str, Any]) -> torch.optim.AdamW:
    """torch AdamW over ``param_groups`` with lr (peak), betas, eps, weight_decay from ``hparams``."""
    hp = dict(hparams)
    wd = hp.pop("weight_decay", 0.0)
    return torch.optim.AdamW(param_groups(model, wd), **hp)


def make_scheduler(optimizer: torch.optim.Optimizer, sched: ScheduleState, adam_step: int) -> Any:
    """A DeepSpeed WarmupCosineLR at ``sched``'s position, with the LR of the next step (re-warm included) already
    set in the optimizer's groups. The optimizer's group lr must be the peak LR when this is called."""
    from deepspeed.runtime.lr_schedules import WarmupCosineLR

    peaks = [g["lr"] for g in optimizer.param_groups]
    scheduler = WarmupCosineLR(optimizer, **sched.scheduler_kwargs())
    setattr(scheduler, REWARM_FLOOR_ATTR, sched.rewarm_floor)
    ratio = sched.ratio(adam_step)
    for g, peak in zip(optimizer.param_groups, peaks, strict=True):
        g["lr"] = peak * ratio
    return scheduler


def from_modules(
    model: GPT,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    *,
    schedule: ScheduleState | None = None,
    loss_scaler: dict[str, Any] | None = None,
    consumed_samples: int = 0,
    rng: Any = None,
) -> TrainingState:
    """Read a TrainingState from a model, its AdamW (after at least one step, or with no state: zero moments) and
    optionally its WarmupCosineLR (whose ``last_batch_iteration`` and arguments are read; re-warm fields are taken
    from ``schedule`` when given).

    Raises:
        GrowthError: parameters disagree on Adam's step.
    """
    steps = {int(st["step"]) for st in optimizer.state.values() if "step" in st}
    if len(steps) > 1:
        raise GrowthError(f"parameters are at different Adam steps {sorted(steps)}; growlm needs one step counter")
    store = ModuleStore(model, optimizer)
    params = DictStore()
    for name in store.names():
        params.write(name, store.read(name))
    g0 = optimizer.param_groups[0]
    hp = {"lr": getattr(scheduler, "org_lrs", [g0["lr"]])[0], "betas": g0["betas"], "eps": g0["eps"]}
    hp["weight_decay"] = max(g["weight_decay"] for g in optimizer.param_groups)
    if scheduler is not None:
        rewarm = (schedule.rewarm_start, schedule.rewarm_steps) if schedule is not None else (-1, 0)
        floor = schedule.rewarm_floor if schedule is not None else 0.0
        schedule = replace(ScheduleState.of_scheduler(scheduler, *rewarm), rewarm_floor=floor)
    return TrainingState(
        config=model.config,
        params=params.params,
        adam_step=steps.pop() if steps else 0,
        optimizer=hp,
        schedule=schedule,
        loss_scaler=loss_scaler,
        consumed_samples=consumed_samples,
        rng=rng,
        masks=model.growth_masks,
    )


def to_modules(state: TrainingState, dtype: torch.dtype = torch.float32) -> tuple[GPT, torch.optim.AdamW, Any]:
    """Build (model, AdamW, WarmupCosineLR or None) holding ``state``: weights, moments and step in every
    parameter's optimizer state, masks at the ramp value of ``state.adam_step`` (removed if it is 1), and the LR of
    the next step set in the optimizer."""
    model = GPT(state.config, masks=state.masks).to(dtype)
    model.set_growth_step(state.adam_step)
    optimizer = make_optimizer(model, state.optimizer)
    store = ModuleStore(model, optimizer, step=state.adam_step)
    for name in store.names():
        store.write(name, state.params[name])
    scheduler = None if state.schedule is None else make_scheduler(optimizer, state.schedule, state.adam_step)
    return model, optimizer, scheduler
