"""DeepSpeed engine construction for growlm's GPT, and the few read-outs of an engine that need its internals.

``build_engine`` is the one place a ``deepspeed.initialize`` is made, for a fresh run, a resumed run (the checkpoint
is loaded into it by runtime.checkpoint) and a live growth (growth.live.engine builds the grown engine with it).
deepspeed is imported lazily: runtime.dist.select_accelerator must run before its first import.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import functools
import inspect
import json
import logging
import math
import time
from collections.abc import Iterator, KeysView
from typing import Any

import torch

from growlm.model.config import GPTConfig
from growlm.model.gpt import GPT
from growlm.model.masks import MaskSpec
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


@contextlib.contextmanager
def weights_uninitialised() -> Iterator[None]:
    """Build modules without drawing their initial weights: ``GPT.reset_parameters`` and the ``reset_parameters``
    of ``torch.nn.Linear``, ``Embedding`` and ``LayerNorm`` do nothing inside this block (restored on exit), so a
    parameter holds whatever ``torch.empty`` gave it. Only for a module whose every parameter is written right after
    (a live growth writes every parameter of the grown model, growth.ops.rules.check_rules): it saves the random draws
    of N(0, 0.02) over every weight and torch's own throwaway init of lm_head (a (V, d) kaiming_uniform_ replaced
    by the tied embedding right after) and of the embeddings; measured for the 208.7M-parameter GPT (24 x 768) on
    one rank: 0.41 s of normal_ and 0.44 s of kaiming_uniform_ out of an 8.5 s build, and the first touch of pages
    that the growth overwrites anyway."""
    targets = [GPT, torch.nn.Linear, torch.nn.Embedding, torch.nn.LayerNorm]
    saved = [(cls, cls.__dict__["reset_parameters"]) for cls in targets]
    for cls, _ in saved:
        cls.reset_parameters = lambda self: None
    try:
        yield
    finally:
        for cls, fn in saved:
            cls.reset_parameters = fn


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
    cfg: GPTConfig,
    masks: MaskSpec | None,
    ds_config: dict,
    *,
    partitioned: bool = False,
    activation_checkpointing: bool = False,
    compile_model: bool = False,
) -> Any:
    """A DeepSpeed engine for a freshly initialised GPT of shape ``cfg`` (with ``masks``), AdamW groups as in
    ``param_groups`` (weight decay on matrices only, from the config's optimizer params).

    Args:
        cfg: the model shape.
        masks: growth masks of a masked-family growth still ramping, or None.
        ds_config: the DeepSpeed config dict (optimizer, scheduler, ZeRO stage, precision).
        partitioned: build the module inside ``deepspeed.zero.Init`` (ZeRO-3), so no rank ever holds it whole; its
            initial values are then not GPT-2's init (zero.Init draws each partition on its own), which is fine when
            every parameter is written next, as growth does.
        activation_checkpointing: recompute each block's activations in backward (GPT's ``activation_checkpointing``;
            a grown model's engine is built with the same setting, so new blocks get it too).
        compile_model: compile the module with torch.compile (DeepSpeed's ``engine.compile``); a grown model's
            engine is built, and so compiled, anew. CUDA only (train.py refuses it elsewhere).

    Returns:
        The ``deepspeed.DeepSpeedEngine`` (its ``lr_scheduler`` built from the config's scheduler section). Its
        attribute ``growlm_build_seconds`` splits the wall seconds of this call by ``BUILD_SPLIT``: ``module``
        (GPT construction and weight init), ``zero3_partition`` (zero.Init converting and partitioning the
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
    if partitioned:
        with _timed(deepspeed.zero.Init, "_post_init_method", split, "zero3_partition"):
            with deepspeed.zero.Init(config_dict_or_path=ds_config):
                model = GPT(cfg, masks=masks, activation_checkpointing=activation_checkpointing)
    else:
        model = GPT(cfg, masks=masks, activation_checkpointing=activation_checkpointing)
    split["module"] = time.perf_counter() - t - split["zero3_partition"]
    t = time.perf_counter()
    with _timed(DeepSpeedEngine, "_configure_optimizer", split, "optimizer"):
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=param_groups(model, weight_decay), config=ds_config
        )
    split["engine_other"] = time.perf_counter() - t - split["optimizer"]
    if compile_model:
        # torch.compile of the module, traced at its first forward. Dynamo caches on the code objects that every
        # GPT shares, so a grown model would count as a recompile of the old one (and after the recompile limit
        # run eager): the caches of the discarded model go first.
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


# ----- the DeepSpeed config, checked for meaning before any rank starts ------------------------------------------


class DSConfigError(ValueError):
    """A DeepSpeed config that DeepSpeed would silently misread (an unknown key is ignored) or refuse only once the
    engine is being built (a traceback on every rank): one line naming the key, the value and the fix."""


class _KeyLog(dict):
    """A dict that records every key looked up in it: ``[]``, ``get``, ``in``, ``in .keys()``, ``pop``,
    ``setdefault``. ``copy.copy`` returns the dict itself, so a copy's look-ups are recorded too."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.looked_up: set = set()

    def __getitem__(self, key: Any) -> Any:
        self.looked_up.add(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self.looked_up.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.looked_up.add(key)
        return super().__contains__(key)

    def keys(self) -> Any:
        return KeysView(self)  # ``in`` goes through __contains__; set operations work as on dict keys

    def pop(self, key: Any, *default: Any) -> Any:
        self.looked_up.add(key)
        return super().pop(key, *default)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self.looked_up.add(key)
        return super().setdefault(key, default)

    def __copy__(self) -> _KeyLog:
        return self


@contextlib.contextmanager
def _deepspeed_config_probe(world_size: int) -> Iterator[None]:
    """Let ``deepspeed.runtime.config.DeepSpeedConfig`` run without a process group (its rank 0 of ``world_size``
    ranks) and without its log lines, for the block only."""
    from deepspeed.runtime import config as ds_config_module  # lazy: deepspeed picks its accelerator at import

    class _World:
        @staticmethod
        def get_rank() -> int:
            return 0

        @staticmethod
        def get_world_size(*_args: Any, **_kwargs: Any) -> int:
            return world_size

    saved_dist, logger = ds_config_module.dist, logging.getLogger("DeepSpeed")
    saved_level = logger.level
    ds_config_module.dist = _World
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        ds_config_module.dist = saved_dist
        logger.setLevel(saved_level)


def _read_keys(ds_cfg: dict, world_size: int) -> tuple[set, Exception | None]:
    """The top-level keys ``DeepSpeedConfig`` looks up while it parses ``ds_cfg`` (deep-copied), and the exception
    it raised (None when it accepted the config)."""
    from deepspeed.runtime.config import DeepSpeedConfig  # lazy: deepspeed picks its accelerator at import

    probe = _KeyLog(copy.deepcopy(ds_cfg))
    with _deepspeed_config_probe(world_size):
        try:
            DeepSpeedConfig(probe)
        except Exception as e:  # noqa: BLE001 (any refusal of DeepSpeed's parser is reported, translated, below)
            return probe.looked_up, e
    return probe.looked_up, None


@functools.lru_cache(maxsize=1)
def deepspeed_config_keys() -> frozenset[str]:
    """The top-level DeepSpeed config keys the installed DeepSpeed reads: the keys its ``DeepSpeedConfig`` looks up
    while parsing a minimal config (``{"train_micro_batch_size_per_gpu": 1}``), so the set follows the installed
    version (about 60 keys in 0.19). A key outside it is ignored by DeepSpeed without a word."""
    keys, _ = _read_keys({"train_micro_batch_size_per_gpu": 1}, 1)
    return frozenset(k for k in keys if isinstance(k, str))


def _suggest(word: str, choices: Any) -> str | None:
    """The choice closest to ``word`` (difflib, case-insensitive), or None when none is close."""
    lowered = {str(c).lower(): str(c) for c in choices}
    match = difflib.get_close_matches(str(word).lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[match[0]] if match else None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_ds_top_level_keys(ds_cfg: dict, read: set | None = None) -> None:
    """Refuse a top-level key the installed DeepSpeed does not read (``deepspeed_config_keys``, plus any key its
    parser looks up for this very config, ``read``; probed here when None), naming the nearest known key.

    Raises:
        DSConfigError: the first unknown key, with the fix (rename it to the suggestion, or remove it).
    """
    if read is None:
        read, _ = _read_keys(ds_cfg, 1)
    known = deepspeed_config_keys() | {k for k in read if isinstance(k, str)}
    for key in ds_cfg:
        if key in known:
            continue
        import deepspeed  # lazy: deepspeed picks its accelerator at import

        near = _suggest(key, known)
        fix = f"did you mean {near!r}? rename it" if near else "remove it"
        raise DSConfigError(
            f"unknown top-level key {key!r}: DeepSpeed {deepspeed.__version__} reads no such key and would train "
            f"as if it were absent; {fix}"
        )


def _deepspeed_model(title: str) -> Any:
    """DeepSpeed's pydantic config model named ``title`` (a subclass of ``DeepSpeedConfigModel``), or None."""
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel  # lazy: deepspeed picks its accelerator

    todo = [DeepSpeedConfigModel]
    while todo:
        cls = todo.pop()
        if cls.__name__ == title:
            return cls
        todo += cls.__subclasses__()
    return None


def _section_of(ds_cfg: dict, path: list[str]) -> str | None:
    """The top-level key whose mapping holds ``path`` (the location inside a section pydantic reports)."""
    for key, value in ds_cfg.items():
        node = value
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and path and path[-1] in node:
            return key
    return None


def _pydantic_error(e: Exception, ds_cfg: dict) -> DSConfigError | None:
    """One line for a pydantic ValidationError of DeepSpeed's parser (None for another exception): the key as
    written (``section.key``), and for an unknown key the nearest field of DeepSpeed's own model of that section."""
    errors = getattr(e, "errors", None)
    if not callable(errors) or not errors():
        return None
    err = errors()[0]
    loc = [str(x) for x in err.get("loc", ())]
    title = getattr(e, "title", "")
    section = _section_of(ds_cfg, loc)
    where = ".".join([section, *loc] if section else loc) or title
    if err.get("type") != "extra_forbidden" or not loc:
        return DSConfigError(
            f"{where} {json.dumps(err.get('input'), default=str)} is refused by DeepSpeed ({err.get('msg')}); "
            "give a valid value"
        )
    model = _deepspeed_model(title)
    for part in loc[:-1]:  # down into a nested model (e.g. zero_optimization.offload_optimizer)
        ann = model.model_fields.get(part) if model is not None else None
        args = getattr(ann.annotation, "__args__", (ann.annotation,)) if ann is not None else ()
        model = next((a for a in args if hasattr(a, "model_fields")), None)
    names = {f.alias or n for n, f in model.model_fields.items()} if model is not None else set()
    near = _suggest(loc[-1], names)
    fix = f"did you mean {near!r}? rename it" if near else "remove it"
    return DSConfigError(f"unknown key {where}: DeepSpeed's {title} has no such field; {fix}")


def _optimizer_class(kind: str, params: dict, offloaded: bool) -> tuple[Any, str, set[str]]:
    """The class DeepSpeed builds for optimizer ``kind`` (as ``DeepSpeedEngine._configure_basic_optimizer`` picks
    it), its name for messages, and the params keys DeepSpeed itself takes out before calling it. The class is
    None for a type whose class cannot be imported here (its params are not checked)."""
    from deepspeed.runtime import config as ds_c  # lazy: deepspeed picks its accelerator at import

    own = {ds_c.TORCH_ADAM_PARAM, ds_c.ADAM_W_MODE, "fp32_optimizer_states"}
    name = kind.lower()
    if name in (ds_c.ADAM_OPTIMIZER, ds_c.ADAMW_OPTIMIZER):
        if params.get(ds_c.TORCH_ADAM_PARAM):
            w_mode = name == ds_c.ADAMW_OPTIMIZER or params.get(ds_c.ADAM_W_MODE, ds_c.ADAM_W_MODE_DEFAULT)
            cls = torch.optim.AdamW if w_mode else torch.optim.Adam
            return cls, f"torch.optim.{cls.__name__} (torch_adam: true)", own
        if offloaded:
            from deepspeed.ops.adam import DeepSpeedCPUAdam  # lazy: deepspeed picks its accelerator at import

            return DeepSpeedCPUAdam, "DeepSpeedCPUAdam (optimizer offload)", own
        from deepspeed.ops.adam import FusedAdam  # lazy: deepspeed picks its accelerator at import

        return FusedAdam, "DeepSpeed's FusedAdam", own
    if name == ds_c.ADAGRAD_OPTIMIZER and not offloaded:
        return torch.optim.Adagrad, "torch.optim.Adagrad", set()
    if name == ds_c.LAMB_OPTIMIZER:
        from deepspeed.ops.lamb import FusedLamb  # lazy: deepspeed picks its accelerator at import

        return FusedLamb, "DeepSpeed's FusedLamb", set()
    if name in ds_c.DEEPSPEED_OPTIMIZERS:
        return None, kind, set()  # CPU Adagrad/Lion, FusedLion, mup's, Muon: params not checked here
    cls = getattr(torch.optim, kind, None)
    return cls, f"torch.optim.{kind}", set()


def _check_optimizer(ds_cfg: dict, stage: int) -> None:
    from deepspeed.runtime import config as ds_c  # lazy: deepspeed picks its accelerator at import

    opt = ds_cfg.get("optimizer")
    if opt is None:
        return
    if not isinstance(opt, dict) or not isinstance(opt.get("type"), str):
        raise DSConfigError(
            f"optimizer {opt!r} must be a mapping with a type, e.g. "
            '{"type": "AdamW", "params": {"lr": 0.001, "torch_adam": true}}'
        )
    kind, params = opt["type"], opt.get("params", {})
    if not isinstance(params, dict):
        raise DSConfigError(f'optimizer.params {params!r} must be a mapping, e.g. {{"lr": 0.001}}')
    torch_names = [n for n in dir(torch.optim) if _is_optimizer_class(getattr(torch.optim, n))]
    if kind.lower() not in ds_c.DEEPSPEED_OPTIMIZERS and kind not in torch_names:
        shown = {n: n for n in ds_c.DEEPSPEED_OPTIMIZERS} | {n.lower(): n for n in torch_names}
        display = sorted({shown.get(n.lower(), n) for n in [*ds_c.DEEPSPEED_OPTIMIZERS, *torch_names]})
        near = _suggest(kind, display)
        fix = f"did you mean {near!r}?" if near else f"use one of {', '.join(display)}"
        raise DSConfigError(f"optimizer.type {kind!r} is not an optimizer DeepSpeed can build; {fix}")
    zero = ds_cfg.get("zero_optimization") or {}
    device = (zero.get("offload_optimizer") or {}).get("device", "none") if isinstance(zero, dict) else "none"
    cls, cls_name, own = _optimizer_class(kind, params, device in ("cpu", "nvme") and stage > 0)
    if "max_grad_norm" in params:
        raise DSConfigError(
            f"optimizer.params.max_grad_norm {params['max_grad_norm']!r}: DeepSpeed refuses it there; set the "
            "top-level gradient_clipping instead"
        )
    if cls is not None:
        sig = inspect.signature(cls.__init__).parameters
        if not any(p.kind == p.VAR_KEYWORD for p in sig.values()):
            accepted = [n for n in sig if n not in ("self", "params", "model_params")] + sorted(own - set(sig))
            for key in params:
                if key not in accepted:
                    near = _suggest(key, accepted)
                    fix = f"did you mean {near!r}?" if near else f"its parameters are {', '.join(accepted)}"
                    raise DSConfigError(f"optimizer.params.{key} is not a parameter of {cls_name}; {fix}")
    _check_optimizer_numbers(params)


def _is_optimizer_class(obj: Any) -> bool:
    return inspect.isclass(obj) and issubclass(obj, torch.optim.Optimizer) and obj is not torch.optim.Optimizer


def _check_optimizer_numbers(params: dict) -> None:
    """lr a number >= 0 (torch's optimizers accept 0, which trains nothing), betas two numbers in [0, 1), eps > 0,
    weight_decay >= 0 (each where given)."""
    rules = (
        ("lr", lambda v: _is_number(v) and v >= 0, "a number >= 0, e.g. 0.001 (no quotes; 0 leaves the weights)"),
        ("eps", lambda v: _is_number(v) and v > 0, "a positive number, e.g. 1e-08"),
        ("weight_decay", lambda v: _is_number(v) and v >= 0, "a number >= 0, e.g. 0.1 (0: no decay)"),
        (
            "betas",
            lambda v: isinstance(v, (list, tuple)) and len(v) == 2 and all(_is_number(b) and 0 <= b < 1 for b in v),
            "two numbers in [0, 1), e.g. [0.9, 0.95]",
        ),
    )
    for key, ok, rule in rules:
        if key in params and not ok(params[key]):
            raise DSConfigError(f"optimizer.params.{key} {json.dumps(params[key])} must be {rule}")


def _check_zero_offload(ds_cfg: dict, stage: int) -> None:
    zero = ds_cfg.get("zero_optimization") or {}
    if not isinstance(zero, dict):
        return
    for section, lowest, why in (
        ("offload_optimizer", 1, "stage 0 has no ZeRO optimizer to offload"),
        ("offload_param", 3, "only stage 3 partitions the parameters it would offload"),
    ):
        device = (zero.get(section) or {}).get("device", "none") if isinstance(zero.get(section), dict) else "none"
        if device in (None, "none"):
            continue
        need = lowest if device == "cpu" else 3
        if stage < need:
            reason = why if device == "cpu" or section == "offload_param" else "NVMe offload is ZeRO-Infinity, stage 3"
            raise DSConfigError(
                f"zero_optimization.{section}.device {device!r} at ZeRO stage {stage}: DeepSpeed offloads it from "
                f"stage {need} on ({reason}); set zero_optimization.stage to {'3' if need == 3 else '1, 2 or 3'}, or "
                f"remove {section}"
            )


def check_ds_config_meaning(ds_cfg: dict, world_size: int = 1) -> None:
    """Refuse a DeepSpeed config by DeepSpeed's own rules, before any rank starts: what DeepSpeed would ignore
    silently or refuse only while the engine is built, after the ranks joined (imports deepspeed: call after the
    accelerator is set).

    Checks: every top-level key is one the installed DeepSpeed reads (``deepspeed_config_keys``; the nearest one
    suggested); DeepSpeed's own parser (``DeepSpeedConfig``, run here as rank 0 of ``world_size`` ranks) accepts
    it, with its pydantic sections (an unknown ``zero_optimization`` key gets the nearest field); the optimizer
    type is one DeepSpeed can build and every ``params`` key is a parameter of the class DeepSpeed would call
    (``inspect.signature`` of torch.optim.AdamW, FusedAdam, DeepSpeedCPUAdam, ...); lr >= 0, betas in [0, 1),
    eps > 0, weight_decay >= 0, gradient_clipping >= 0 (numbers, not strings); offload of the optimizer at ZeRO
    stage 0, of parameters below stage 3, or to NVMe below stage 3.

    Args:
        ds_cfg: the DeepSpeed config (not modified); the ZeRO stage must already be one of 0-3.
        world_size: data-parallel ranks of the job (DeepSpeed checks the batch sizes against it).

    Raises:
        DSConfigError: the first problem found, as one line without the file's name.
    """
    read, error = _read_keys(ds_cfg, world_size)
    check_ds_top_level_keys(ds_cfg, read)
    zero = ds_cfg.get("zero_optimization") or {}
    stage = int(zero.get("stage", 0)) if isinstance(zero, dict) else 0
    clip = ds_cfg.get("gradient_clipping")
    if clip is not None and not (_is_number(clip) and clip >= 0):
        raise DSConfigError(f"gradient_clipping {json.dumps(clip)} must be a number >= 0 (0: no clipping)")
    _check_zero_offload(ds_cfg, stage)
    _check_optimizer(ds_cfg, stage)
    if error is not None:
        translated = _pydantic_error(error, ds_cfg)
        if translated is not None:
            raise translated from None
        detail = " ".join(str(error).split()) or type(error).__name__
        raise DSConfigError(f"DeepSpeed's config parser refuses it: {detail}") from None
