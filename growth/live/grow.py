"""Live growth of a ZeRO-sharded run: gather the old engine's shards, expand them, write them into a new engine.

``growth.live.transfer.transfer`` moves the training state: every rank contributes its own fragments of the fp32
masters and Adam moments, gathered in buckets of consecutive parameters (one collective per bucket, weight and both
moments together); the growth plan's rule computes the grown tensors (identically on every rank: new random
entries are seeded by parameter name, not by the global RNG); each rank writes only its own fragment of the new
engine. Rules that only keep or zero a tensor of unchanged shape (depth growth) are applied at ZeRO-3 from the
rank's own old partition, without communication. A rank holds its old shard, its new shard and a bounded working
set (growth.live.transfer.BUCKET_BYTES), never a whole model (DESIGN.md, "DeepSpeed facts"; for ZeRO-1/2 the module
itself is unpartitioned, as always in those stages).

The new engine is built for the grown config by ``deepspeed.initialize`` (ZeRO-3: inside ``zero.Init``, so it is
partitioned as it is built), without the random weight init its parameters would get only to be overwritten
(``runtime.engine.build_engine(..., uninitialised=True)``); growlm never asks DeepSpeed to load old-shape buffers into
it (DESIGN.md, "Checkpoint failure kinds: parameter count changed"). What DeepSpeed leaves undone is done here, each
beside its DeepSpeed call:

* optimizer state is created lazily by the first ``step()``: ``ensure_adam_state`` creates exp_avg, exp_avg_sq and
  the Adam step in the inner torch optimizer first, so the moments can be written and the step carried;
* ``safe_set_full_fp32_param`` updates the fp32 master only: ``refresh_working_copies`` copies masters into the
  bf16/fp16/fp32 working parameters that the forward pass uses (ZeRO-1/2/bf16: ``update_lp_params``; ZeRO-3: each
  subgroup's partition), so the master and the working copy agree and a training step keeps the grown values
  (DESIGN.md, "Checkpoint failure kinds: stale fp32 master");
* global step, samples, skipped steps and the fp16 loss scaler are copied; the LR schedule is placed by the
  stage's rule (runtime.schedule) before the first post-growth step;
* the old engine is released (runtime.engine.release_engine: destroyed, its ZeRO-3 hooks removed, its module taken
  out of DeepSpeed's module stack) and collected before training continues, so its memory returns (DESIGN.md,
  "Checkpoint failure kinds: stale ZeRO-3 hooks").

The host memory DeepSpeed's build of the new engine frees is returned to the OS (``release_heap``, glibc
``malloc_trim``) before the growth allocates anything else. A CPU rank's malloc keeps freed memory in its heap
(runtime.dist.keep_freed_memory: no mmap, trimmed only above 2 GiB), and building a ZeRO-1/2 engine frees large
transients: the module's own per-parameter 16-bit tensors once DeepSpeed has copied them into its flat group (resident
on every rank but 0, where DeepSpeed's broadcast of the parameters from rank 0 wrote them) and the optimizer's staging
copies. The growth's next allocations (the new Adam state's flat partitions, the gather's buffers) fit only partly into
those holes, and the rest sat under the growth's peak, which runtime.memory's formula (old + new model states + working
set) does not count. Measured for width x2 (52.6M -> 193.2M parameters, ZeRO-2 bf16, 2 ranks on a CPU; growth_scaling's
command in docs/benchmarks.md): right after the build 625 MiB (rank 0) and 926 MiB (rank 1) were resident but free
(VmRSS before and after a ``malloc_trim``), and rank 1's peak above its base RSS was 2,819-2,907 MiB in five runs, above
the formula's 2,749 MiB; with the heap returned the larger rank's was 2,563-2,692 MiB in three (docs/benchmarks.md).

``GrowthResult`` carries the cost of each phase (build, gather, expand, write, refresh, teardown: seconds and bytes)
and the peak RSS over ranks; the trainer writes them into the growth record.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from growlm.growth.errors import GrowthError
from growlm.growth.live.transfer import EngineStore, link_optimizer_state, transfer
from growlm.growth.ops.apply import OptimizerPolicy
from growlm.growth.ops.preparation import prepare_growth
from growlm.growth.ops.rules import RuleSet
from growlm.growth.ops.schedule_rule import ScheduleRule
from growlm.growth.ops.stores import adam_step_tensor
from growlm.model.config import largest_param_numel, param_count
from growlm.model.masks import MaskSpec
from growlm.runtime import collectives
from growlm.runtime.crash_points import hold_point
from growlm.runtime.engine import inner_optimizer, release_engine, repair_adam_steps
from growlm.runtime.memory import growth_working_set_bytes, model_state_split, placed_bytes, shortfall
from growlm.runtime.process_memory import (
    CUDA_MEMORY_KEYS,
    cuda_memory_bytes,
    finish_cuda_peak,
    peak_rss_bytes,
    release_heap,
    release_pinned_host_memory,
    rss_bytes,
    start_cuda_peak,
)
from growlm.runtime.schedule import ScheduleState, apply_schedule, engine_schedule

__all__ = ["EngineStore", "GrowthResult", "collect_old_engine", "ensure_adam_state", "grow_engine"]

LOSS_SCALER_FIELDS = ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis")


def ensure_adam_state(engine: Any, adam_step: int) -> None:
    """Create Adam's state (zero exp_avg / exp_avg_sq) for every tensor of the inner torch optimizer, as its first
    ``step()`` would, and set its step counter to ``adam_step``. Works for torch Adam/AdamW (tensor step) and
    DeepSpeed's fused/CPU Adam (int step)."""
    opt = inner_optimizer(engine)
    tensor_step = isinstance(opt, torch.optim.Adam | torch.optim.AdamW)
    # the tensors Adam steps: ZeRO-3 swaps its flat fp32 partitions into param_groups only around each step
    tensors = getattr(engine.optimizer, "fp32_partitioned_groups_flat", None)
    if tensors is None:
        tensors = [p for group in opt.param_groups for p in group["params"]]
    for p in tensors:
        if p.numel():
            st = opt.state[p]
            if "exp_avg" not in st:
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["step"] = adam_step_tensor(opt, adam_step, p) if tensor_step else adam_step
    link_optimizer_state(engine)


