"""growlm-run --dry_run: per stage the model shape, parameters, where and how it is reached, the launcher command of
its job, the expected model-state memory per rank and the activations of one micro batch (runtime.memory), with a
warning where the model states exceed --mem_per_rank_gib, and where a job that runs on this machine cannot fit its
memory (the check that growlm-run makes before launching and refuses it with, trainer.driver.fits_here). Starts
nothing and writes nothing."""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path
from typing import Any

import torch

from growlm import TRAIN_SCRIPT
from growlm.growth.stages.plan import StageList
from growlm.model.config import ModelConfig, param_count
from growlm.runtime.engine import precision_of
from growlm.runtime.memory import GIB, activation_bytes, model_state_bytes
from growlm.trainer.driver.fits_here import job_batch, memory_problem, runs_here
from growlm.trainer.driver.segments import (
    Segment,
    deepspeed_path,
    ds_config_path,
    grown_path,
    job_args,
    launcher_commands,
    written_hostfile,
)


def stage_rows(plan: StageList, segments: list[Segment]) -> list[tuple[str, ModelConfig, str, Segment]]:
    """(name, shape, how it is reached, its segment) for ``start`` and every stage, in run order."""
    rows = [("start", plan.start, "start", segments[0])]
    by_stage = {}
    for seg in segments:
        if seg.first_stage is not None:
            by_stage[plan.stages[seg.first_stage].name] = (seg, "save -> offline grow + reshard -> relaunch")
        for name in seg.stages:
            by_stage[name] = (seg, "live growth")
    for s in plan.stages:
        seg, how = by_stage[s.name]
        rows.append((s.name, s.target, f"{how} at {s.when.describe()}", seg))
    return rows


def slots_here() -> int:
    """Ranks this machine can hold one per device: its GPUs (DS_ACCELERATOR unset or cuda), else its CPU cores."""
    if torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR", "cuda") != "cpu":
        return torch.cuda.device_count()
    return os.cpu_count() or 1


def print_dry_run(
    plan: StageList,
    segments: list[Segment],
    base_cfg: dict[str, Any],
    ns: argparse.Namespace,
    args: argparse.Namespace,
    train_args: list[str],
) -> int:
    """Print the dry run (module docstring); returns 0."""

    precision = precision_of(base_cfg)
    driver_dir = Path(ns.out_dir).resolve() / "driver"
    plan_path = str(Path(args.plan).resolve())
    print(
        f"growlm-run dry run: {len(plan.stages) + 1} model(s) in {len(segments)} job(s), {precision}, --max_steps "
        f"{ns.max_steps}; memory = parameters + gradients + Adam state per rank (ZeRO paper, Rajbhandari et al. "
        "2020, Sec. 3.1 / Fig. 1), and activations of one micro batch per rank (Korthikanti et al. 2022, eq. 1)"
    )
    warnings = 0
    shown = set()
    for name, cfg, how, seg in stage_rows(plan, segments):
        r = seg.resources
        n = param_count(cfg)
        mem = model_state_bytes(n, r.zero_stage, precision, r.world_size)
        print(f"\n[{name}] {cfg.shape_str()}: {n:,} parameters ({how})")
        print(
            f"  job {seg.index}: {r.nodes} node(s) x {r.ranks_per_node} rank(s), ZeRO-{r.zero_stage}, micro batch "
            f"{r.micro_batch} x accumulation {r.grad_accum} x {r.world_size} ranks = {r.global_batch} sequences"
        )
        print(f"  model states per rank: {mem / GIB:.3f} GiB")
        batch = job_batch(plan, seg, ns)
        acts = activation_bytes(cfg, batch, precision)
        print(f"  activations of one micro batch of {batch.text()}: {acts / GIB:.3f} GiB per rank")
        if seg.index not in shown and r.ranks_per_node > slots_here():
            warnings += 1
            print(
                f"  WARNING: {r.ranks_per_node} ranks per node, and this machine has {slots_here()} "
                f"{'GPU(s)' if torch.cuda.is_available() else 'CPU core(s)'}: ranks beyond that share a device (GPU: "
                "the launch fails; CPU: the steps crawl); lower ranks_per_node unless the job's nodes are larger"
            )
        if args.mem_per_rank_gib is not None and mem > args.mem_per_rank_gib * GIB:
            warnings += 1
            print(
                f"  WARNING: {mem / GIB:.3f} GiB per rank exceeds --mem_per_rank_gib {args.mem_per_rank_gib:g}: use "
                "more ranks or a higher ZeRO stage for this stage"
            )
        problem = memory_problem(plan, seg, base_cfg, ns) if seg.index not in shown and runs_here(seg) else ""
        if problem:  # the real run refuses this job before launching anything (fits_here.check_jobs_fit_here)
            warnings += 1
            print(f"  WARNING: {problem}; growlm-run without --dry_run refuses it")
        if seg.index not in shown:
            shown.add(seg.index)
            hostfile = Path(r.hostfile) if r.hostfile else None
            hostfile = hostfile or (written_hostfile(driver_dir, seg.index) if (r.hosts or r.nodes > 1) else None)
            resume = str(grown_path(driver_dir, seg.first_stage)) if seg.index else None
            cfg = ds_config_path(driver_dir, seg.index)
            job = job_args(train_args, plan_path, cfg, resume, seg.stop_stage)
            ds, script = deepspeed_path(args.deepspeed), str(TRAIN_SCRIPT)
            for cmd in launcher_commands(r, ds, 29500, script, job, hostfile):
                print(f"  launch: {shlex.join(cmd)}")
    print(f"\ngrowlm-run dry run: {warnings} warning(s)")
    return 0
