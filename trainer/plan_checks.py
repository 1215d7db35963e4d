"""The growth stage list (``--growth_plan``) checked against the run before launch: it loads, its start is the
model being built or resumed, and every stage fits the DeepSpeed config, the step budget and the LR schedule
(growth.stages.plan holds the stage list itself; this module only judges it against one run); and, plan or not, the
run's model against this machine's memory (``check_run_fits_memory``). Errors are ``UsageError`` (one message, exit
status 2).
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import Any

import psutil
import torch

from growlm import DS_CONFIG_DIR
from growlm.growth.errors import GrowthError
from growlm.growth.stages.plan import StageList, load_stages
from growlm.growth.stages.trigger import SLOPE_WINDOW
from growlm.model.config import ModelConfig, largest_param_numel, param_count
from growlm.model.registry import family
from growlm.runtime.engine import precision_of
from growlm.runtime.memory import (
    GIB,
    SHORTFALL_FIX,
    MicroBatch,
    activation_bytes,
    growth_working_set_bytes,
    model_state_bytes,
    model_state_split,
    placed_shortfall,
    rank_memory_bytes,
    size_text,
    training_need_text,
)
from growlm.runtime.metrics_file import MetricsFileError, read_val_curve
from growlm.runtime.run_state import RunState
from growlm.trainer.errors import UsageError

LLAMA_FLAGS = ("n_kv_head", "head_dim", "rope_theta", "rms_norm_eps", "tie_word_embeddings")  # LlamaConfig only
SHAPE_FLAGS = ("n_layer", "n_embd", "n_head", "n_inner", "n_positions", "vocab_size", *LLAMA_FLAGS)  # config overrides


def shape_flag(key: str, value: Any, with_value: bool = False) -> str:
    """The command-line flag that sets the config field ``key`` to ``value``, for messages: ``--KEY`` (``--KEY
    VALUE`` with ``with_value``), but --tie_word_embeddings / --untie_word_embeddings (no value) for the head's tie."""
    if key == "tie_word_embeddings":
        return "--tie_word_embeddings" if value else "--untie_word_embeddings"
    return f"--{key} {value}" if with_value else f"--{key}"


def load_growth_plan(path: str) -> StageList:
    """The validated growth plan at ``path``.

    Raises:
        UsageError: the file is missing or unreadable, is not valid YAML (FILE:LINE), or its stages do not chain
            (growth.stages.plan.parse_stages).
    """
    try:
        return load_stages(path)
    except FileNotFoundError:
        raise UsageError(f"--growth_plan {path}: no such file; see growth/plans/ for examples") from None
    except GrowthError as e:  # YAML syntax, a tab or a repeated key (FILE:LINE), or a plan that does not validate
        raise UsageError(f"--growth_plan {path}: {e}") from None
    except OSError as e:  # a folder, no permission: anything else is a bug and is not reported as bad input
        raise UsageError(f"--growth_plan {path}: cannot be read ({e.strerror}); give a readable plan file") from None


def shape_of(cfg: ModelConfig) -> dict:
    """The config's fields that fix the model's function (all but dropout; a Llama config's include its arch)."""
    return {k: v for k, v in cfg.to_dict().items() if k != "dropout"}


def plan_config(args, growth: StageList, cfg: ModelConfig | None, resume_state: RunState | None, stage_index: int):
    """The model shape when a growth plan drives the run: the plan's start, or after ``stage_index`` stages
    (``cfg``: the checkpoint's shape when resuming; unused, and may be None, for a fresh run).

    Raises:
        UsageError: shape flags given with a plan, or a checkpoint that is not a point of the plan.
    """
    shape_flags = [shape_flag(k, getattr(args, k)) for k in ("preset", *SHAPE_FLAGS) if getattr(args, k) is not None]
    if resume_state is None:
        if shape_flags:
            raise UsageError(f"--growth_plan sets the starting shape (its 'start'); drop {', '.join(shape_flags)}")
        start = growth.start
        return replace(start, dropout=args.dropout) if args.dropout is not None else start
    expected = growth.start if stage_index == 0 else growth.stages[stage_index - 1].target
    if stage_index > len(growth.stages) or shape_of(expected) != shape_of(cfg):
        raise UsageError(
            f"the checkpoint ({cfg.shape_str()}, {stage_index} growth stage(s) done) is not a point of --growth_plan "
            f"{args.growth_plan} (which expects {expected.shape_str()} there); resume with the plan it was trained with"
        )
    return cfg


