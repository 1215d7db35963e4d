"""Growth in one process, without DeepSpeed's runtime: ``TrainingState`` (everything a growth carries, as full fp32
tensors), ``grow_state`` (the whole-state growth through the same preparation and rules as live and offline growth),
and the conversion to and from a model + torch AdamW + DeepSpeed WarmupCosineLR (``from_modules``, ``to_modules``).
Used by the operator tests, the operator benchmarks and the dynamics harness (eval.bench.dynamics). The scheduler
class is imported lazily from deepspeed (it selects an accelerator at import).

Param groups follow growlm's training loop (``runtime.engine.param_groups``): 2-D weights (matrices, embeddings, an
untied Llama lm_head) with weight decay, everything else (biases, LayerNorm and RMSNorm gains) without. Both model
families (GPT-2 and Llama, ``model.registry.build_model``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from growlm.growth.errors import GrowthError
from growlm.growth.ops.apply import OptimizerPolicy, apply_rules
from growlm.growth.ops.preparation import check_ramp_done, prepare_growth
from growlm.growth.ops.rules import RuleSet, check_rules, param_shapes
from growlm.growth.ops.schedule_rule import ScheduleRule
from growlm.growth.ops.stores import DictStore, ModuleStore, ParamState
from growlm.model.config import ModelConfig
from growlm.model.masks import GrowthMaskedModel, MaskSpec
from growlm.model.registry import build_model
from growlm.runtime.engine import param_groups  # the engine's AdamW groups, so both train alike
from growlm.runtime.schedule import REWARM_FLOOR_ATTR, ScheduleState


def default_optimizer() -> dict[str, Any]:
    """AdamW hyperparameters of a TrainingState built without an optimizer (lr, betas, eps, weight decay)."""
    return {"lr": 6e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}


@dataclass
class TrainingState:
    """The training state of one model (GPT-2 or Llama), independent of how it is stored or sharded.

    A different thing from runtime.run_state.RunState: this holds the tensors (weights, Adam moments) in one process
    for the growth operators; RunState is the small JSON record stored beside a DeepSpeed checkpoint's shards. Where
    they overlap they use the same types: config / RunState.model_config (ModelConfig), schedule (ScheduleState), masks
    / RunState.growth_masks (MaskSpec), consumed_samples.

    params: name -> (weight, exp_avg, exp_avg_sq), fp32, full tensors of the parameter's shape (the transformers
        class's names and layouts: GPT-2 Conv1D (in, out), Llama nn.Linear (out, in)).
    adam_step: optimizer steps taken (Adam's bias-correction step; the same for every parameter).
    optimizer: AdamW hyperparameters (lr is the peak LR; betas, eps, weight_decay).
    schedule: WarmupCosineLR position and re-warm (runtime.schedule.ScheduleState), or None for a constant LR.
    loss_scaler: fp16 loss-scaler state, opaque (DeepSpeed DynamicLossScaler: cur_scale, cur_iter, ...), or None.
    consumed_samples: training samples consumed so far (the data position; never replayed after growth).
    rng: RNG states, opaque (e.g. per rank: python, numpy, torch CPU/CUDA), or None.
    masks: growth masks of the model and their ramp (model.masks.MaskSpec), or None for a plain model.
    """

    config: ModelConfig
    params: dict[str, ParamState]
    adam_step: int = 0
    optimizer: dict[str, Any] = field(default_factory=default_optimizer)
    schedule: ScheduleState | None = None
    loss_scaler: dict[str, Any] | None = None
    consumed_samples: int = 0
    rng: Any = None
    masks: MaskSpec | None = None


def validate_growth(state: TrainingState, plan: RuleSet) -> None:
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
    check_rules(plan)


def grow_state(
    state: TrainingState,
    plan: RuleSet,
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
    apply_rules(plan, DictStore(state.params), DictStore(new_params), policy, release=release)
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


def make_optimizer(model: torch.nn.Module, hparams: dict[str, Any]) -> torch.optim.AdamW:
    """torch AdamW over ``param_groups`` with lr (peak), betas, eps, weight_decay from ``hparams``."""
    hp = dict(hparams)
    wd = hp.pop("weight_decay", 0.0)
    return torch.optim.AdamW(param_groups(model, wd), **hp)


def make_scheduler(optimizer: torch.optim.Optimizer, sched: ScheduleState, adam_step: int) -> Any:
    """A DeepSpeed WarmupCosineLR at ``sched``'s position, with the LR of the next step (re-warm included) already
    set in the optimizer's groups. The optimizer's group lr must be the peak LR when this is called."""
    from deepspeed.runtime.lr_schedules import WarmupCosineLR  # lazy: deepspeed picks its accelerator at import

    peaks = [g["lr"] for g in optimizer.param_groups]
    scheduler = WarmupCosineLR(optimizer, **sched.scheduler_kwargs())
    setattr(scheduler, REWARM_FLOOR_ATTR, sched.rewarm_floor)
    ratio = sched.ratio(adam_step)
    for g, peak in zip(optimizer.param_groups, peaks, strict=True):
        g["lr"] = peak * ratio
    return scheduler


def from_modules(
    model: GrowthMaskedModel,
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


def to_modules(
    state: TrainingState, dtype: torch.dtype = torch.float32
) -> tuple[GrowthMaskedModel, torch.optim.AdamW, Any]:
    """Build (model, AdamW, WarmupCosineLR or None) holding ``state``: the model of its config's family
    (``build_model``: GPT or Llama), weights, moments and step in every parameter's optimizer state, masks at the
    ramp value of ``state.adam_step`` (removed if it is 1), and the LR of the next step set in the optimizer."""
    model = build_model(state.config, masks=state.masks).to(dtype)
    model.set_growth_step(state.adam_step)
    optimizer = make_optimizer(model, state.optimizer)
    store = ModuleStore(model, optimizer, step=state.adam_step)
    for name in store.names():
        store.write(name, state.params[name])
    scheduler = None if state.schedule is None else make_scheduler(optimizer, state.schedule, state.adam_step)
    return model, optimizer, scheduler
