"""growlm-run's check of the jobs that run on this machine, before the first is launched: a single-node job with no
``hosts`` or ``hostfile`` (trainer/driver/resources.py) runs its ranks here, so its ranks per node must have a GPU
each (on a CPU, ranks beyond the cores only crawl: a warning), and the model states of every model it holds, plus a
live growth's need, and the activations of one micro batch as each trains, must fit this machine's memory
(runtime.memory; the same arithmetic as train.py's checks, trainer.plan_checks.check_run_fits_memory and
check_stages_fit_memory, at the job's ZeRO stage, precision, world size and micro batch). A job on other
machines is not checked here: the dry run prints its figures."""

from __future__ import annotations

import argparse
import os
from typing import Any

import psutil
import torch

from growlm.growth.stages.plan import StageList
from growlm.model.config import ModelConfig, largest_param_numel, param_count
from growlm.runtime.engine import precision_of
from growlm.runtime.memory import (
    GIB,
    MicroBatch,
    activation_bytes,
    growth_working_set_bytes,
    model_state_split,
    placed_bytes,
    training_need_text,
)
from growlm.trainer.driver.segments import DriverError, Segment, segment_ds_config


def runs_here(seg: Segment) -> bool:
    """Whether ``seg``'s job runs on this machine: one node, no ``hosts`` and no ``hostfile``."""
    r = seg.resources
    return r.nodes == 1 and not r.hosts and not r.hostfile


def gpu_here() -> bool:
    """Whether the jobs train on this machine's GPUs (CUDA present and DS_ACCELERATOR unset or not cpu)."""
    return torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR", "cuda") != "cpu"


def job_models(plan: StageList, seg: Segment) -> list[tuple[str, ModelConfig, ModelConfig | None]]:
    """(what, the model, the model it is grown from live or None) of every model ``seg``'s job holds, in order: the
    one it starts with (the plan's start, or the stage grown offline before it) and each stage grown inside it."""
    first = plan.start if seg.first_stage is None else plan.stages[seg.first_stage].target
    name = "start" if seg.first_stage is None else plan.stages[seg.first_stage].name
    models: list[tuple[str, ModelConfig, ModelConfig | None]] = [(f"stage {name!r} ({first.shape_str()})", first, None)]
    old = first
    for s in plan.stages:
        if s.name in seg.stages:
            what = f"stage {s.name!r} (growing {old.shape_str()} into {s.target.shape_str()} live)"
            models.append((what, s.target, old))
            old = s.target
    return models


def check_jobs_fit_here(
    plan: StageList, segments: list[Segment], base_cfg: dict[str, Any], ns: argparse.Namespace | None = None
) -> list[str]:
    """Refuse a job that runs here (``runs_here``) and cannot: more ranks per node than this machine's GPUs (on a
    GPU machine), or a model whose parameters + gradients + Adam state per rank (runtime.memory.model_state_split, by
    the job's ZeRO stage, precision and world size) plus the activations of one micro batch (``job_batch``, from
    TRAIN_ARGS parsed, ``ns``; runtime.memory.activation_bytes), or a live growth's need (the old and the grown
    model's states plus the growth's working set, runtime.memory.growth_working_set_bytes), exceed this machine's
    memory per rank: a GPU's total (the Adam part on the host when the optimizer is offloaded), or the host's total
    divided by the job's ranks per node. Buffers, the data and the allocator's slack are not counted: a job that
    passes may still not fit; one that fails cannot.

    Returns:
        The warning lines to print before launching: a CPU job with more ranks per node than this machine's cores.

    Raises:
        DriverError: the first job that cannot run here, with its figures in GiB and the fix.
    """
    warnings = []
    gpu = gpu_here()
    for seg in segments:
        if not runs_here(seg):
            continue
        r = seg.resources
        slots = torch.cuda.device_count() if gpu else os.cpu_count() or 1
        if r.ranks_per_node > slots and gpu:
            raise DriverError(
                f"job {seg.index}: resources.ranks_per_node {r.ranks_per_node}, and this machine has {slots} GPU(s), "
                "one per rank; lower ranks_per_node, or run the job on machines with more GPUs (resources.hosts or "
                "resources.hostfile)"
            )
        if r.ranks_per_node > slots:
            warnings.append(
                f"growlm-run: WARNING: job {seg.index}: {r.ranks_per_node} ranks per node, and this machine has "
                f"{slots} CPU core(s): the ranks share cores and every step crawls; lower ranks_per_node to {slots}"
            )
        problem = memory_problem(plan, seg, base_cfg, ns)
        if problem:
            raise DriverError(problem)
    return warnings