def check_stage_schedules(growth: StageList, stage_index: int, ds_cfg: dict, saved: Any = None) -> None:
    """Refuse a stage whose LR placement would be refused at its growth (growth.ops.schedule_rule.place_schedule: target
    total_num_steps < warmup_num_steps), which would otherwise stop the run only when that stage is reached.

    Each stage's schedule lengths are its rule's ``total_num_steps``/``warmup_num_steps`` when given, else the
    previous stage's, starting from ``saved`` (the checkpoint's placed schedule, a ScheduleState) or the DeepSpeed
    config's WarmupCosineLR (``"auto"`` already replaced by --max_steps; DeepSpeed's default warm-up is 1000).

    Raises:
        UsageError: the first such stage, named with both lengths and the fix.
    """
    params = ds_cfg.get("scheduler", {}).get("params", {})
    total = saved.total_num_steps if saved is not None else params.get("total_num_steps")
    warmup = saved.warmup_num_steps if saved is not None else params.get("warmup_num_steps", 1000)
    for s in growth.stages[stage_index:]:
        total = s.schedule.total_num_steps or total
        warmup = s.schedule.warmup_num_steps or warmup
        if isinstance(total, int) and isinstance(warmup, int) and total < warmup:
            raise UsageError(
                f"stage {s.name!r} (schedule kind {s.schedule.kind!r}) would place the LR schedule with target "
                f"total_num_steps={total} < warmup_num_steps={warmup}, which growth refuses; lengthen the schedule "
                "(--max_steps when the config's total_num_steps is \"auto\", or the stage's schedule.total_num_steps) "
                "or shorten warmup_num_steps"
            )


def check_plan_fits_run(
    growth: StageList, stage_index: int, args, ds_cfg: dict, saved_schedule: Any = None, this_run: bool = True,
    batch: MicroBatch | None = None,
) -> None:  # fmt: skip
    """Refuse, before any rank starts, a plan this run cannot carry out (``this_run``: also what depends on this run
    alone: a stage that cannot fit this rank's memory with this run's micro ``batch``, ``check_stages_fit_memory``,
    and a token trigger this run's batch never reaches, ``check_token_triggers``; growlm-run, whose jobs may differ in
    nodes and batch, passes False).

    Raises:
        UsageError: fp16 at ZeRO stage 0, a scheduler other than WarmupCosineLR, a growth before step 1 or at a
            step the run never reaches (at or after --max_steps: a growth comes before the step after it), a slope
            trigger without --eval_interval, (ZeRO-3) a grown parameter above stage3_max_live_parameters, or a
            stage's LR schedule shorter than its warm-up (``check_stage_schedules``; ``saved_schedule``: the
            --resume checkpoint's placed schedule).
    """
    zero = ds_cfg.get("zero_optimization", {})
    stage = int(zero.get("stage", 0))
    if precision_of(ds_cfg) == "fp16" and stage == 0:
        raise UsageError(
            "live growth supports fp16 at ZeRO stage 1-3, not 0 (its FP16_Optimizer keeps no per-"
            "parameter Adam state that growth can read); use ds_configs/zero1_fp16.json or bf16"
        )
    if ds_cfg.get("scheduler", {}).get("type") != "WarmupCosineLR":
        raise UsageError("live growth places a WarmupCosineLR schedule; use a ds_config with that scheduler type")
    max_live = float(zero.get("stage3_max_live_parameters", 1e9))
    for s in growth.stages[stage_index:]:
        if s.when.kind == "step" and s.when.value < 1:
            raise UsageError(
                f"stage {s.name!r} grows at step {s.when.value:g}: DeepSpeed has no Adam state before "
                "the first optimizer step; grow at step >= 1 or start the plan at the grown shape"
            )
        if s.when.kind == "step" and s.when.value >= args.max_steps:
            raise UsageError(
                f"stage {s.name!r} grows after step {s.when.value:g} (before step {s.when.value + 1:g}), which this "
                f"run never reaches: it ends at --max_steps {args.max_steps}; raise --max_steps above "
                f"{s.when.value:g}, or move the stage earlier (to train in parts, give this run a plan without it)"
            )
        if s.when.kind == "slope" and not args.eval_interval:
            raise UsageError(f"stage {s.name!r} grows on the validation-loss slope; set --eval_interval")
        try:
            curve = read_val_curve(s.when.reference) if s.when.reference else None
        except MetricsFileError as e:
            raise UsageError(f"stage {s.name!r}: {e}") from None
        if curve is not None and len(curve[0]) < SLOPE_WINDOW:
            raise UsageError(
                f"stage {s.name!r}: the reference run {s.when.reference} has fewer than {SLOPE_WINDOW} validation "
                "records, too few for a rate; train it longer or with a smaller --eval_interval"
            )
        largest = largest_param_numel(s.target)
        if stage == 3 and largest > max_live:
            raise UsageError(
                f"stage {s.name!r}: the grown model has a parameter of {largest:,} elements, more than "
                f"this ds_config's stage3_max_live_parameters={max_live:,.0f}; raise it"
            )
    check_stage_schedules(growth, stage_index, ds_cfg, saved_schedule)
    if this_run:
        check_token_triggers(growth, stage_index, args, ds_cfg)
        start = growth.stages[stage_index - 1].target if stage_index else growth.start
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        check_stages_fit_memory(growth, stage_index, ds_cfg, batch or run_batch(args, ds_cfg, start, world))