def adam_step_of(engine: Any) -> int:
    """The Adam step counter (optimizer steps taken) of an engine; 0 before the first step."""
    for st in inner_optimizer(engine).state.values():
        if "step" in st:
            return int(st["step"])
    return 0


def refresh_working_copies(engine: Any, *, replicated_done: bool = False) -> None:
    """Copy the fp32 master partitions into the parameters the forward pass uses (after ``safe_set_full_fp32_param``,
    which only writes the master). ``replicated_done``: ZeRO-1/2's whole working model was already written on every
    rank (growth.live.transfer.TransferStats.working_copies_written), so its all-gather is skipped."""
    opt = engine.optimizer
    if hasattr(opt, "_reassign_or_swap_out_partitioned_parameters"):  # ZeRO-3
        for i in range(len(opt.fp16_groups)):
            opt._reassign_or_swap_out_partitioned_parameters(i)
    elif hasattr(opt, "update_lp_params") and not replicated_done:  # ZeRO-1/2, bf16 optimizer
        opt.update_lp_params()


def copy_loss_scaler(old: Any, new: Any) -> dict[str, Any] | None:
    """Carry the fp16 dynamic loss scaler (cur_scale, cur_iter, last_overflow_iter, cur_hysteresis) from engine
    ``old`` to ``new``; returns what was carried (None without fp16)."""
    src = getattr(old.optimizer, "loss_scaler", None)
    dst = getattr(new.optimizer, "loss_scaler", None)
    if src is None or dst is None or not getattr(src, "dynamic", False):
        return None
    carried = {k: getattr(src, k) for k in LOSS_SCALER_FIELDS if hasattr(src, k)}
    for k, v in carried.items():
        setattr(dst, k, v)
    if hasattr(new.optimizer, "cur_scale"):  # stage 0 FP16_Optimizer keeps its own copy
        new.optimizer.cur_scale = carried.get("cur_scale", new.optimizer.cur_scale)
    return carried


