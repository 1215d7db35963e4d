"""growlm-gpu-check's sections that run train.py on several ranks: ``ranks`` (default set) and ``offload``.

The other sections run train.py on one rank, so on a node with several GPUs none of the cross-rank NCCL paths would
run: the ZeRO-1/2 broadcasts and the ZeRO-3 all-gather of a live growth, the object collectives, a save and resume
of every rank's shards. These two sections run on N ranks (``rank_count``): the visible CUDA GPUs, at most
``MAX_RANKS``, when there are two or more, else one (recorded: "one GPU: cross-rank paths not exercised"); in smoke
mode ``SMOKE_RANKS`` gloo ranks on the CPU, so the test suite runs the multi-rank path for real.

- ranks: the train section's runs (``gpu_check_runs.train_run``: the mode's shapes, growing live twice, each growth
  exact within ``GROWTH_TOL``) at ZeRO 1, 2 and 3, each run's world size as train.py itself reports it, and a
  save/resume: the ZeRO-``RESUME_STAGE`` run also saves a checkpoint between its two growths (``resume_step``), a
  second train.py resumes it on the same ranks, grows once more and trains to the same last step; its losses must
  equal the uninterrupted run's at the same steps within ``RESUME_TOL`` and its LRs within ``LR_RTOL``.
- offload: ZeRO-2 with the optimizer offloaded to CPU memory (``offload_config``: the shipped
  ``ds_configs/zero2_bf16_offload.json``, in smoke mode its fp32 twin), whose optimizer is DeepSpeed's CPU Adam (a
  C++ op built on first use), growing live once (depth x2): losses finite and falling, the growth exact.

The runs, their checks and the ``Runner`` are ``gpu_check_runs``'s, shared with ``gpu_check``, which registers these
sections (``SECTIONS``, ``SECTION_FNS``, ``BUDGETS``).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from typing import Any

import torch

from growlm import DS_CONFIG_DIR
from growlm.eval.bench.gpu_check_runs import Runner, Shapes, check_growths, train_run
from growlm.runtime.metrics_file import read_records

MAX_RANKS = 8  # one node's GPUs
SMOKE_RANKS = 2  # gloo ranks of the CPU rehearsal
RESUME_STAGE = 3  # the ZeRO stage whose run is saved and resumed: every rank's parameter shards saved and reloaded
# |resumed loss - uninterrupted loss| allowed at each step after the resume: fp32 on the CPU (gloo) repeats a step bit
# for bit, the tests hold it to 1e-6; on GPUs bf16/fp16 kernels (atomics in attention and embedding backward) may
# round differently from run to run and the low precision carries it into the next steps. A resume that lost the
# Adam state, the schedule or the data position moves the loss far more.
RESUME_TOL = {"fp32": 1e-6, "bf16": 2e-2, "fp16": 2e-2}
LR_RTOL = 1e-9  # the LR schedule is restored exactly whatever the precision
ONE_GPU = "one GPU: cross-rank paths not exercised"


def rank_count(gpus: int, smoke: bool) -> int:
    """The ranks the multi-rank sections run on: ``SMOKE_RANKS`` in smoke mode (gloo on the CPU), else the visible
    CUDA GPUs ``gpus`` (at most ``MAX_RANKS``) when there are two or more, else 1."""
    if smoke:
        return SMOKE_RANKS
    return min(gpus, MAX_RANKS) if gpus >= 2 else 1


def ranks_note(ranks: int, gpus: int, smoke: bool) -> str:
    """One line saying what the ``ranks`` ranks are (the section record's ``note``)."""
    if smoke:
        return f"smoke: {ranks} gloo ranks on the CPU"
    if ranks == 1:
        return ONE_GPU
    capped = f" (at most {MAX_RANKS})" if gpus > ranks else ""
    return f"{ranks} ranks on {ranks} of {gpus} visible GPUs{capped}, NCCL"


def use_ranks(r: Runner) -> int:
    """Set the section's train.py runs to ``rank_count`` ranks and record them (``results.ranks``); the count."""
    gpus = 0 if r.smoke else torch.cuda.device_count()
    r.ranks = rank_count(gpus, r.smoke)
    r.record("ranks", {"ranks": r.ranks, "visible_gpus": gpus, "backend": "gloo" if r.smoke else "nccl",
                       "note": ranks_note(r.ranks, gpus, r.smoke), "world_size": None})  # fmt: skip
    return r.ranks


def world_size_of(r: Runner, name: str) -> int | None:
    """The world size run NAME's train.py reported ("N rank(s) on DEVICE", rank 0's log), or None."""
    try:
        text = (r.folder / "logs" / r.section / name / "rank0.log").read_text(errors="replace")
    except OSError:
        return None
    found = re.search(r"(\d+) rank\(s\) on ", text)
    return int(found.group(1)) if found else None


def check_world(r: Runner, name: str) -> int | None:
    """Check that run NAME ran on the section's ranks, by train.py's own count; the world size it reported."""
    seen = world_size_of(r, name)
    r.check(f"{name} world size", seen == r.ranks, f"train.py: {seen} rank(s), launched {r.ranks}")
    return seen


def record_world(r: Runner, seen: list[int | None]) -> None:
    """Record the world size every run of the section reported (``results.ranks.world_size``: the one value, or the
    list where they differ) and check it against the launched ranks."""
    world = seen[0] if seen and len(set(seen)) == 1 else seen
    r.record("ranks", {**r.results["ranks"], "world_size": world})
    note = r.results["ranks"]["note"]
    r.check(f"{r.section}: world size", bool(seen) and world == r.ranks,
            f"{r.ranks} rank(s) launched, world size {world} in {len(seen)} run(s); {note}")  # fmt: skip


def resume_step(s: Shapes) -> int:
    """The step the save/resume run saves at: between its two growths (so the resumed run grows once more)."""
    return (s.grow_steps[0] + s.grow_steps[1]) // 2


def offload_config(precision: str) -> dict[str, Any]:
    """The shipped ZeRO-2 optimizer-offload config of ``precision`` (``ds_configs/zero2_{bf16,fp16}_offload.json``;
    fp32, which ships none, is the bf16 one without its ``bf16`` block): the optimizer state in CPU memory, stepped
    by DeepSpeed's CPU Adam. Used as given on every accelerator (it has no GPU variant)."""
    source = "bf16" if precision == "fp32" else precision
    cfg = json.loads((DS_CONFIG_DIR / f"zero2_{source}_offload.json").read_text())
    if precision == "fp32":
        cfg.pop("bf16", None)
    return cfg


def section_ranks(r: Runner) -> None:
    """ranks: on ``rank_count`` ranks, the train section's runs at ZeRO 1, 2 and 3 (each growing live twice) and a
    save/resume of the ZeRO-``RESUME_STAGE`` one compared with it uninterrupted."""
    use_ranks(r)
    p, save, seen = r.s.precision, resume_step(r.s), []
    for stage in (1, 2, 3):
        name = f"ranks-zero{stage}-{p}"
        saves = stage == RESUME_STAGE
        rec = train_run(r, name, stage, p, extra=("--save_interval", str(save)) if saves else (), keep=saves)
        rec["world_size"] = check_world(r, name) if rec["exit_status"] == 0 else None
        seen.append(rec["world_size"])
        r.record(name, rec)
        if saves:
            if rec["exit_status"] == 0:
                seen.append(resume_run(r, name, stage, save))
            r.drop(r.work / name)
    record_world(r, seen)


def resume_run(r: Runner, source: str, stage: int, save: int) -> int | None:
    """Resume run ``source`` (WORK/SOURCE, saved at step ``save``) with a second train.py on the same ranks, plan and
    config, to the same last step, and check it against ``source`` uninterrupted: steps ``save`` + 1 on, the same
    losses within ``RESUME_TOL`` and LRs within ``LR_RTOL``, the growth still due grown exactly. Records
    ``results.ranks-resume-zeroSTAGE-PRECISION``; the world size train.py reported."""
    p, last = r.s.precision, r.s.train_steps
    name = f"ranks-resume-zero{stage}-{p}"
    tag = r.work / source / "checkpoints" / f"global_step{save}"
    plan = r.plan(name, (r.s.grow_steps[0], r.s.grow_depth_to), r.s.grow_steps[1])  # the source run's plan
    args = ["--ds_config", str(r.ds_config(name, stage, p)), "--max_steps", str(last), "--growth_plan", str(plan)]
    rc, run, error, wall = r.train(name, [*args, "--resume", str(tag), "--no_final_save"])
    rec: dict[str, Any] = {"resumed_from": f"{source} step {save}", "exit_status": rc, "wall_s": wall}
    seen = None
    if r.check(f"{name} ran", rc == 0, f"exit status {rc}" + (f": {error}" if error else "")):
        seen = rec["world_size"] = check_world(r, name)
        state = json.loads((tag / "growlm_state.json").read_text()) if (tag / "growlm_state.json").is_file() else {}
        rec["checkpoint_world_size"] = state.get("world_size")
        full = {x["step"]: x for x in read_records(r.work / source, "train")}
        got = read_records(run, "train")
        want = list(range(save + 1, last + 1))
        rec["steps"] = [x["step"] for x in got]
        rec["losses"] = [x["loss"] for x in got]
        rec["uninterrupted_losses"] = [full[x["step"]]["loss"] if x["step"] in full else None for x in got]
        r.check(f"{name} continues at step {save + 1}", rec["steps"] == want, f"steps {rec['steps']}, want {want}")
        pairs = [(x, full[x["step"]]) for x in got if x["step"] in full]
        finite = bool(pairs) and all(math.isfinite(x["loss"]) for pair in pairs for x in pair)
        loss_diff = max(abs(a["loss"] - b["loss"]) for a, b in pairs) if finite else None
        lr_diff = max(abs(a["lr"] - b["lr"]) / max(abs(b["lr"]), 1e-30) for a, b in pairs) if pairs else None
        rec.update(max_abs_loss_diff=loss_diff, max_rel_lr_diff=lr_diff, tolerance=RESUME_TOL[p])
        same = finite and len(pairs) == len(want) and loss_diff <= RESUME_TOL[p] and lr_diff <= LR_RTOL
        r.check(f"{name}: the uninterrupted run's losses and LRs", same,
                f"steps {save + 1}-{last}, loss resumed / uninterrupted: "
                + ", ".join(f"{a['loss']:.6f} / {b['loss']:.6f}" for a, b in pairs)
                + f"; max |diff| {loss_diff} (tolerance {RESUME_TOL[p]:g}), LR max relative diff {lr_diff}"
                f" (tolerance {LR_RTOL:g})")  # fmt: skip
        times = [x["step_time_s"] for x in got][1:]
        median = statistics.median(times) if times else float("nan")
        rec["growths"] = check_growths(r, name, run, p, 1, median)
    r.record(name, rec)
    r.drop(run)
    return seen


def section_offload(r: Runner) -> None:
    """offload: on ``rank_count`` ranks, ZeRO-2 with the optimizer offloaded to CPU memory (``offload_config``)
    growing live once (depth x2), with the train section's checks."""
    use_ranks(r)
    p = r.s.precision
    name = f"offload-zero2-{p}"
    base = offload_config(p)
    rec = train_run(r, name, 2, p, growths=1, ds_config=r.ds_config(name, 2, p, base=base))
    rec["zero_optimization"] = base["zero_optimization"]
    rec["world_size"] = check_world(r, name) if rec["exit_status"] == 0 else None
    r.record(name, rec)
    record_world(r, [rec["world_size"]])
