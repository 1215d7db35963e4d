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

from growlm.runtime import checkpoint
from growlm.runtime.dist import DistInfo
from growlm.runtime.run_state import DataIdentity, RunState
from growlm.runtime.schedule import apply_schedule, engine_schedule
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
        apply_schedule(engine, schedule, state.global_step)
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
        return checkpoint.save(p.engine, run.save_dir, run_state(p, run, info, train_sha256), rank=info.rank)
    except checkpoint.CheckpointSaveError as e:
        if info.rank == 0:
            raise
        raise RankError(f"rank {info.rank}: {e}") from None