def check_token_triggers(growth: StageList, stage_index: int, args, ds_cfg: dict) -> None:
    """Refuse a ``{tokens: N}`` stage this run never reaches: growth is checked before each optimizer step, so the
    last chance is before step --max_steps, with (--max_steps - 1) x global batch x --seq_len tokens consumed (the
    global batch: train_batch_size, or micro batch x accumulation x WORLD_SIZE; without --seq_len, the model's
    n_positions, an upper bound on the sequence length a run or its resume uses, so nothing is refused wrongly).

    Raises:
        UsageError: the first such stage, with the tokens it waits for and the tokens this run reaches.
    """
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    micro, gas = ds_cfg.get("train_micro_batch_size_per_gpu"), ds_cfg.get("gradient_accumulation_steps", 1)
    batch = ds_cfg.get("train_batch_size") or (micro * gas * world if micro else None)
    if not batch:
        return  # DeepSpeed derives the batch later; nothing to judge here
    model = growth.stages[stage_index - 1].target if stage_index else growth.start
    seq_len = args.seq_len or model.n_positions
    reached = (args.max_steps - 1) * batch * seq_len
    for s in growth.stages[stage_index:]:
        if s.when.kind == "tokens" and s.when.value > reached:
            raise UsageError(
                f"stage {s.name!r} grows at {s.when.value:,.0f} tokens, which this run never reaches: it consumes "
                f"{reached:,} tokens before its last step (--max_steps {args.max_steps} x {batch} sequences x "
                f"--seq_len {seq_len}); raise --max_steps, or grow at fewer tokens"
            )


def run_device() -> torch.device:
    """The device this rank will train on: the CPU when DS_ACCELERATOR is cpu or there is no CUDA, else the GPU
    numbered LOCAL_RANK."""
    if os.environ.get("DS_ACCELERATOR") == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", "0") or 0)
    return torch.device("cuda", min(local, torch.cuda.device_count() - 1))