def job_batch(plan: StageList, seg: Segment, ns: argparse.Namespace | None) -> MicroBatch:
    """The micro batch ``seg``'s job trains with, as the memory checks count it: the job's micro batch, train.py's
    --seq_len (else the plan's start n_positions: the first job's default, which every later job resumes with) and
    --activation_checkpointing, from TRAIN_ARGS parsed (``ns``; None: the defaults)."""
    seq_len = getattr(ns, "seq_len", None) or plan.start.n_positions
    return MicroBatch(seg.resources.micro_batch, seq_len, bool(getattr(ns, "activation_checkpointing", False)))


GROWTH_FIX = (
    "choose a smaller target or a higher ZeRO stage, or run the job on larger machines (resources.hosts or "
    "resources.hostfile)"
)
TRAINING_FIX = (
    "choose a smaller target or a higher ZeRO stage, a smaller micro_batch, a shorter --seq_len or "
    "--activation_checkpointing, or run the job on larger machines (resources.hosts or resources.hostfile)"
)


def memory_problem(
    plan: StageList, seg: Segment, base_cfg: dict[str, Any], ns: argparse.Namespace | None = None
) -> str:
    """The refusal of ``check_jobs_fit_here`` for the memory of ``seg``'s job on this machine ('' when every model it
    holds fits): the first model whose parameters + gradients + Adam state per rank plus the activations of one micro
    batch (``job_batch``; runtime.memory.activation_bytes) as it trains, or a live growth's need (both models and the
    working set; no activations are live during a growth), exceed a GPU's total or the host's divided by the job's
    ranks per node, with its figures in GiB and the fix. growlm-run's dry run prints it as a warning."""
    r, gpu = seg.resources, gpu_here()
    cfg = segment_ds_config(base_cfg, r)
    zero = cfg.get("zero_optimization", {})
    stage, precision = int(zero.get("stage", 0)), precision_of(cfg)
    offloaded = (zero.get("offload_optimizer") or {}).get("device") in ("cpu", "nvme")
    host = psutil.virtual_memory().total // r.ranks_per_node
    device = torch.cuda.get_device_properties(0).total_memory if gpu else host
    batch = job_batch(plan, seg, ns)
    settings = f"ZeRO-{stage}, {precision}, {r.world_size} rank(s)"
    for what, model, old in job_models(plan, seg):
        needs = []  # (what, model states' split parts, working set, activations, fix)
        if old is not None:
            parts = [model_state_split(param_count(c), stage, precision, r.world_size) for c in (model, old)]
            work = growth_working_set_bytes(largest_param_numel(old), largest_param_numel(model))
            needs.append((f"{what}, {settings}", parts, work, 0, GROWTH_FIX))
            what = f"{what.split(' (growing ')[0]} ({model.shape_str()} trained after its live growth)"
        parts = [model_state_split(param_count(model), stage, precision, r.world_size)]
        acts = activation_bytes(model, batch, precision)
        states = sum(parts[0])
        needs.append((f"{what}, {settings}, {training_need_text(states, acts, batch)},", parts, 0, acts, TRAINING_FIX))
        for label, parts, work, acts, fix in needs:
            pg, opt = sum(p for p, _ in parts), sum(o for _, o in parts)
            on_gpu, on_host = placed_bytes(pg, opt, work, gpu, offloaded, acts)
            places = [(on_gpu, device, "GPU"), (on_host, host, "host")] if gpu else [(on_host, host, "host")]
            for need, have, where in places:
                if need > have:
                    return (
                        f"job {seg.index}: {label} needs about {need / GIB:,.1f} GiB per rank, and this machine's "
                        f"{where} memory is {have / GIB:,.1f} GiB per rank ({r.ranks_per_node} rank(s) on it): {fix}"
                    )
    return ""
