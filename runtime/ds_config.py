"""A DeepSpeed config checked for meaning before any rank starts, by DeepSpeed's own rules where it has them.

DeepSpeed ignores an unknown top-level key (a typo such as ``zero_optimizaton`` trains at ZeRO stage 0) and refuses
many mistakes only once the engine is being built, with a traceback on every rank. ``check_ds_top_level_keys`` and
``check_ds_config_meaning`` refuse them first, in one line: the known keys are the ones the installed DeepSpeed's
config parser reads, its own parser and pydantic models are run on the config, and the optimizer and scheduler
parameters are checked against the classes DeepSpeed would build. ``load_ds_config`` reads the file as train.py and
growlm-run do, and ``check_ds_config`` runs every check on it (ZeRO stage, top-level keys, batch sizes against the
world size, meaning, scheduler). Every check of a DeepSpeed config lives here; each raises ``DSConfigError``, one
line naming the file, the key and the fix. deepspeed is imported lazily: runtime.dist.select_accelerator must run
before its first import.
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
import os
from collections.abc import Iterator, KeysView
from pathlib import Path
from typing import Any

import torch
import torch.optim.lr_scheduler as torch_schedules

from growlm import DS_CONFIG_DIR


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


GPU_CONFIG_DIR = DS_CONFIG_DIR / "gpu"  # the shipped configs' GPU variants, same file names


def choose_ds_config(path: str, accelerator: str) -> tuple[str, str | None]:
    """The DeepSpeed config file a run on ``accelerator`` uses for ``--ds_config path``.

    The shipped configs (``ds_configs/zero{S}_{P}.json``) carry values measured on a CPU (2M-element buckets, no
    contiguous-gradient copy); on CUDA a shipped config that has a GPU variant (``ds_configs/gpu/``, same name,
    DeepSpeed's GPU-sized buckets) is replaced by it. Any other file, a copy of a shipped config elsewhere included,
    is used as given on every accelerator: a user's own config is never replaced.

    Args:
        path: the --ds_config value as given.
        accelerator: DeepSpeed's accelerator name (``runtime.dist.select_accelerator``: "cuda", "cpu", ...).

    Returns:
        (the path to use, a one-line note naming both files when the GPU variant was chosen, else None). A path
        that is not a file comes back unchanged (its reader refuses it).
    """
    given = Path(path)
    if accelerator != "cuda" or not given.is_file():
        return path, None
    if given.resolve().parent != DS_CONFIG_DIR.resolve():
        return path, None
    variant = GPU_CONFIG_DIR / given.name
    if not variant.is_file():
        return path, None
    shown = f"ds_configs/gpu/{given.name}"
    return str(variant), (
        f"growlm: --ds_config {path} is a shipped config with CPU-measured values; on CUDA its GPU variant "
        f"{shown} is used (DeepSpeed's GPU bucket sizes, contiguous gradients); pass a config file of your own to "
        "choose other values"
    )


def shipped_ds_config(stage: int, precision: str, accelerator: str) -> Path:
    """The shipped config ``zero{stage}_{precision}.json`` a run on ``accelerator`` uses: its GPU variant on CUDA
    where one exists (``choose_ds_config``), else the file in ``ds_configs/``. For commands that write an edited copy
    of a shipped config (growlm-bench, growlm-gpu-check), which train.py would not replace."""
    return Path(choose_ds_config(str(DS_CONFIG_DIR / f"zero{stage}_{precision}.json"), accelerator)[0])


# ----- the config file as train.py and growlm-run read it -----------------------------------------------------------

ZERO_STAGES = (0, 1, 2, 3)


def load_ds_config(path: str, max_steps: int) -> dict[str, Any]:
    """The DeepSpeed config at ``path`` with ``"auto"`` scheduler step counts replaced by ``max_steps``.

    Raises:
        DSConfigError: no such file, a folder, unreadable, not a JSON object, or fp16 and bf16 both enabled.
    """
    choices = f"pick one of {sorted(n for n in os.listdir(DS_CONFIG_DIR) if n.endswith('.json'))}"
    if Path(path).is_dir():
        raise DSConfigError(f"--ds_config {path} is a folder, not a DeepSpeed JSON file; {choices}")
    try:
        cfg = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DSConfigError(f"--ds_config {path}: no such file; {choices}") from None
    except OSError as e:
        raise DSConfigError(f"--ds_config {path} cannot be read ({e.strerror or e}); {choices}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DSConfigError(f"--ds_config {path} is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise DSConfigError(f"--ds_config {path} must hold a JSON object")
    sched = cfg.get("scheduler", {}).get("params", {}) if isinstance(cfg.get("scheduler"), dict) else {}
    for key in ("total_num_steps", "warmup_num_steps"):
        if sched.get(key) == "auto":
            sched[key] = max_steps
    if cfg.get("fp16", {}).get("enabled") and cfg.get("bf16", {}).get("enabled"):
        raise DSConfigError(f"--ds_config {path} enables both fp16 and bf16; enable one")
    return cfg


def zero_stage_of(ds_cfg: dict[str, Any], path: str | None = None) -> int:
    """The ZeRO stage (0-3) a DeepSpeed config sets; 0, DeepSpeed's default, when it sets none (``path``: the
    config's file, named in the message).

    Raises:
        DSConfigError: the stage is not one of the integers 0, 1, 2, 3.
    """
    zero = ds_cfg.get("zero_optimization", {})
    stage = zero.get("stage", 0) if isinstance(zero, dict) else None
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        where = f"--ds_config {path}" if path else "--ds_config"
        raise DSConfigError(
            f"{where}: zero_optimization.stage {stage!r} is not a ZeRO stage; use 0, 1, 2 or 3 "
            "(e.g. ds_configs/zero2_bf16.json)"
        )
    return int(stage)


BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def check_batch(ds_cfg: dict[str, Any], path: str, world_size: int) -> None:
    """Refuse batch settings DeepSpeed would reject when the engine is built (an AssertionError, after the process
    group formed): each given value a positive integer, train_batch_size or the micro batch given, and
    train_batch_size = micro batch x gradient accumulation x ranks once DeepSpeed derives the missing ones (as
    deepspeed.runtime.config does, with integer division).

    Raises:
        DSConfigError: names the values, the launched world size and the fix.
    """
    for key in BATCH_KEYS:
        value = ds_cfg.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise DSConfigError(f"--ds_config {path}: {key} {value!r} must be a positive integer")
    train, micro, gas = (ds_cfg.get(k) for k in BATCH_KEYS)
    if train is None and micro is None:
        raise DSConfigError(
            f"--ds_config {path} sets neither train_batch_size nor train_micro_batch_size_per_gpu; set "
            "train_micro_batch_size_per_gpu (and gradient_accumulation_steps)"
        )
    if train is None:
        return  # DeepSpeed derives it: micro x gas x ranks
    if micro is None:
        gas = gas or 1
        micro = train // world_size // gas
    elif gas is None:
        gas = train // micro // world_size
    if micro < 1 or gas < 1 or train != micro * gas * world_size:
        raise DSConfigError(
            f"--ds_config {path}: train_batch_size {train} is not train_micro_batch_size_per_gpu x "
            f"gradient_accumulation_steps x ranks ({micro} x {gas} x {world_size} = {micro * gas * world_size}); "
            "drop train_batch_size (DeepSpeed then derives it) or set one that equals that product"
        )


def check_scheduler(ds_cfg: dict[str, Any], path: str) -> None:
    """Refuse a scheduler DeepSpeed cannot build: an unknown type, or a params key its constructor does not take
    (DeepSpeed calls ``type(optimizer, **params)``, a TypeError once the engine is being built). The accepted keys
    are read from the signature of the class DeepSpeed would pick (deepspeed.runtime.lr_schedules, else
    torch.optim.lr_scheduler), so they follow the installed version.

    Raises:
        DSConfigError: names the scheduler, the unknown keys and the accepted ones; or a value of the wrong type or
            sign (from the constructor's annotations: total_num_steps "400" or -5, a string ratio).
    """

    from deepspeed.runtime import lr_schedules  # lazy: deepspeed picks its accelerator at import

    sched = ds_cfg.get("scheduler")
    if sched is None:
        return
    kind = sched.get("type") if isinstance(sched, dict) else None
    params = sched.get("params", {}) if isinstance(sched, dict) else None
    known = getattr(lr_schedules, "VALID_LR_SCHEDULES", [])
    cls = getattr(lr_schedules, kind, None) if isinstance(kind, str) else None
    if cls is None and isinstance(kind, str) and not kind.startswith("_"):
        cls = getattr(torch_schedules, kind, None)
    if not inspect.isclass(cls) or not isinstance(params, dict):
        raise DSConfigError(
            f"--ds_config {path}: scheduler {kind!r} is not a scheduler DeepSpeed knows; give "
            f'{{"type": one of {", ".join(known)}, "params": {{...}}}}'
        )
    sig = inspect.signature(cls.__init__).parameters
    if any(p.kind == p.VAR_KEYWORD for p in sig.values()):
        return
    accepted = [n for n in sig if n not in ("self", "optimizer")]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise DSConfigError(
            f"--ds_config {path}: scheduler {kind} takes no {', '.join(unknown)}; its params are {', '.join(accepted)}"
        )
    for key, value in params.items():
        rule = _scheduler_value_rule(sig[key])
        if rule is not None and not rule[0](value):
            auto = ' (or "auto": --max_steps)' if key in ("total_num_steps", "warmup_num_steps") else ""
            raise DSConfigError(
                f"--ds_config {path}: scheduler.params.{key} {json.dumps(value)} must be {rule[1]}{auto}, as "
                f"{kind} takes it"
            )


def _scheduler_value_rule(param: inspect.Parameter) -> tuple[Any, str] | None:
    """(is the value valid, what it must be) for a scheduler parameter, from its annotation (else its default's
    type): an integer or a number >= 0, a boolean, a string; None for anything else (and the start position
    ``last_batch_iteration``, which may be -1)."""
    kind = param.annotation if param.annotation is not inspect.Parameter.empty else None
    kind = {"int": int, "float": float, "bool": bool, "str": str}.get(kind, kind) if isinstance(kind, str) else kind
    if kind is None and param.default not in (inspect.Parameter.empty, None):
        kind = type(param.default)
    if param.name == "last_batch_iteration":
        return None
    rule = _value_rule(kind)
    if rule is not None and param.default is None:  # None is the default itself: allowed
        return (lambda v: v is None or rule[0](v)), rule[1]
    return rule


def _value_rule(kind: Any) -> tuple[Any, str] | None:
    if kind is bool:
        return (lambda v: isinstance(v, bool)), "true or false"
    if kind is int:
        return (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0), "an integer >= 0"
    if kind is float:
        ok = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0  # noqa: E731
        return ok, "a number >= 0"
    if kind is str:
        return (lambda v: isinstance(v, str)), "a string"
    return None


def check_ds_config(ds_cfg: dict[str, Any], path: str, world_size: int) -> None:
    """The DeepSpeed config checked for meaning, by DeepSpeed's own rules, before any rank starts: the ZeRO stage,
    the top-level keys (one the installed DeepSpeed does not read is refused, the nearest known one suggested), the
    batch sizes against the launched world size, everything else ``runtime.ds_config.check_ds_config_meaning`` checks
    (DeepSpeed's own parser, the optimizer type and params, numbers and their ranges, offload against the ZeRO
    stage), then the scheduler (imports deepspeed: call after the accelerator is set).

    Raises:
        DSConfigError: ``--ds_config PATH: <problem>; <fix>``; see ``zero_stage_of``, ``check_batch``,
            ``check_ds_config_meaning`` and ``check_scheduler``.
    """
    zero_stage_of(ds_cfg, path)
    try:
        check_ds_top_level_keys(ds_cfg)
    except DSConfigError as e:
        raise DSConfigError(f"--ds_config {path}: {e}") from None
    check_batch(ds_cfg, path, world_size)
    try:
        check_ds_config_meaning(ds_cfg, max(1, world_size))  # WORLD_SIZE=0 is refused later, by name
    except DSConfigError as e:
        raise DSConfigError(f"--ds_config {path}: {e}") from None
    check_scheduler(ds_cfg, path)