GROWTH_PHASES = ("build", "gather", "expand", "write", "refresh", "teardown")


@dataclass(frozen=True)
class GrowthResult:
    """What one live growth did: the new engine, its mask spec and schedule, and its cost.

    ``phase_seconds`` and ``phase_bytes`` are keyed by ``GROWTH_PHASES`` (this rank's wall seconds; every phase is a
    disjoint part of ``seconds``):

    * build: ``build(config, masks)``, returning the heap it freed (``release_heap``) and creating the new engine's
      Adam state; bytes: RSS growth (VmRSS after - before, may be negative when freed memory is reused or returned);
      split in ``build_seconds`` (runtime.engine.BUILD_SPLIT plus ``adam_state``);
    * gather: reading the old engine's shards (growth.live.shards.gather_bucket, ``collectives`` in all); bytes: full
      fp32 tensors assembled (weights + both moments, = ``bytes_moved``; 0 for locally applied rules);
    * expand: the plan's rules computing grown full tensors; bytes: the grown full fp32 tensors produced (locally
      applied rules excluded);
    * write: each rank's fragments written into the new engine, locally applied rules included; bytes: the grown
      model's fp32 weights and moments, 12 x its parameters, however computed;
    * refresh: master -> working copies, counters, loss scaler, Adam steps and LR schedule; bytes: RSS growth;
    * teardown: ``runtime.engine.release_engine`` of the old engine and the closing barrier, plus, once
      ``collect_old_engine`` ran, the ``gc.collect()`` that frees it and the ``malloc_trim`` that returns the freed
      heap to the OS; bytes: RSS returned (VmRSS before - after; can be 0 or negative).

    ``peak_rss_bytes`` is the largest host peak RSS (ru_maxrss) of any rank at the end of the growth.

    ``cuda_memory`` is this rank's CUDA memory (``CUDA_MEMORY_KEYS``, bytes; every value None without CUDA): allocated
    and reserved before the growth, at the growth's own peak (CUDA's peak statistics are reset when it starts), and
    after it; ``collect_old_engine`` takes the "after" numbers once the old engine is freed and its cached blocks are
    returned to the driver (``torch.cuda.empty_cache``).
    """

    engine: Any
    masks: MaskSpec | None
    schedule: ScheduleState
    loss_scaler: dict[str, Any] | None
    seconds: float
    bytes_moved: int  # full fp32 tensors gathered from the old engine (weights + both moments), bytes
    phase_seconds: dict[str, float] = field(default_factory=dict)
    phase_bytes: dict[str, int] = field(default_factory=dict)
    peak_rss_bytes: int = 0
    build_seconds: dict[str, float] = field(default_factory=dict)
    collectives: int = 0
    cuda_memory: dict[str, int | None] = field(default_factory=lambda: dict.fromkeys(CUDA_MEMORY_KEYS))