def check_stages_fit_memory(growth: StageList, stage_index: int, ds_cfg: dict, batch: MicroBatch) -> None:
    """Refuse a stage that cannot fit this rank's memory even on an empty machine, at its growth or after it: the old
    and the grown model's parameters, gradients and Adam state (runtime.memory, ZeRO paper Fig. 1, by the config's
    ZeRO stage, precision and WORLD_SIZE; the Adam part on the host when the optimizer is offloaded) and the growth's
    working set; then the grown model's model states and the activations of one micro ``batch`` as it trains on
    (runtime.memory.activation_bytes; none are live during the growth itself); each against the device's total memory
    (the host's divided by the ranks on this node). The growth itself checks free memory again when it happens
    (growth.live.grow.check_growth_fits).

    Raises:
        UsageError: the first stage that cannot fit, with its figures.
    """
    stage, precision, offloaded = memory_settings(ds_cfg)
    world, device = int(os.environ.get("WORLD_SIZE", "1") or 1), run_device()
    old = growth.stages[stage_index - 1].target if stage_index else growth.start
    for s in growth.stages[stage_index:]:
        parts = [model_state_split(param_count(c), stage, precision, world) for c in (old, s.target)]
        work = growth_working_set_bytes(largest_param_numel(old), largest_param_numel(s.target))
        what = f"stage {s.name!r} (growing {old.shape_str()} into {s.target.shape_str()}, ZeRO-{stage}, {precision})"
        msg = placed_shortfall(parts, work, device, offloaded, what)
        if not msg:
            grown = parts[1]
            acts = activation_bytes(s.target, batch, precision)
            what = (
                f"stage {s.name!r} (training {s.target.shape_str()} after its growth, ZeRO-{stage}, {precision}), "
                f"{training_need_text(sum(grown), acts, batch)},"
            )
            fix = f"{SHORTFALL_FIX}, or a smaller micro batch, a shorter --seq_len or --activation_checkpointing"
            msg = placed_shortfall([grown], 0, device, offloaded, what, fix, acts)
        if msg:
            raise UsageError(msg)
        old = s.target


def micro_batch_of(ds_cfg: dict, world: int) -> int:
    """The micro batch per rank DeepSpeed trains with: train_micro_batch_size_per_gpu, else train_batch_size over
    gradient_accumulation_steps (1 when unset) and the ``world`` ranks, as runtime.ds_config.check_batch derives it
    (at least 1)."""
    micro = ds_cfg.get("train_micro_batch_size_per_gpu")
    if micro is None:
        gas = ds_cfg.get("gradient_accumulation_steps") or 1
        micro = (ds_cfg.get("train_batch_size") or 1) // max(world, 1) // gas
    return max(int(micro), 1)


def run_batch(args, ds_cfg: dict, cfg: ModelConfig, world: int, seq_len: int | None = None) -> MicroBatch:
    """This run's micro batch as the memory checks count it: ``micro_batch_of`` the config, ``seq_len`` (else
    --seq_len, else ``cfg``'s n_positions: train.py's default) and --activation_checkpointing."""
    t = seq_len or getattr(args, "seq_len", None) or cfg.n_positions
    return MicroBatch(micro_batch_of(ds_cfg, world), t, bool(getattr(args, "activation_checkpointing", False)))


def memory_settings(ds_cfg: dict) -> tuple[int, str, bool]:
    """(ZeRO stage, precision, optimizer offloaded to the CPU or NVMe) of a DeepSpeed config: what the model-state
    arithmetic of runtime.memory depends on besides the parameters and the ranks."""
    zero = ds_cfg.get("zero_optimization", {})
    offloaded = (zero.get("offload_optimizer") or {}).get("device") in ("cpu", "nvme")
    return int(zero.get("stage", 0)), precision_of(ds_cfg), offloaded


def check_run_fits_memory(cfg: ModelConfig, ds_cfg: dict, world: int, batch: MicroBatch) -> None:
    """Refuse a run whose model cannot train on this rank's memory even on an empty machine, before anything is built
    or written: its parameters, gradients and Adam state per rank (runtime.memory.model_state_split by the config's
    ZeRO stage, precision and ``world`` ranks; the Adam part on the host when the optimizer is offloaded) plus the
    activations of one micro ``batch`` (runtime.memory.activation_bytes: Korthikanti et al. 2022, eq. 1; on the GPU
    of a GPU rank), against the GPU's total memory and the host's total divided by the ranks on this node
    (runtime.memory.placed_shortfall: the arithmetic of the plan stages' check, ``check_stages_fit_memory``, and of
    growlm-run's, trainer.driver.fits_here). Buffers, the data and the allocator's slack are not counted: a run that
    passes may still not fit; one that fails cannot. Without this check such a run is killed by the kernel while it
    builds the model or takes its first step.

    Raises:
        UsageError: the figures (model states and activations, GiB per rank, the memory there is) and what would fit
            (``what_would_fit``).
    """
    stage, precision, offloaded = memory_settings(ds_cfg)
    device, n = run_device(), param_count(cfg)
    parts = [model_state_split(n, stage, precision, world)]
    acts = activation_bytes(cfg, batch, precision)
    what = (
        f"the model {cfg.shape_str()} ({n / 1e9:,.2f}B parameters; ZeRO-{stage}, {precision}, {world} rank(s)), "
        f"its {training_need_text(sum(parts[0]), acts, batch)},"
    )
    if placed_shortfall(parts, 0, device, offloaded, what, activations=acts):
        fix = what_would_fit(cfg, stage, precision, world, offloaded, device, batch)
        raise UsageError(placed_shortfall(parts, 0, device, offloaded, what, fix, acts))


