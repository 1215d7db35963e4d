"""Run configuration of train.py, validated before any rank talks to another: one ``RunConfig`` for the rest.

Everything here needs only this process's view (the command line, the DeepSpeed JSON, the checkpoint's
``growlm_state.json``, the token folder's ``meta.json``, the stage list), so bad input fails fast and alike on every
rank, before DeepSpeed or a process group is touched. Errors are ``UsageError`` (one message, exit status 2) or,
from runtime.checkpoint, ``CheckpointError``.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import shlex
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from growlm.data.prepare import default_data_dir, load_meta, open_tokens
from growlm.growth.stages.plan import StageList
from growlm.model.config import PRESETS, ModelConfig, from_preset
from growlm.model.masks import MaskSpec
from growlm.model.registry import FAMILIES, family
from growlm.runtime import checkpoint, resume_checks
from growlm.runtime.ds_config import DSConfigError, check_ds_config, load_ds_config, zero_stage_of
from growlm.runtime.engine import build_engine, precision_of
from growlm.runtime.run_state import RunState
from growlm.trainer import init_from
from growlm.trainer.errors import UsageError
from growlm.trainer.plan_checks import (
    LLAMA_FLAGS,
    SHAPE_FLAGS,
    check_plan_fits_run,
    check_run_fits_memory,
    check_stop_stage,
    load_growth_plan,
    plan_config,
    run_batch,
    shape_flag,
)

DEFAULT_PRESET = "cpu-small"
DEFAULT_SEED = 1234


@dataclass(frozen=True)
class RunConfig:
    """A validated train.py run: what to build, what to train on, where to write, when to evaluate and save.

    Attributes:
        ds_config_path: the --ds_config file (named in messages).
        ds_config: the DeepSpeed config, "auto" step counts filled in; ``load_universal`` set for a growlm-grow
            checkpoint.
        zero_stage: the config's ZeRO stage (0-3).
        precision: "fp32" | "bf16" | "fp16".
        model: the model shape to build (the plan's point, the checkpoint's, or preset + overrides).
        resume: the opened --resume checkpoint (manifest sizes checked; contents and pickles are checked by
            the ranks once joined, ``runtime.checkpoint.verify_shares``), or None for a fresh run.
        init_from: the checked --init_from transformers folder (trainer.init_from.InitFolder), or None.
        growth: the --growth_plan stage list, or None.
        growth_plan: the --growth_plan path, or None.
        stage_index: growth stages already done (the checkpoint's; 0 for a fresh run).
        seq_len: tokens per training sequence T.
        seed: seed of the init, data order and dropout.
        data_dir: the prepared token folder; ``builtin_data``: it is the built-in corpus (prepared on first use).
        out_dir, save_dir: the run folder and its ``checkpoints/``.
        start_step: the global step the run starts at (the checkpoint's, or 0).
        save_steps: global steps at which this run saves.
        final_save: the run saves at its end (not --no_final_save), and so also where a signal stops it.
        max_steps, log_interval, eval_interval, eval_tokens, final_eval_tokens, eval_stride, eval_batch_size,
            no_final_eval, dist_timeout_s, activation_checkpointing, compile: the flags of the same names
            (``python train.py --help``).
        stop_before_stage: --stop_before_stage: save and end the run when this plan stage is due (growlm-run).
        new_schedule: --new_schedule: a resume trains on ``ds_config``'s LR schedule instead of the checkpoint's.
        config_scheduler: the --ds_config's own scheduler section ("auto" filled in), before a resume put the
            checkpoint's in its place in ``ds_config`` (``keep_saved_scheduler``).
    """

    ds_config_path: str
    ds_config: dict[str, Any]
    zero_stage: int
    precision: str
    model: ModelConfig
    resume: checkpoint.OpenCheckpoint | None
    growth: StageList | None
    growth_plan: str | None
    stage_index: int
    seq_len: int
    seed: int
    data_dir: Path
    builtin_data: bool
    out_dir: Path
    save_dir: Path
    start_step: int
    save_steps: tuple[int, ...]
    max_steps: int
    log_interval: int
    eval_interval: int
    eval_tokens: int
    final_eval_tokens: int
    eval_stride: int | None
    eval_batch_size: int
    no_final_eval: bool
    dist_timeout_s: float
    init_from: Any = None
    stop_before_stage: str | None = None
    activation_checkpointing: bool = False
    compile: bool = False
    new_schedule: bool = False
    config_scheduler: Any = None
    final_save: bool = True

    @property
    def resume_state(self) -> RunState | None:
        """The --resume checkpoint's RunState as read from its folder (None for a fresh run)."""
        return self.resume.state if self.resume is not None else None

    def build_engine(
        self, model: ModelConfig, masks: MaskSpec | None, *, partitioned: bool, uninitialised: bool = False
    ) -> Any:
        """``runtime.engine.build_engine`` for ``model`` (with growth ``masks``) under this run's DeepSpeed config,
        activation checkpointing and --compile: the one place the run's engine arguments are written, for its first
        engine and for each grown one (a collective, like build_engine)."""
        return build_engine(
            model,
            masks,
            self.ds_config,
            partitioned=partitioned,
            uninitialised=uninitialised,
            activation_checkpointing=self.activation_checkpointing,
            compile_model=self.compile,
        )


def family_fields(cfg: ModelConfig) -> set[str]:
    """The fields of ``cfg``'s config class (the shape flags its family takes)."""
    return {f.name for f in fields(cfg)}


def check_family_flags(args: argparse.Namespace, base: ModelConfig, what: str) -> None:
    """Refuse shape flags that ``base``'s family does not have (``LLAMA_FLAGS``: --n_kv_head, --head_dim,
    --rope_theta, --rms_norm_eps, --tie_word_embeddings / --untie_word_embeddings are fields of the Llama-shaped
    families only, Llama and Qwen 2), e.g. for a model of the GPT-2 family.

    Args:
        args: the parsed command line.
        base: the config the flags would override (the preset's or the checkpoint's).
        what: names ``base`` in the message, e.g. "preset 'cpu-small'".

    Raises:
        UsageError: one line naming the flags and the presets of the families that have them.
    """
    have = family_fields(base)
    given = [k for k in LLAMA_FLAGS if getattr(args, k, None) is not None and k not in have]
    if given:
        flags = ", ".join(shape_flag(k, getattr(args, k)) for k in given)
        others = [f for f in FAMILIES.values() if set(given) <= {x.name for x in fields(f.config)}]
        presets = [name for f in others for name in f.presets]
        raise UsageError(
            f"{flags}: flag(s) of Llama-shaped models only ({', '.join(f.name for f in others)}), but {what} is a "
            f"{family(base).name} model; drop them, or choose a preset of those families ({', '.join(presets)})"
        )


def model_config_from_args(args: argparse.Namespace, resume_state: RunState | None) -> ModelConfig:
    """The model shape: the checkpoint's when resuming (flags must agree with it), else preset + overrides.
    ``--preset`` chooses the family (GPT-2 or Llama); a resume keeps the checkpoint's.

    Raises:
        UsageError: an unknown preset, Llama-only flags for a GPT-2 model (``check_family_flags``), or an invalid
            shape (model.config's message).
    """
    name = args.preset or (DEFAULT_PRESET if resume_state is None else None)
    if name is None:
        base, what = resume_state.model_config, "the checkpoint's model"
    else:
        base, what = PRESETS.get(name), f"preset {name!r}"
    if base is not None:  # an unknown preset is refused by from_preset below
        check_family_flags(args, base, what)
    have = family_fields(base) if base is not None else set()
    flags = tuple(k for k in SHAPE_FLAGS if k in have or k not in LLAMA_FLAGS)
    overrides = {k: getattr(args, k) for k in (*flags, "dropout")}
    try:
        if resume_state is None:
            return from_preset(name, **overrides)
        saved = resume_state.model_config
        given = {k: v for k, v in overrides.items() if v is not None}
        requested = from_preset(args.preset, **given) if args.preset else replace(saved, **given)
        if args.dropout is None:  # dropout is not part of the shape: keep the checkpoint's unless asked
            requested = replace(requested, dropout=saved.dropout)
        return requested
    except ValueError as e:
        raise UsageError(str(e)) from None


def validate_data_dir(path: str | None) -> Path:
    """The prepared token folder to train on (``path``, or the built-in corpus's when None).

    Raises:
        UsageError: the folder is missing, is a text file, has no valid meta.json, or its train split is empty.
    """

    if path is None:
        return default_data_dir()
    p = Path(path)
    if not p.exists():
        raise UsageError(
            f"--data {p}: no such folder; prepare one with `growlm-prepare --train FILE... --val FILE... --out "
            f"{shlex.quote(str(p))}`"
        )
    if p.is_file():
        raise UsageError(
            f"--data {p} is a file; train.py reads a prepared token folder: run `growlm-prepare "
            f"--train {shlex.quote(str(p))} --val HELD_OUT_FILE --out DIR` and pass --data DIR"
        )
    try:
        meta = load_meta(p)
    except (ValueError, FileNotFoundError) as e:
        raise UsageError(str(e)) from None
    if meta["splits"]["train"]["n_tokens"] == 0:
        raise UsageError(f"--data {p}: the train split is empty")
    return p


SEED_MAX = 2**32 - 1

# flag -> (lowest, highest or None, what the flag is / what 0 means: named in the message)
FLAG_RANGES: dict[str, tuple[float, float | None, str]] = {
    "n_layer": (1, None, "blocks"),
    "n_embd": (1, None, "width"),
    "n_head": (1, None, "attention heads"),
    "n_inner": (1, None, "FFN width"),
    "n_kv_head": (1, None, "key/value heads"),
    "head_dim": (2, None, "attention head dim; even"),
    "n_positions": (1, None, "longest context"),
    "vocab_size": (1, None, "vocabulary"),
    "seq_len": (1, None, "tokens per sequence; at most n_positions"),
    "seed": (0, SEED_MAX, "a seed"),
    "max_steps": (1, None, "the optimizer step to train until"),
    "save_interval": (0, None, "steps between saves; 0: only at the end"),
    "log_interval": (1, None, "steps between logs"),
    "eval_interval": (0, None, "steps between validations; 0: only before/after"),
    "eval_tokens": (2, None, "held-out tokens per validation; scoring needs 2"),
    "eval_stride": (1, None, "window step; at most seq_len"),
    "eval_batch_size": (1, None, "windows per forward pass"),
}


def check_flag_ranges(args: argparse.Namespace) -> None:
    """Refuse a numeric flag outside its valid range (``FLAG_RANGES``; --dropout in [0, 1), --dist_timeout_s a
    positive number of seconds, --final_eval_tokens 0 (the whole split) or at least 2), before anything else.

    Raises:
        UsageError: names the flag, its value, the valid range and what the flag means.
    """
    for name, (low, high, meaning) in FLAG_RANGES.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        if value < low or (high is not None and value > high):
            rule = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise UsageError(f"--{name} {value} must be {rule} ({meaning})")
    for name in ("rope_theta", "rms_norm_eps"):
        value = getattr(args, name, None)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise UsageError(f"--{name} {value} must be a positive number")
    dropout = getattr(args, "dropout", None)
    if dropout is not None and not 0 <= dropout < 1:
        raise UsageError(f"--dropout {dropout} must be in [0, 1) (the probability of zeroing an activation)")
    timeout = getattr(args, "dist_timeout_s", None)
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise UsageError(f"--dist_timeout_s {timeout} must be a positive number of seconds")
    final = getattr(args, "final_eval_tokens", None)
    if final is not None and (final < 0 or final == 1):
        raise UsageError(f"--final_eval_tokens {final} must be 0 (the whole validation split) or >= 2")


def check_out_dir(path: str) -> Path:
    """The --out_dir run folder, refused up front when it (or the checkpoints/ inside it, or a folder above it) is a
    file: the run would otherwise fail only when it first writes, after building and evaluating.

    Raises:
        UsageError: names the file in the way.
    """
    out = Path(path)
    for p in (out / "checkpoints", out, *out.parents):
        if p.exists() and not p.is_dir():
            raise UsageError(
                f"--out_dir {out}: {p} is a file, not a folder; choose another --out_dir (a new or existing folder)"
            )
        if p.is_dir():
            break
    return out


def check_token_files(data_dir: Path, seq_len: int) -> None:
    """Refuse a token folder the run cannot train on before anything starts: a train.bin or val.bin whose size is
    not meta.json's token count (truncated, or from another run), or a train split shorter than one sample
    (seq_len + 1 tokens). A built-in corpus not prepared yet is skipped (it is prepared after the ranks join).

    Raises:
        UsageError: names the file or the token counts and the fix.
    """

    if not (data_dir / "meta.json").is_file():
        return
    try:
        train = open_tokens(data_dir, "train")
        open_tokens(data_dir, "val")
    except (ValueError, FileNotFoundError) as e:
        raise UsageError(f"--data {data_dir}: {e}") from None
    if len(train) < seq_len + 1:
        raise UsageError(
            f"--data {data_dir}: the train split holds {len(train)} tokens, fewer than one sample of seq_len + 1 = "
            f"{seq_len + 1}; prepare more text or pass a shorter --seq_len"
        )


def planned_save_steps(start: int, max_steps: int, interval: int, final: bool) -> list[int]:
    """Global steps in (start, max_steps] at which this run saves: every ``interval``, and the last if ``final``."""
    steps = list(range(start + interval - start % interval, max_steps + 1, interval)) if interval > 0 else []
    if final and max_steps > start and max_steps not in steps:
        steps.append(max_steps)
    return steps


def open_resume(path: str | None, ds_cfg: dict) -> checkpoint.OpenCheckpoint | None:
    """Open the --resume checkpoint (manifest sizes, RunState; ``runtime.checkpoint.open_for_resume``); None without
    --resume.

    A growlm-grow (universal) checkpoint sets ``ds_cfg["checkpoint"]["load_universal"]``: DeepSpeed reshards it at
    load, at any world size.

    Raises:
        CheckpointError: the checkpoint cannot be opened (message prefixed with ``--resume``).
    """
    if not path:
        return None
    try:  # sizes only: the ranks check the contents and pickles, each its share, once joined (verify_shares)
        resume = checkpoint.open_for_resume(path)
    except checkpoint.CheckpointError as e:
        raise checkpoint.CheckpointError(f"--resume {e}") from None
    if resume.state.universal:
        ds_cfg["checkpoint"] = {**ds_cfg.get("checkpoint", {}), "load_universal": True}
    return resume


def keep_saved_scheduler(ds_cfg: dict[str, Any], state: RunState, new_schedule: bool) -> None:
    """A resume keeps the LR schedule the checkpoint trained on: the saved DeepSpeed config's scheduler section
    replaces ``ds_cfg``'s when they differ (another --max_steps under ``"auto"``, another warm-up), since DeepSpeed
    restores only the schedule's position and would otherwise put it on the new config's curve. Nothing changes with
    ``new_schedule`` (--new_schedule), or when a growth placed the schedule (``state.schedule``: restored from the
    checkpoint itself, trainer.checkpointing.restore) or the checkpoint holds no config.
    """
    if new_schedule or state.schedule is not None or not isinstance(state.ds_config, dict):
        return
    saved = state.ds_config.get("scheduler")
    if saved == ds_cfg.get("scheduler"):
        return
    if saved is None:
        ds_cfg.pop("scheduler", None)
    else:
        ds_cfg["scheduler"] = copy.deepcopy(saved)


def check_data_order(state: RunState, seq_len: int, seed: int) -> None:
    """Refuse a resume that would read other samples: the data order is a function of (seed, seq_len, token file).

    Raises:
        UsageError: --seq_len or --seed differs from the checkpoint's.
    """
    for flag, value, saved in (("--seq_len", seq_len, state.seq_len), ("--seed", seed, state.seed)):
        if value != saved:
            raise UsageError(
                f"{flag} {value} differs from the checkpoint's {saved}: the resumed run would read other "
                f"samples than the interrupted one; drop {flag}"
            )


def check_save_steps(save_dir: Path, start: int, args: argparse.Namespace) -> list[int]:
    """The global steps this run saves at, refusing any whose tag already exists in ``save_dir``.

    Raises:
        UsageError: --max_steps below ``start``, or a planned tag already in ``save_dir`` (never overwritten).
    """
    if args.max_steps < start:
        raise UsageError(f"--max_steps {args.max_steps} is below the checkpoint's global step {start}")
    planned = planned_save_steps(start, args.max_steps, args.save_interval, not args.no_final_save)
    clash = sorted(set(checkpoint.existing_tags(save_dir)) & {checkpoint.tag_for(s) for s in planned})
    if clash:
        raise UsageError(
            f"{save_dir} already holds {', '.join(clash)}, which this run would write; checkpoints are "
            "never overwritten: choose another --out_dir (or --resume from the newest one)"
        )
    return planned


def check_precision_supported(precision: str, ds_config_path: str, zero_stage: int) -> None:
    """Refuse fp16 on a device DeepSpeed cannot train it on (imports deepspeed: call after the accelerator is set).

    Raises:
        UsageError: fp16 asked for and unsupported; the message names the precisions available.
    """
    from deepspeed.accelerator import get_accelerator  # lazy: deepspeed picks its accelerator at import

    if precision == "fp16" and not get_accelerator().is_fp16_supported():
        available = ["fp32"] + (["bf16"] if get_accelerator().is_bf16_supported() else [])
        raise UsageError(
            f"--ds_config {ds_config_path} asks for fp16, which this device "
            f"({get_accelerator().device_name()}) does not support; available precisions: "
            f"{', '.join(available)} (e.g. ds_configs/zero{zero_stage}_{available[-1]}.json)"
        )


def check_compile_supported(compile_model: bool) -> None:
    """Refuse --compile on an accelerator other than CUDA or the CPU (imports deepspeed: call after the accelerator
    is set). torch.compile uses DeepSpeed's backend for the accelerator: inductor on both (on a CPU it generates C++,
    built with the system's g++).

    Raises:
        UsageError: --compile on a device other than CUDA or the CPU.
    """
    from deepspeed.accelerator import get_accelerator  # lazy: deepspeed picks its accelerator at import

    device = get_accelerator().device_name()
    if compile_model and device not in ("cuda", "cpu"):
        raise UsageError(
            f"--compile: torch.compile runs on CUDA or the CPU, and this run is on {device}; drop --compile"
        )


def resolve(args: argparse.Namespace) -> RunConfig:
    """Validate the command line against the files it names and return the run's configuration.

    Checks, in this order: the numeric flags' ranges, --out_dir, the DeepSpeed config (``check_ds_config``: keys,
    DeepSpeed's parser, batch sizes against the launched world size, optimizer, numbers, offload, scheduler), the
    --resume checkpoint (whose LR schedule replaces the config's unless --new_schedule: ``keep_saved_scheduler``),
    the model shape, --seq_len against n_positions, its model states and the activations of one micro batch
    against this machine's memory (``check_run_fits_memory``), the growth plan, the data
    order (--seq_len/--seed against the checkpoint), the checkpoint against the
    launched world size and ZeRO stage (and its per-rank RNG files), the token folder and its token files, the save
    steps against existing tags, and fp16 support.

    Raises:
        UsageError, CheckpointError: the first problem found (see the functions above and trainer.init_from).
    """

    check_flag_ranges(args)
    out_dir = check_out_dir(args.out_dir)
    launched_world = int(os.environ.get("WORLD_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE") or 1)
    try:
        ds_cfg = load_ds_config(args.ds_config, args.max_steps)
        check_ds_config(ds_cfg, args.ds_config, launched_world)
        zero_stage = zero_stage_of(ds_cfg, args.ds_config)
    except DSConfigError as e:
        raise UsageError(str(e)) from None
    precision = precision_of(ds_cfg)
    init = init_from.open_init_from(args)  # None without --init_from; refuses --resume and other shapes
    resume = open_resume(args.resume, ds_cfg)
    state = resume.state if resume is not None else None
    new_schedule = getattr(args, "new_schedule", False)
    if new_schedule and state is None:
        raise UsageError("--new_schedule places a resumed run on this run's LR schedule; it needs --resume")
    config_scheduler = copy.deepcopy(ds_cfg.get("scheduler"))
    if state is not None:
        keep_saved_scheduler(ds_cfg, state, new_schedule)
    if init is not None:
        cfg = init.config
    elif args.growth_plan and state is None:  # the plan's start is the shape: plan_config refuses every shape flag
        cfg = None  # (before a preset's family or validity could be blamed for flags the plan makes moot)
    else:
        cfg = model_config_from_args(args, state)
    stage_index = state.growth_stage if state else 0
    growth = None
    if args.growth_plan:
        growth = load_growth_plan(args.growth_plan)
        start = init_from.check_plan_start(init, growth, args.growth_plan) if init is not None else None
        cfg = start or plan_config(args, growth, cfg, state, stage_index)
    seq_len = args.seq_len if args.seq_len is not None else (state.seq_len if state else cfg.n_positions)
    if not 1 <= seq_len <= cfg.n_positions:
        raise UsageError(
            f"--seq_len {seq_len} must be in [1, n_positions={cfg.n_positions}]; shorten it or raise --n_positions"
        )
    world = max(launched_world, 1)  # a WORLD_SIZE below 1 is refused when the ranks join
    batch = run_batch(args, ds_cfg, cfg, world, seq_len)  # the activations of one micro batch are counted too
    check_run_fits_memory(cfg, ds_cfg, world, batch)  # the model alone first, then a plan's growths
    if growth is not None:
        check_plan_fits_run(growth, stage_index, args, ds_cfg, state.schedule if state else None, batch=batch)
    stop = check_stop_stage(getattr(args, "stop_before_stage", None), growth, stage_index)
    seed = args.seed if args.seed is not None else (state.seed if state else DEFAULT_SEED)
    if state is not None:
        check_data_order(state, seq_len, seed)
    if args.eval_stride is not None and args.eval_stride > seq_len:
        raise UsageError(f"--eval_stride {args.eval_stride} must be at most seq_len {seq_len} (the window length)")
    if resume is not None:
        resume_checks.check_compatible(
            state,
            model_config=cfg.to_dict(),
            world_size=launched_world,
            zero_stage=zero_stage,
            path=resume.tag_dir,
            precision=precision,
            ds_config=args.ds_config,
        )
        try:
            resume_checks.check_rng_files(resume, launched_world)
        except checkpoint.CheckpointError as e:
            raise checkpoint.CheckpointError(f"--resume {e}") from None
    data_dir = validate_data_dir(args.data)
    check_token_files(data_dir, seq_len)
    if init is not None:
        init_from.check_data_tokenizer(init, data_dir)
    start_step = state.global_step if state else 0
    save_steps = check_save_steps(out_dir / "checkpoints", start_step, args)
    check_precision_supported(precision, args.ds_config, zero_stage)
    check_compile_supported(args.compile)
    return RunConfig(
        ds_config_path=args.ds_config,
        ds_config=ds_cfg,
        zero_stage=zero_stage,
        precision=precision,
        model=cfg,
        resume=resume,
        growth=growth,
        growth_plan=args.growth_plan,
        stage_index=stage_index,
        seq_len=seq_len,
        seed=seed,
        data_dir=data_dir,
        builtin_data=args.data is None,
        out_dir=out_dir,
        save_dir=out_dir / "checkpoints",
        start_step=start_step,
        save_steps=tuple(save_steps),
        max_steps=args.max_steps,
        log_interval=args.log_interval,
        eval_interval=args.eval_interval,
        eval_tokens=args.eval_tokens,
        final_eval_tokens=args.final_eval_tokens,
        eval_stride=args.eval_stride,
        eval_batch_size=args.eval_batch_size,
        no_final_eval=args.no_final_eval,
        dist_timeout_s=args.dist_timeout_s,
        init_from=init,
        stop_before_stage=stop,
        activation_checkpointing=args.activation_checkpointing,
        compile=args.compile,
        new_schedule=new_schedule,
        config_scheduler=config_scheduler,
        final_save=not args.no_final_save,
    )