def grow_engine(
    old: Any,
    plan: RuleSet,
    build: Callable[..., Any],
    *,
    policy: OptimizerPolicy,
    schedule_rule: ScheduleRule,
    ramp_steps: int | None = None,
    rewarm: ScheduleState | None = None,
) -> GrowthResult:
    """Grow a live engine into a new one built for ``plan.new``; a collective (every rank, same arguments).

    Args:
        old: the running DeepSpeed engine (after at least one optimizer step).
        plan: the growth plan from the old engine's config (growth.ops.make_rules).
        build: ``build(config, masks, uninitialised=True)`` -> a new DeepSpeed engine for that config (its
            scheduler from the ds config), its weights left for the growth to write (``runtime.engine.build_engine``).
        policy: Adam-state policy (growth.ops.apply.OptimizerPolicy).
        schedule_rule: where the LR schedule goes (growth.ops.schedule_rule.ScheduleRule).
        ramp_steps: mask ramp length for the masked family (default: the plan's).
        rewarm: the schedule state of the last growth, whose re-warm may still run (position and schedule
            arguments are read from the old engine's scheduler).

    Returns:
        GrowthResult; the old engine is released (runtime.engine.release_engine) and must not be used again. The
        caller's own references keep it alive until it drops them: then ``collect_old_engine(result)`` frees it.

    Raises:
        GrowthError: before any new engine is built: no optimizer step yet, or a mask ramp still running.
    """
    t0 = time.perf_counter()
    step = old.global_steps
    if step < 1 or adam_step_of(old) < 1:
        raise GrowthError(
            f"growth at global step {step} with {adam_step_of(old)} Adam steps: DeepSpeed creates Adam's state in the "
            "first optimizer step that is not skipped (fp16 overflows skip steps); grow later"
        )
    check_growth_fits(old, plan)
    cuda_memory = start_cuda_peak()  # after the refusals above: a refused growth leaves the statistic alone
    module = old.module
    current = engine_schedule(old, rewarm.rewarm_start, rewarm.rewarm_steps) if rewarm else engine_schedule(old)
    prep = prepare_growth(
        plan,
        module.config,
        step,
        masks=getattr(module, "growth_masks", None),  # the module drops its masks when their ramp reaches 1
        schedule=current,
        rule=schedule_rule,
        ramp_steps=ramp_steps,
    )
    masks, sched = prep.masks, prep.schedule
    secs: dict[str, float] = {}
    nbytes: dict[str, int] = {}
    t, rss = time.perf_counter(), rss_bytes()
    new = build(plan.new, masks, uninitialised=True)  # every parameter is written by transfer() below
    release_heap()  # the build's freed transients go back before the Adam state and the gather (module docstring)
    t_adam = time.perf_counter()
    ensure_adam_state(new, adam_step_of(old))
    split = {**getattr(new, "growlm_build_seconds", {}), "adam_state": time.perf_counter() - t_adam}
    secs["build"], nbytes["build"] = time.perf_counter() - t, rss_bytes() - rss
    moved = transfer(plan, old, new, policy)
    secs["gather"], nbytes["gather"] = moved.gather_s, moved.gathered_bytes
    secs["expand"], nbytes["expand"] = moved.expand_s, moved.expanded_bytes
    secs["write"], nbytes["write"] = moved.write_s, moved.written_bytes
    hold_point("live.applied")  # test-only (runtime.crash_points): killed mid-growth, the last checkpoint resumes
    t, rss = time.perf_counter(), rss_bytes()
    scaler = carry_training_state(old, new, sched, step, masks is not None, moved.working_copies_written)
    secs["refresh"], nbytes["refresh"] = time.perf_counter() - t, rss_bytes() - rss
    t, rss = time.perf_counter(), rss_bytes()
    release_engine(old)  # freed by collect_old_engine once the caller drops its reference (runtime.engine)
    del old, module
    collectives.barrier()
    secs["teardown"], nbytes["teardown"] = time.perf_counter() - t, rss - rss_bytes()
    peak = collectives.all_reduce(torch.tensor([peak_rss_bytes()], dtype=torch.float64), op="max")
    return GrowthResult(
        engine=new,
        masks=masks,
        schedule=sched,
        loss_scaler=scaler,
        seconds=time.perf_counter() - t0,
        bytes_moved=moved.gathered_bytes,
        phase_seconds={k: secs[k] for k in GROWTH_PHASES},
        phase_bytes={k: nbytes[k] for k in GROWTH_PHASES},
        peak_rss_bytes=int(peak.item()),
        build_seconds=split,
        collectives=moved.collectives,
        cuda_memory=finish_cuda_peak(cuda_memory),
    )