SUGGESTED_ROOM = 1.25
"""What ``what_would_fit`` suggests leaves room for what the arithmetic does not count (buffers, the data, the
allocator's slack, the backward's temporaries): model states plus activations of at most 1 / SUGGESTED_ROOM of the
memory (80%). A margin, not a measurement. Measured: qwen2.5-0.5b on 1 rank, ZeRO-2 on a CPU, peaked at about 17.3
GiB of resident memory for 7.4 GiB (bf16) to 9.2 GiB (fp32) of model states (the sweep's micro batch was not
recorded: bf16 at 8 x 512 tokens, this arithmetic counts 16.9 GiB); llama-3.2-1b, 23.0 GiB of fp32 model states on a
23.5 GiB host, passed the model-state check alone and was killed in its first step (at its default seq_len of 131,072
its activations are hundreds of TiB)."""


def batch_change(new: MicroBatch, old: MicroBatch) -> str:
    """The flags that turn the micro batch ``old`` into ``new``, for messages ('' for none): a micro batch of N
    (train_micro_batch_size_per_gpu), --seq_len T, --activation_checkpointing, joined by 'and'."""
    flags = [f"a micro batch of {new.size} (train_micro_batch_size_per_gpu)"] if new.size != old.size else []
    flags += [f"--seq_len {new.seq_len}"] if new.seq_len != old.seq_len else []
    flags += ["--activation_checkpointing"] if new.checkpointing and not old.checkpointing else []
    return " and ".join(flags)


def batch_fixes(batch: MicroBatch, fits) -> list[tuple[str, MicroBatch]]:
    """The changes of the micro ``batch`` that make ``fits(batch)`` true, smallest change first, as (flags, batch):
    --activation_checkpointing; the largest smaller micro batch (halving); else the longest shorter --seq_len
    (halving) at this micro batch or at micro batch 1, whichever keeps more tokens (a longer sequence on a tie)."""
    out = []
    if not batch.checkpointing and fits(replace(batch, checkpointing=True)):
        out.append(replace(batch, checkpointing=True))
    micro = batch.size // 2
    while micro >= 1 and not fits(replace(batch, size=micro)):
        micro //= 2
    if micro >= 1:
        out.append(replace(batch, size=micro))
    shorter = []
    for size in {batch.size, 1}:
        t = batch.seq_len // 2
        while t >= 1 and not fits(replace(batch, size=size, seq_len=t)):
            t //= 2
        if t >= 1:
            shorter.append(replace(batch, size=size, seq_len=t))
    if shorter and micro < 1:
        out.append(max(shorter, key=lambda b: (b.size * b.seq_len, b.seq_len)))
    return [(batch_change(b, batch), b) for b in out]


