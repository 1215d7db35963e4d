"""DeepSpeed engine construction for growlm's models (GPT-2 and Llama), and the few read-outs of an engine that
need its internals.

``build_engine`` is the one place a ``deepspeed.initialize`` is made, for a fresh run, a resumed run (the checkpoint
is loaded into it by runtime.checkpoint) and a live growth (growth.live.grow builds the grown engine with it).
deepspeed is imported lazily: runtime.dist.select_accelerator must run before its first import.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator
from typing import Any

import torch

from growlm.model.config import ModelConfig
from growlm.model.masks import MaskSpec
from growlm.model.registry import build_model, init_skipped
from growlm.runtime.dist import skip_shm_comm_op


def precision_of(ds_cfg: dict) -> str:
    """'fp16', 'bf16' or 'fp32', as enabled in a DeepSpeed config."""
    return (
        "fp16" if ds_cfg.get("fp16", {}).get("enabled") else "bf16" if ds_cfg.get("bf16", {}).get("enabled") else "fp32"
    )


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: matrices and embeddings (2-D) decay, biases and LayerNorm gains do not (same order as
    ``named_parameters``). A parameter built under ZeRO-3's ``zero.Init`` is an empty 1-D placeholder; its true
    shape is ``ds_shape``.

    Returns:
        ``[{"params": 2-D parameters, "weight_decay": weight_decay}, {"params": the rest, "weight_decay": 0.0}]``.
    """
    params = [p for _, p in model.named_parameters()]
    matrix = [len(getattr(p, "ds_shape", p.shape)) >= 2 for p in params]
    return [
        {"params": [p for p, m in zip(params, matrix, strict=True) if m], "weight_decay": weight_decay},
        {"params": [p for p, m in zip(params, matrix, strict=True) if not m], "weight_decay": 0.0},
    ]


BUILD_SPLIT = ("module", "zero3_partition", "optimizer", "engine_other")


def optimizer_for_device(ds_cfg: dict, device_type: str) -> dict:
    """The DeepSpeed config with the Adam implementation for ``device_type`` ("cuda" or "cpu").

    On CUDA, a ``torch_adam`` AdamW (the shipped configs) becomes torch's fused AdamW (``fused: true``): one kernel
    for the whole parameter list instead of the multi-tensor ``foreach`` kernels, and no op to compile (DeepSpeed's
    FusedAdam is built with nvcc on first use); the update is the same AdamW (Loshchilov and Hutter 2019). A config
    that names ``fused`` or ``foreach`` itself, or uses DeepSpeed's own Adam (``torch_adam`` false, CPU offload),
    is returned unchanged, as is every config on a CPU. The input is not modified.

    Returns:
        A new dict (a copy when something changed, else ``ds_cfg`` itself).
    """
    opt = ds_cfg.get("optimizer") or {}
    params = opt.get("params") or {}
    offload = ((ds_cfg.get("zero_optimization") or {}).get("offload_optimizer") or {}).get("device", "none")
    if device_type != "cuda" or not params.get("torch_adam") or "fused" in params or "foreach" in params:
        return ds_cfg
    if offload not in (None, "none"):  # the optimizer steps on the CPU
        return ds_cfg
    return {**ds_cfg, "optimizer": {**opt, "params": {**params, "fused": True}}}