def check_growth_fits(old: Any, plan: RuleSet) -> None:
    """Refuse, before anything is allocated, a growth whose new engine and working set do not fit this rank's free
    memory (runtime.memory: the grown model's parameters, gradients and Adam state by ZeRO stage, on the engine's
    device, the optimizer part on the host when it is offloaded; the gather's working set where the tensors are
    expanded, the process group's device). A collective:
    every rank learns every rank's verdict and all refuse alike, so none waits in a growth another abandoned.

    Raises:
        GrowthError: on every rank, with the first rank's figures that do not fit.
    """
    stage = old.zero_optimization_stage()
    precision = "bf16" if old.bfloat16_enabled() else "fp16" if old.fp16_enabled() else "fp32"
    device = next(old.module.parameters()).device
    pg, opt = model_state_split(param_count(plan.new), stage, precision, collectives.world_size())
    work = growth_working_set_bytes(largest_param_numel(plan.old), largest_param_numel(plan.new))
    what = f"growing {plan.old.shape_str()} into {plan.new.shape_str()} (ZeRO-{stage}, {precision})"
    on_gpu = device.type == "cuda"
    gpu, host = placed_bytes(pg, opt, work, on_gpu, on_gpu and bool(old.zero_offload_optimizer()))
    msg = (shortfall(gpu, device, True, what) if on_gpu else "") or shortfall(host, torch.device("cpu"), True, what)
    verdicts = collectives.all_gather_object(msg)
    refused = [(r, m) for r, m in enumerate(verdicts) if m]
    if refused:
        rank, msg = refused[0]
        raise GrowthError(f"rank {rank}: {msg}")


def collect_old_engine(result: GrowthResult) -> GrowthResult:
    """Free the engine a growth replaced, once the caller holds no reference to it (call it right after swapping
    ``result.engine`` in): DeepSpeed's engine, optimizer and module reference each other in cycles that only
    ``gc.collect()`` frees; then ``release_heap`` gives the freed memory back to the OS, and on CUDA
    ``torch.cuda.empty_cache`` returns the old engine's cached blocks and ``release_pinned_host_memory`` its pinned
    host blocks (an offloaded optimizer's fp32 partitions and CPU-Adam state). Returns ``result`` with the seconds
    added to ``seconds`` and to the teardown phase, the RSS returned added to the teardown bytes, and the CUDA peak
    and "after" bytes of ``cuda_memory`` read now."""
    t, rss = time.perf_counter(), rss_bytes()
    gc.collect()
    release_heap()
    if cuda_memory_bytes() is not None:
        torch.cuda.empty_cache()  # the old engine's blocks, cached by the allocator, go back to the driver
        release_pinned_host_memory()
    dt = time.perf_counter() - t
    secs = {**result.phase_seconds, "teardown": result.phase_seconds.get("teardown", 0.0) + dt}
    nbytes = {**result.phase_bytes, "teardown": result.phase_bytes.get("teardown", 0) + rss - rss_bytes()}
    memory = finish_cuda_peak(result.cuda_memory)
    return replace(result, seconds=result.seconds + dt, phase_seconds=secs, phase_bytes=nbytes, cuda_memory=memory)


def carry_training_state(
    old: Any, new: Any, sched: ScheduleState, step: int, masked: bool, working_done: bool = False
) -> dict[str, Any] | None:
    """After the grown tensors are written into ``new``: refresh its working copies from the fp32 masters, carry
    the counters (global step, samples, micro steps, skipped steps) and the fp16 loss scaler from ``old``, give every
    Adam state entry its own step counter, place the LR schedule ``sched`` at ``step`` and, for a ``masked`` growth,
    the mask ramp. Returns what ``copy_loss_scaler`` carried (None without fp16)."""
    refresh_working_copies(new, replicated_done=working_done)
    new.global_steps, new.global_samples = old.global_steps, old.global_samples
    new.micro_steps, new.skipped_steps = old.micro_steps, old.skipped_steps
    scaler = copy_loss_scaler(old, new)
    repair_adam_steps(new)  # every Adam state entry at the carried step, none shared
    apply_schedule(new, sched, step)
    if masked:
        new.module.set_growth_step(step)
    return scaler