def what_would_fit(
    cfg: ModelConfig, stage: int, precision: str, world: int, offloaded: bool, device: torch.device,
    batch: MicroBatch,
) -> str:  # fmt: skip
    """The fix of ``check_run_fits_memory``'s refusal, each part judged by the same arithmetic (model states plus
    activations) with room for what it does not count (``SUGGESTED_ROOM``): a smaller micro batch, --seq_len or
    --activation_checkpointing (``batch_fixes``); the largest preset of ``cfg``'s family that fits this run's settings;
    ZeRO-3 over enough ranks (on a CPU each on a host of this size: ranks on one host share its memory, so more ranks
    there do not help; activations are per rank, so the ranks must leave room for them); on a GPU the optimizer
    offloaded to the CPU when that fits (on a CPU rank it moves nothing off the host). Where this micro batch's
    activations alone take more than half the memory, the preset, ZeRO-3 and offload are judged, and named, at the
    smallest change of the batch (``batch_fixes``) whose activations take at most half."""

    def roomy(model: ModelConfig, b: MicroBatch, zero: int = stage, off: bool = offloaded) -> bool:
        p, o = model_state_split(param_count(model), zero, precision, world)
        acts = activation_bytes(model, replace(b, seq_len=min(b.seq_len, model.n_positions)), precision)
        room = SUGGESTED_ROOM
        return not placed_shortfall([(p * room, o * room)], 0, device, off, "", activations=acts * room)

    on_gpu = device.type == "cuda"
    per_rank = rank_memory_bytes(device, False) if on_gpu else psutil.virtual_memory().total
    fixes = batch_fixes(batch, lambda b: roomy(cfg, b))
    ways = [flags for flags, _ in fixes]
    at, said = batch, ""
    if activation_bytes(cfg, batch, precision) * SUGGESTED_ROOM > per_rank / 2:  # the batch leaves no room
        smaller = batch_fixes(batch, lambda b: activation_bytes(cfg, b, precision) * SUGGESTED_ROOM <= per_rank / 2)
        if smaller:
            flags, at = smaller[0]
            said = f" with {flags}"
    n_model = param_count(cfg)
    fits = [(param_count(c), name, c) for name, c in family(cfg).presets.items() if param_count(c) < n_model]
    fits = [(n, name, c) for n, name, c in fits if roomy(c, at)]
    if fits:
        n, name, c = max(fits, key=lambda f: f[0])
        b = replace(at, seq_len=min(at.seq_len, c.n_positions))
        need = model_state_bytes(n, stage, precision, world) + activation_bytes(c, b, precision)
        change = batch_change(b, batch)
        ways.append(
            f"a smaller preset ({name}, {n / 1e9:,.2f}B parameters, about {need / GIB:,.1f} GiB per rank here"
            f"{' with ' + change if change else ''})"
        )
    acts = activation_bytes(cfg, at, precision)
    states = model_state_bytes(n_model, 3, precision, 1)  # ZeRO-3 divides all of it by the ranks
    left = per_rank / SUGGESTED_ROOM - acts  # what a rank has for its share of the model states
    if left > 0:
        ranks = max(world + 1, math.ceil(states / left))
        where = "GPUs" if on_gpu else "ranks, each on a host of this size (ranks on one host share its memory)"
        ways.append(f"ZeRO-3 (ds_configs/zero3_{precision}.json) on {ranks} {where}{said}")
    note = ""
    if on_gpu and not offloaded and stage >= 1 and roomy(cfg, at, off=True):
        shipped = DS_CONFIG_DIR / f"zero{stage}_{precision}_offload.json"
        name = f"ds_configs/{shipped.name}" if shipped.is_file() else 'offload_optimizer: {"device": "cpu"}'
        ways.append(f"the optimizer offloaded to the CPU ({name}){said}")
    elif not on_gpu:
        note = "; CPU offload moves nothing off a CPU rank's host"
    if not ways:
        ways.append(f"a machine with more memory (this micro batch alone needs {size_text(acts)})")
    room = f"model states and activations within {100 / SUGGESTED_ROOM:.0f}% of the memory"
    return f"it cannot fit; what would ({room}): " + ", or ".join(ways) + note


def check_stop_stage(name: str | None, growth: StageList | None, stage_index: int) -> str | None:
    """The --stop_before_stage NAME (None without it): a stage of the plan not yet done.

    Raises:
        UsageError: no --growth_plan, or no stage NAME among the stages still to come.
    """
    if name is None:
        return None
    ahead = [s.name for s in growth.stages[stage_index:]] if growth is not None else []
    if name not in ahead:
        raise UsageError(
            f"--stop_before_stage {name}: no such stage ahead in --growth_plan (stages still to come: {ahead}); "
            "name one of them, or give --growth_plan"
        )
    return name
