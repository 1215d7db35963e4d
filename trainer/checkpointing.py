"""Save and restore a whole run through runtime.checkpoint and RunState (growlm_state.json).

A checkpoint holds DeepSpeed's files (weights, Adam state, LR scheduler, loss scaler), one RNG file per rank and the
RunState: shape, data position, FLOPs, growth stage, masks, the placed LR schedule, slope history and growth
history. What growth adds to it is described in DESIGN.md, section "What growth carries".
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from growlm.runtime import checkpoint, peers
from growlm.runtime.dist import DistInfo
from growlm.runtime.run_state import DataIdentity, RunState
from growlm.runtime.schedule import ScheduleState, apply_schedule, checkpoint_schedule, engine_schedule
from growlm.trainer.config import RunConfig
from growlm.trainer.errors import RankError
from growlm.trainer.loop import Progress

RESEED_STRIDE = 7919  # per-step offset of the fresh dropout seed after a resume at another world size


def restore(engine: Any, run: RunConfig, info: DistInfo) -> Progress:
    """The run's starting point on a freshly built ``engine``: the --resume checkpoint loaded into it (weights, Adam
    state, LR position, loss scaler, this rank's RNG, mask ramp, placed schedule), or step 0 of a fresh run.

    Seeds this rank's dropout stream: ``seed + 1 + rank`` for a fresh run; after a resume at another world size
    (no RNG file per rank to restore) ``seed + 1 + rank + 7919 * global_step``.

    Raises:
        CheckpointError: DeepSpeed loaded nothing, a refused RNG file, or DeepSpeed's global step differs from
            growlm_state.json's (a tag folder mixing two checkpoints).
    """
    if run.resume is None:
        torch.manual_seed(run.seed + 1 + info.rank)  # per-rank dropout stream
        return Progress(engine=engine, model=run.model, step=engine.global_steps, stage_index=run.stage_index)
    state = checkpoint.load(engine, run.resume, rank=info.rank, world_size=info.world_size)
    if state.world_size != info.world_size:  # no RNG file per rank to restore: a fresh stream per rank
        torch.manual_seed(run.seed + 1 + info.rank + RESEED_STRIDE * state.global_step)
    engine.module.set_growth_step(state.global_step)
    schedule = None
    if state.schedule:  # a growth placed the schedule; DeepSpeed restored only its position
        schedule = replace(state.schedule, last_batch_iteration=engine.lr_scheduler.last_batch_iteration)
        given = checkpoint_schedule(None, run.ds_config, schedule.last_batch_iteration)
        if run.new_schedule and given is not None:  # the config's lengths, the placed position and re-warm
            schedule = replace(schedule, **{k: getattr(given, k) for k in SCHEDULE_SHAPE})
        apply_schedule(engine, schedule, state.global_step)
    elif run.new_schedule:  # the loaded LR of the next step is the checkpoint schedule's: set the config's
        given = checkpoint_schedule(None, run.ds_config, engine.lr_scheduler.last_batch_iteration)
        if given is not None:
            apply_schedule(engine, given, state.global_step)
    if engine.global_steps != run.start_step:
        raise checkpoint.CheckpointError(
            f"DeepSpeed restored global step {engine.global_steps}, growlm_state.json says {run.start_step}: the tag "
            "folder mixes files of two checkpoints; resume from another tag"
        )
    return Progress(
        engine=engine,
        model=run.model,
        step=engine.global_steps,
        consumed=state.consumed_samples,
        consumed_flops=state.consumed_flops,
        stage_index=run.stage_index,
        schedule=schedule,
        slope_points=list(state.slope_points),
        history=list(state.growth),
        extra=state.extra,
    )


SCHEDULE_SHAPE = ("total_num_steps", "warmup_num_steps", "warmup_min_ratio", "cos_min_ratio", "warmup_type")


def _lengths(s: ScheduleState) -> str:
    return f"total_num_steps {s.total_num_steps}, warmup_num_steps {s.warmup_num_steps}"


def schedule_note(p: Progress, run: RunConfig) -> str | None:
    """The console line that says what happened to the LR schedule at the start (None when nothing needs saying).

    A resume whose --ds_config gives another schedule than the checkpoint's (another --max_steps under ``"auto"``,
    another warm-up): the LR of the next step on the checkpoint's schedule, which the run keeps
    (trainer.config.keep_saved_scheduler), and on the config's, which --new_schedule takes; the line says which
    one the run trains on. A fresh run whose WarmupCosineLR is shorter than its warm-up (which DeepSpeed accepts):
    that growlm-grow will need --total_num_steps to grow its checkpoints. Call after ``restore``.
    """
    lbi = getattr(p.engine.lr_scheduler, "last_batch_iteration", None)
    if run.resume_state is None:
        s = checkpoint_schedule(None, run.ds_config, 1)
        if s is None or s.total_num_steps >= s.warmup_num_steps or run.growth is not None:
            return None
        return (
            f"growlm: note: the LR schedule ends inside its warm-up ({_lengths(s)}); DeepSpeed trains it, but "
            f"growing a checkpoint of this run with growlm-grow needs --total_num_steps N >= {s.warmup_num_steps}"
        )
    state = run.resume_state
    if lbi is None:
        return None
    saved = state.schedule or checkpoint_schedule(None, state.ds_config, lbi)
    given = checkpoint_schedule(None, {"scheduler": run.config_scheduler}, lbi)
    if saved is None or given is None:
        saved_kind = ((state.ds_config or {}).get("scheduler") or {}).get("type")
        given_kind = (run.config_scheduler or {}).get("type")
        if saved_kind == given_kind and (state.schedule is not None or saved_kind is None):
            return None
        if run.new_schedule:
            return f"growlm: --new_schedule: the run trains with --ds_config's scheduler {given_kind}, not {saved_kind}"
        return f"growlm: --resume keeps the checkpoint's LR scheduler ({saved_kind}); --new_schedule takes {given_kind}"
    saved = replace(saved, last_batch_iteration=lbi)
    given = replace(saved, **{k: getattr(given, k) for k in SCHEDULE_SHAPE})
    if all(getattr(saved, k) == getattr(given, k) for k in SCHEDULE_SHAPE):
        return None
    peak = float(((run.ds_config.get("optimizer") or {}).get("params") or {}).get("lr", 1.0))
    old, new = peak * saved.ratio(p.step), peak * given.ratio(p.step)
    if run.new_schedule:
        return (
            f"growlm: --new_schedule: the LR of step {p.step + 1} moves from {old:.2e} (the checkpoint's schedule: "
            f"{_lengths(saved)}) to {new:.2e} (--ds_config's: {_lengths(given)})"
        )
    return (
        f"growlm: --resume keeps the checkpoint's LR schedule ({_lengths(saved)}): LR {old:.2e} at step "
        f"{p.step + 1}; --ds_config gives {_lengths(given)} (LR {new:.2e} at step {p.step + 1}): pass --new_schedule "
        "to train on that one"
    )


def run_state(p: Progress, run: RunConfig, info: DistInfo, train_sha256: str | None) -> RunState:
    """The RunState of the run at ``p`` (``train_sha256``: the sha256 of the token folder's train split)."""
    schedule = None
    if p.schedule is not None:
        schedule = engine_schedule(p.engine, p.schedule.rewarm_start, p.schedule.rewarm_steps)
    init_from = run.init_from.identity if run.init_from is not None else None
    if run.resume_state is not None:
        init_from = run.resume_state.init_from  # a resumed run keeps where its first weights came from
    return RunState(
        model_config=p.model,
        global_step=p.step,
        consumed_samples=p.consumed,
        seq_len=run.seq_len,
        world_size=info.world_size,
        zero_stage=run.zero_stage,
        seed=run.seed,
        precision=run.precision,
        consumed_flops=p.consumed_flops,
        slope_points=list(p.slope_points),
        growth_masks=p.engine.module.growth_masks,
        growth_stage=p.stage_index,
        schedule=schedule,
        data=DataIdentity(dir=str(run.data_dir), train_sha256=train_sha256),
        ds_config=run.ds_config,
        init_from=init_from,
        growth=p.history,
        extra=p.extra,
    )


def save(p: Progress, run: RunConfig, info: DistInfo, train_sha256: str | None) -> Path:
    """Save the run at ``p`` as tag ``global_step<N>`` under --out_dir's checkpoints/ (a collective).

    Returns:
        The tag folder.

    Raises:
        CheckpointError: the tag exists, the folder is not visible on every node, or writing failed (disk full:
            the message says "no space left on device" and names the folder; runtime.checkpoint.save).
        RankError: writing failed on a rank other than 0 (a node-local disk may be full on some nodes only), so that
            rank reports it too.
    """
    try:
        with peers.doing(f"the save of checkpoint {checkpoint.tag_for(p.step)}"):
            return checkpoint.save(p.engine, run.save_dir, run_state(p, run, info, train_sha256), rank=info.rank)
    except checkpoint.CheckpointSaveError as e:
        if info.rank == 0:
            raise
        raise RankError(f"rank {info.rank}: {e}") from None