TRAINING_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@contextlib.contextmanager
def _built_in_place(device: str, dtype: torch.dtype) -> Iterator[None]:
    """Create the module's parameters and buffers on ``device`` in floating dtype ``dtype`` (torch's default device
    and default dtype for the block; explicit dtypes, such as the float32 rotary frequencies, are kept).

    Used only when every weight is overwritten next (``build_engine(..., uninitialised=True)``), outside ZeRO-3 (whose
    ``zero.Init`` already creates each partition on the device in the training dtype). Otherwise the module would be
    built on the host in fp32 and then cast and moved by DeepSpeed (``_cast_module_mixed_precision``,
    ``module.to(device)``): 4 + 2 bytes per parameter at once on every rank's host, about 42 GB per rank (336 GB on an
    8-GPU node) for a 7B target. Built in place, DeepSpeed's cast and move find nothing to do and the host holds none of
    it."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


@contextlib.contextmanager
def _timed(cls: type, attr: str, sink: dict[str, float], key: str) -> Iterator[None]:
    """Add the wall seconds spent in ``cls.attr`` (a method, wrapped for the block only) to ``sink[key]``."""
    orig = cls.__dict__[attr]

    @functools.wraps(orig)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return orig(*args, **kwargs)
        finally:
            sink[key] = sink.get(key, 0.0) + time.perf_counter() - t

    setattr(cls, attr, wrapper)
    try:
        yield
    finally:
        setattr(cls, attr, orig)


def build_engine(
    cfg: ModelConfig,
    masks: MaskSpec | None,
    ds_config: dict,
    *,
    partitioned: bool = False,
    uninitialised: bool = False,
    activation_checkpointing: bool = False,
    compile_model: bool = False,
) -> Any:
    """A DeepSpeed engine for a freshly initialised model of shape ``cfg`` (``GPT`` or ``Llama``, by its arch; with
    ``masks``), AdamW groups as in ``param_groups`` (weight decay on matrices only, from the config's optimizer params).

    Args:
        cfg: the model shape.
        masks: growth masks of a masked-family growth still ramping, or None.
        ds_config: the DeepSpeed config dict (optimizer, scheduler, ZeRO stage, precision).
        partitioned: build the module inside ``deepspeed.zero.Init`` (ZeRO-3), so no rank ever holds it whole; its
            initial values are then not the family's init (zero.Init draws each partition on its own), which is
            fine when every parameter is written next, as growth does.
        uninitialised: every parameter is written right after (a live growth writes every parameter of the grown
            model, growth.ops.rules.check_rules): the module's initial weights are not drawn
            (``model.registry.init_skipped``: a parameter holds whatever ``torch.empty`` gave it) and, not
            partitioned, it is built directly on the rank's device in the config's training dtype
            (``_built_in_place``), never on the host. This saves the random draws of N(0, 0.02) over every weight
            and torch's throwaway init of lm_head and the embeddings (measured for the 208.7M-parameter GPT, 24 x
            768, on one rank: 0.41 s of normal_ and 0.44 s of kaiming_uniform_ out of an 8.5 s build) and the
            first touch of pages the growth overwrites anyway.
        activation_checkpointing: recompute each block's activations in backward (the model's
            ``activation_checkpointing``; a grown model's engine is built with the same setting, so new blocks get it
            too).
        compile_model: compile the module with torch.compile (DeepSpeed's ``engine.compile``); a grown model's
            engine is built, and so compiled, anew (on CUDA or the CPU; train.py refuses other accelerators).

    Returns:
        The ``deepspeed.DeepSpeedEngine`` (its ``lr_scheduler`` built from the config's scheduler section). Its
        attribute ``growlm_build_seconds`` splits the wall seconds of this call by ``BUILD_SPLIT``: ``module``
        (model construction and weight init), ``zero3_partition`` (zero.Init converting and partitioning the
        parameters, ZeRO-3 only), ``optimizer`` (DeepSpeed's optimizer: torch AdamW plus the ZeRO/bf16 wrapper
        with its flat fp16/bf16 and fp32 partitions and gradient buffers), ``engine_other`` (the rest of
        ``deepspeed.initialize``: config, module placement, hooks, scheduler).
    """
    import deepspeed  # lazy: deepspeed picks its accelerator at import
    from deepspeed.accelerator import get_accelerator  # lazy: deepspeed picks its accelerator at import
    from deepspeed.runtime.engine import DeepSpeedEngine  # lazy: deepspeed picks its accelerator at import

    skip_shm_comm_op()  # when deepspeed.initialize starts the process group itself (no init_distributed)
    ds_config = optimizer_for_device(ds_config, get_accelerator().device_name())
    weight_decay = ds_config.get("optimizer", {}).get("params", {}).get("weight_decay", 0.0)
    split: dict[str, float] = dict.fromkeys(BUILD_SPLIT, 0.0)
    t = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if uninitialised:  # every weight is written next: no init draws
            stack.enter_context(init_skipped())
        if partitioned:
            stack.enter_context(_timed(deepspeed.zero.Init, "_post_init_method", split, "zero3_partition"))
            stack.enter_context(deepspeed.zero.Init(config_dict_or_path=ds_config))
        elif uninitialised:  # and no host copy, no fp32 copy (_built_in_place)
            device, dtype = get_accelerator().current_device_name(), TRAINING_DTYPES[precision_of(ds_config)]
            stack.enter_context(_built_in_place(device, dtype))
        model = build_model(cfg, masks, activation_checkpointing=activation_checkpointing)
    split["module"] = time.perf_counter() - t - split["zero3_partition"]
    t = time.perf_counter()
    with _timed(DeepSpeedEngine, "_configure_optimizer", split, "optimizer"):
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=param_groups(model, weight_decay), config=ds_config
        )
    split["engine_other"] = time.perf_counter() - t - split["optimizer"]
    if compile_model:
        # torch.compile of the module, traced at its first forward. Dynamo caches on the code objects that every
        # model of a family shares, so a grown model would count as a recompile of the old one (and after the
        # recompile limit run eager): the caches of the discarded model go first.
        torch.compiler.reset()
        engine.compile()
    engine.growlm_build_seconds = split
    return engine


def inner_optimizer(engine: Any) -> torch.optim.Optimizer:
    """The torch optimizer under DeepSpeed's wrappers (ZeRO, bf16): the one holding Adam's state tensors.

    Raises:
        TypeError: no ``torch.optim.Optimizer`` is reachable through ``.optimizer`` attributes.
    """
    opt = engine.optimizer
    while not isinstance(opt, torch.optim.Optimizer):
        if not hasattr(opt, "optimizer"):
            raise TypeError(f"cannot find the torch optimizer inside {type(engine.optimizer).__name__}")
        opt = opt.optimizer
    return opt


def fp32_master_is_separate(engine: Any) -> bool | None:
    """Whether the engine's ZeRO optimizer keeps its fp32 master partitions in storage of their own, beside the
    working (lp) partitions: what runtime.memory's fp32 bytes per parameter assume at ZeRO-1/2/3 (K = 12). ZeRO-3 is
    meant to share them for fp32 weights on the same device, but its test compares a device with a string and never
    matches in the DeepSpeed versions growlm is tested with; this reads the truth of a live engine. None for an
    engine without a ZeRO optimizer (stage 0)."""
    opt = engine.optimizer
    if hasattr(opt, "fp32_partitioned_groups_flat"):  # ZeRO-3
        pairs = zip(opt.fp32_partitioned_groups_flat, opt.fp16_partitioned_groups_flat, strict=False)
    elif hasattr(opt, "single_partition_of_fp32_groups"):  # ZeRO-1/2
        pairs = zip(opt.single_partition_of_fp32_groups, opt.bit16_groups_flat, strict=False)
    else:
        return None
    ptr = lambda t: t.untyped_storage().data_ptr()  # noqa: E731
    return all(ptr(master) != ptr(lp) for master, lp in pairs if master.numel())


def loss_scale_of(engine: Any) -> float:
    """Current fp16 dynamic loss scale of ``engine`` (1.0 for bf16/fp32, which scale nothing)."""
    for obj in (engine.optimizer, getattr(engine.optimizer, "loss_scaler", None)):
        for attr in ("cur_scale", "loss_scale"):
            value = getattr(obj, attr, None)
            if isinstance(value, (int, float)) or torch.is_tensor(value):
                return float(value)
    return 1.0


def repair_adam_steps(engine: Any) -> int:
    """Give every Adam state entry of ``engine``'s inner torch optimizer its own step counter (same value), kept where
    the optimizer's kernel reads it. Call after every load of optimizer state (native, universal or grown checkpoint)
    and after a live growth, before the next optimizer step.

    DeepSpeed 0.19's ZeRO-3 universal loader (``load_hp_checkpoint_state_from_checkpoint_dir_stage3``) puts ONE
    ``state['step']`` tensor object into every parameter group. torch's AdamW increments each group's step in place,
    so a shared tensor advances once per group per optimizer step: with G groups it gains G per step, every group
    after the first runs with a step that is too high by a gap growing each step (a wrong bias correction
    1 - beta^t), and the inflated counter is saved again. The value right
    after a load is the saved one and is kept; only the sharing is undone. (DeepSpeed's bf16 optimizer at ZeRO
    stage 0 legitimately counts one step more than the engine's global step, so the value is not reset to it.)

    The universal loaders (ZeRO 1-3) also write the saved step and param-group settings directly, past torch's
    ``load_state_dict``: the step stays the CPU tensor it was saved as and the group takes the saved ``fused``
    flag. For an optimizer built fused (``optimizer_for_device`` on CUDA) each group gets its ``fused`` setting back
    and each step moves to its parameter's device as float32 (``growth.ops.stores.adam_step_tensor``), where the
    fused kernel reads it.

    Args:
        engine: a DeepSpeed engine (any ZeRO stage; torch Adam/AdamW tensor steps or DeepSpeed's integer steps).

    Returns:
        The number of state entries that got their own counter (0 when none was shared).
    """
    opt = inner_optimizer(engine)
    fused = bool(opt.defaults.get("fused"))
    on_device = fused or bool(opt.defaults.get("capturable"))
    if fused:
        for group in opt.param_groups:
            group["fused"], group["foreach"] = True, False
    seen: set[int] = set()
    repaired = 0
    for p, st in opt.state.items():
        step = st.get("step")
        if not torch.is_tensor(step):
            continue  # DeepSpeed's fused/CPU Adam keep a plain int, never shared
        shared = id(step) in seen
        seen.add(id(step))
        if shared:
            st["step"] = step = step.detach().clone()
            repaired += 1
        if on_device and (step.device != p.device or step.dtype != torch.float32):
            st["step"] = step = step.detach().to(p.device, torch.float32)
        seen.add(id(step))
    return repaired


def release_engine(engine: Any) -> None:
    """Tear down a DeepSpeed engine that will not be used again, so that it, its module and its optimizer are freed
    as soon as the caller drops its own references (and, for the cycles DeepSpeed builds, at the next
    ``gc.collect()``). Call it for the engine a live growth replaces and at the end of a run; not a collective.

    What held a finished ZeRO-3 engine alive (DeepSpeed 0.19): ``DeepSpeedZeRoOffload.setup_zero_stage3_hooks``
    appends the top module to the module-level list ``deepspeed.runtime.zero.parameter_offload.FWD_MODULE_STACK``
    and nothing ever removes it. From that global the module reaches everything else: its ``pre_bwd_fn`` /
    ``post_bwd_fn`` autograd Function classes, whose closures capture the ``DeepSpeedZeRoOffload``; its
    parameters, whose ZeRO attributes reach the ZeRO-3 optimizer; the optimizer's backward-hook state, whose
    ``_backward_post_hook`` is a bound method of the engine. Every other reference among these is a cycle that
    ``gc.collect()`` frees, so removing the module (and any of its submodules a failed forward left there) from
    that list is what frees the engine. ZeRO-0/1/2 never touch the list.

    Steps: ``engine.destroy()`` (ZeRO-3 module hooks, gradient hooks), clear the forward/backward hooks DeepSpeed
    left on every submodule (so none can fire again or hold a closure), drop the per-module backward Function
    classes, take the module's submodules out of ``FWD_MODULE_STACK``, and drop the ZeRO-3 attributes of every
    parameter (their closures hold the ``zero.Init`` context and through it the process group).

    Args:
        engine: a DeepSpeed engine of any ZeRO stage; it must not be used afterwards.
    """
    from deepspeed.runtime.zero import parameter_offload  # lazy: deepspeed picks its accelerator at import

    module = engine.module
    engine.destroy()
    owned = set()
    for m in module.modules():
        owned.add(id(m))
        for hooks in (m._forward_pre_hooks, m._forward_hooks, m._backward_hooks, m._backward_pre_hooks):
            hooks.clear()
        for attr in ("pre_bwd_fn", "post_bwd_fn"):
            m.__dict__.pop(attr, None)
    stack = parameter_offload.FWD_MODULE_STACK
    stack[:] = [m for m in stack if id(m) not in owned]  # in place: DeepSpeed code holds this very list
    # ZeRO-3 attaches closures (all_gather, partition, ...) to every parameter that capture the ``zero.Init`` context,
    # which holds the data-parallel process group; the parameters can outlive the engine (autograd keeps some), and
    # through them the group would outlive destroy_process_group with its worker threads (runtime.dist)
    for param in module.parameters(recurse=True):
        if hasattr(param, "ds_id"):
            param.__dict__.clear()
