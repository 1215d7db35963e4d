"""Growth events of a run with --growth_plan: the trigger of the next stage (step, tokens or validation-loss slope),
the live growth itself (growth.live.grow.grow_engine, which makes its checks through
growth.ops.preparation.prepare_growth), and
its record (metrics.jsonl "growth" event, TensorBoard, console, and the RunState growth history).

When to grow is described in DESIGN.md, section "When to grow"; what a growth carries in section "What growth
carries".
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from growlm.growth.live.grow import GROWTH_PHASES, GrowthResult, collect_old_engine, grow_engine
from growlm.growth.stages.plan import Stage
from growlm.growth.stages.trigger import stage_due
from growlm.model.config import ModelConfig, param_count
from growlm.runtime import collectives, peers
from growlm.runtime.process_memory import CUDA_MEMORY_KEYS, peak_rss_bytes
from growlm.trainer.config import RunConfig
from growlm.trainer.logger import MetricsLogger
from growlm.trainer.loop import Batches, Progress, fixed_batch_loss

# growth/<key> in TensorBoard: the growth, then its cost per phase (growth.live.grow.GrowthResult) and the peak RSS
GROWTH_SCALARS = ("loss_before", "loss_after", "seconds", "bytes_moved", "params_to", "peak_rss_bytes_all_ranks")
GROWTH_SCALARS += tuple(f"{phase}_{unit}" for phase in GROWTH_PHASES for unit in ("s", "bytes"))


def next_stage(p: Progress, run: RunConfig) -> Stage | None:
    """The plan's next stage if it is due now (growth.stages.trigger.stage_due), else None. A due stage waits while
    the masks of an earlier growth still ramp (the model still has masks)."""
    if run.growth is None or p.stage_index >= len(run.growth.stages):
        return None
    stage = run.growth.stages[p.stage_index]
    if p.engine.module.growth_masks is not None:
        return None
    return stage if stage_due(stage, p.step, p.consumed * run.seq_len, p.slope_points) else None


@dataclass(frozen=True)
class GrowthEvent:
    """One live growth: the shape grown from, grow_engine's result, the fixed-batch loss before and after (eval-mode
    loss of the step's first micro batch averaged over ranks, on the old and on the grown model), this rank's host
    peak RSS before it (bytes, runtime.process_memory.peak_rss_bytes) and every rank's ``GrowthResult.cuda_memory``,
    in rank order."""

    old: ModelConfig
    result: GrowthResult
    loss_before: float
    loss_after: float
    rss_before: int
    cuda_memory_per_rank: list[dict[str, int | None]]


def grow(p: Progress, stage: Stage, run: RunConfig, data: Batches) -> GrowthEvent:
    """Grow the live engine of ``p`` into ``stage.target`` on every rank (a collective) and update ``p``: engine,
    shape, stage index, placed schedule, slope history (cleared) and growth history.

    Raises:
        GrowthError: see growth.live.grow.grow_engine.
    """
    x, y = data.micro_batch(p.consumed, 0)
    loss_before = fixed_batch_loss(p.engine, x, y, data.info)
    old, rss_before = p.model, peak_rss_bytes()
    result = grow_engine(
        p.engine,
        stage.rules(old, run.growth.seed),
        functools.partial(run.build_engine, partitioned=run.zero_stage == 3),
        policy=stage.optimizer,
        schedule_rule=stage.schedule,
        ramp_steps=stage.ramp_steps or None,
        rewarm=p.schedule,
    )
    p.engine, p.model, p.schedule = result.engine, stage.target, result.schedule
    result = collect_old_engine(result)  # p.engine was the last reference to the old engine
    p.stage_index += 1
    p.slope_points.clear()
    p.history.append(
        {"step": p.step, "stage": stage.name, "family": stage.family, "live": True, "from": old.to_dict(),
         "to": p.model.to_dict()}
    )  # fmt: skip
    loss_after = fixed_batch_loss(p.engine, x, y, data.info)
    cuda_memory = collectives.all_gather_object(result.cuda_memory)
    return GrowthEvent(old, result, loss_before, loss_after, rss_before, cuda_memory)


def growth_record(p: Progress, stage: Stage, event: GrowthEvent, seq_len: int) -> dict[str, Any]:
    """The "growth" record of metrics.jsonl for ``event``, a growth into ``p.model`` at ``p.step``: shapes, losses,
    cost (``seconds``, ``bytes_moved``; per phase of growth.live.grow.GROWTH_PHASES ``<phase>_s`` and
    ``<phase>_bytes``, as growth.live.grow.GrowthResult defines them; ``build_<part>_s``: the engine build split;
    ``collectives``: gather collectives), memory (``max_rss_bytes_before`` / ``max_rss_bytes``: rank 0's host peak
    RSS before and after; ``peak_rss_bytes_all_ranks``: the largest host peak RSS of any rank; ``<key>_per_rank`` for
    each of runtime.process_memory.CUDA_MEMORY_KEYS: every rank's CUDA allocated / reserved bytes before, at the
    growth's own peak and after, null without CUDA) and whether the grown model recomputes its blocks' activations
    (``activation_checkpointing``)."""
    old = event.old
    return {
        "event": "growth",
        "step": p.step,
        "stage": stage.name,
        "family": stage.family,
        "from": old.to_dict(),
        "to": p.model.to_dict(),
        "params_from": param_count(old),
        "params_to": param_count(p.model),
        "loss_before": event.loss_before,
        "loss_after": event.loss_after,
        "seconds": event.result.seconds,
        "bytes_moved": event.result.bytes_moved,
        "max_rss_bytes_before": event.rss_before,
        "max_rss_bytes": peak_rss_bytes(),
        "peak_rss_bytes_all_ranks": event.result.peak_rss_bytes,  # host RSS peak, max over ranks
        **{f"{k}_per_rank": [m[k] for m in event.cuda_memory_per_rank] for k in CUDA_MEMORY_KEYS},
        **{f"{k}_s": v for k, v in event.result.phase_seconds.items()},  # rank 0's seconds per phase
        **{f"{k}_bytes": v for k, v in event.result.phase_bytes.items()},
        **{f"build_{k}_s": v for k, v in event.result.build_seconds.items()},  # the build split (BUILD_SPLIT)
        "collectives": event.result.collectives,
        "activation_checkpointing": bool(getattr(p.engine.module, "activation_checkpointing", False)),
        "lr": p.engine.get_lr()[0],
        "tokens": p.consumed * seq_len,
        "flops": p.consumed_flops,
    }


def maybe_grow(p: Progress, run: RunConfig, data: Batches, log: MetricsLogger) -> None:
    """Before the next optimizer step: grow if the plan's next stage is due, and log the growth."""
    stage = next_stage(p, run)
    if stage is None:
        return
    with peers.doing(f"the live growth of stage {stage.name!r} at step {p.step}"):
        event = grow(p, stage, run, data)
    if not log.enabled:
        return
    old = event.old
    rec = growth_record(p, stage, event, run.seq_len)
    scalars = (*GROWTH_SCALARS, "collectives", *(k for k in rec if k.startswith("build_")))
    log.log(rec, {f"growth/{k}": rec[k] for k in scalars})
    log.text(
        "growth", f"step {p.step}: {stage.name} ({stage.family}) {old.shape_str()} -> {p.model.shape_str()}", p.step
    )
    log.console(
        f"growlm: step {p.step}: grew {old.shape_str()} -> {p.model.shape_str()} ({stage.family}, {stage.name}) in "
        f"{event.result.seconds:.1f} s; fixed-batch loss {event.loss_before:.6f} -> {event.loss_after:.6f}"
    )
