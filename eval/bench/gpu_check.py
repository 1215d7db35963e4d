"""growlm-gpu-check: one command that proves growlm on a GPU (``make gpu-check``), in sections that each fit a short
GPU lease; with ``--smoke`` the same sections at tiny shapes on a CPU (the test suite runs it).

Sections (``--sections``; the default set is ``DEFAULT_SECTIONS``):

- env: GPU name and memory, driver, CUDA, cuDNN, NCCL, torch, DeepSpeed, Python; the SDPA kernel.
- train: bf16 (smoke: fp32) train.py runs at ZeRO 1, 2 and 3 on one rank, each growing live twice: depth x2 by
  duplication (exact) and width masked (exact at ramp 0). Checks: losses finite and falling, the fixed-batch loss
  after each growth equal to the one before (within ``gpu_check_runs.GROWTH_TOL``), the growth's seconds and the
  training steps they equal.
- offline: a ZeRO-2 checkpoint grown by growlm-grow (masked, one more layer; written universal, so resharded to
  any world size) and resumed by train.py for two steps (finite losses).
- export: a ZeRO-2 checkpoint exported to transformers -> train.py ``--init_from`` for one step at LR 0 -> exported
  again, every tensor bit for bit equal.
- throughput: growlm-bench on GPT-2 350M at T = 1024 (ZeRO-1, with and without activation checkpointing, the micro
  batch from ``gpu_check_sections.fit_micro_batch``) and the plain PyTorch baseline: tokens/s, model TFLOP/s, MFU.
- ranks: train.py on N ranks (N = the visible GPUs, at most 8, when there are 2 or more, else 1, recorded as "one
  GPU: cross-rank paths not exercised"; smoke: 2 gloo ranks on the CPU): the train section's live growths at ZeRO 1,
  2 and 3 (the ZeRO-1/2 broadcasts and the ZeRO-3 all-gather of a growth across ranks), each run's world size as
  train.py reports it, and a save/resume: the ZeRO-3 run saves between its growths, a second train.py resumes it
  (loading every rank's shards, growing once more) and its losses and LRs must equal the uninterrupted run's
  (``gpu_check_ranks.RESUME_TOL``). Code: ``eval/bench/gpu_check_ranks.py``.
- compile: train.py ``--compile`` (GPU: with one live growth) against the same run in eager mode; where train.py
  refuses ``--compile`` (exit status 2) the section is "skipped: <its reason>".
- fp16: a ZeRO-2 fp16 run with both growths; the loss scaler's overflow-skipped steps counted.
- offload: ZeRO-2 with the optimizer offloaded to CPU memory (ds_configs/zero2_bf16_offload.json; smoke: its fp32
  twin), stepped by DeepSpeed's CPU Adam (built on first use), growing live once (depth x2) on the ranks section's N
  ranks: losses finite and falling, the growth exact within ``gpu_check_runs.GROWTH_TOL``.

compile, fp16 and offload are not in the default set: ``--sections compile,fp16,offload`` runs them (a second lease).

Each section runs in its own process (this module with a hidden ``--_section``; the sections' steps are in
``gpu_check_sections``), started in its own session and
killed with every process it started once its budget (``BUDGETS``, ``--budget SECTION=SECONDS``) is spent: it is
then recorded as timed out and the next section runs. While it runs it writes what it has measured to
``OUT/<device>/sections/NAME.partial.json``; when it ends its record goes to ``sections/NAME.json`` (its output in
``sections/NAME.log``, each train.py rank's in ``logs/NAME/``) and the report (``gpu_check.json``, ``gpu_check.md``)
is rebuilt from every section record in the folder, so a kill at any moment keeps everything measured before it.
``--report_only`` rebuilds the reports. A section deletes its run folders and checkpoints as it goes
(``--keep_work`` keeps them). Exit status 0 when every check passed, 1 when one failed or a section timed out, 2 for
bad input (one line).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from growlm.data.prepare import ensure_builtin_prepared
from growlm.eval.bench.gpu_check_runs import GPU, SMOKE, Runner
from growlm.eval.bench.gpu_check_sections import SECTION_FNS
from growlm.eval.bench.peak import format_mfu
from growlm.runtime import launch
from growlm.runtime.atomic import write_json, write_text
from growlm.runtime.commands import HelpFormatter, add_version
from growlm.runtime.dist import select_accelerator
from growlm.runtime.machine import device_description
from growlm.runtime.processes import adopt_orphans, alive, descendant_groups, kill_descendants, kill_groups_and_wait

SECTIONS = ("env", "train", "offline", "export", "throughput", "ranks", "compile", "fp16", "offload")
DEFAULT_SECTIONS = ("env", "train", "offline", "export", "throughput", "ranks")

# seconds each section may run before it is killed (--budget SECTION=SECONDS overrides). GPU: sized for one H200
# from a cold start, the default set 490 s (with the parent's start and data, under 9 minutes); H200_ESTIMATE_S and
# docs/benchmarks.md give the estimate behind each. ranks and offload: estimates until a GPU node (a multi-GPU one
# for their N ranks) measures them; nothing of theirs was measured on a GPU. Smoke: a loaded 2-core CPU, generous.
BUDGETS = {
    "gpu": {"env": 20, "train": 100, "offline": 65, "export": 65, "throughput": 80, "ranks": 160, "compile": 240,
            "fp16": 60, "offload": 180},
    "smoke": {"env": 120, "train": 400, "offline": 300, "export": 300, "throughput": 300, "ranks": 400, "compile": 600,
              "fp16": 300, "offload": 600},
}  # fmt: skip
# the estimated H200 seconds of each section and its arithmetic (an estimate: no GPU was available when this was
# written). Per process: start = the tiny train.py start measured on a 2-core CPU (6-8 s: imports, engine build) plus
# CUDA init, engine build on the GPU and first-step kernels (assumed 7 s) = 15 s; a section's own process 5 s; steps
# at 40% MFU of 989 TFLOP/s (GPT-2 124M-355M at 4,096 tokens a step: under 0.1 s); a live growth 4 s (the new
# DeepSpeed engine's build); files at 1 GB/s; growlm-grow and the export of the 67.7M-parameter source checkpoint as
# measured on a 2-core CPU (7.0 s and about 5 s). docs/benchmarks.md, "growlm-gpu-check", has the table.
H200_ESTIMATE_S = {
    "env": (10, "process 5 s + CUDA init 3 s + nvidia-smi and SDPA probes 2 s"),
    "train": (78, "process 5 s + 3 runs x (start 15 s + 12 steps x 0.1 s + 2 growths x 4 s)"),
    "offline": (46, "process 5 s + source run 17 s (start 15 s, 4 steps, 1.1 GB saved) + growlm-grow 7 s + "
                "resume 17 s"),
    "export": (50, "process 5 s + source run 17 s + export 5 s + --init_from run 17 s + export 5 s + compare 1 s"),
    "throughput": (65, "process 5 s + baseline 16 s + 2 runs x (start 15 s + warm-up 3 s + 8 steps x 0.40 s, "
                   "0.53 s recomputing)"),
    "compile": (150, "process 5 s + eager run 20 s + compiled run (start 15 s + compile 45 s + compile after the "
                "growth 60 s + growth 4 s + steps 1 s)"),
    "fp16": (29, "process 5 s + 1 run (start 15 s + 12 steps x 0.1 s + 2 growths x 4 s)"),
    # N ranks: a start 20 s (15 s + 5 s assumed for NCCL's init across ranks), a step still 0.1 s (each rank's batch
    # is one GPU's), the grown ZeRO-3 checkpoint (210M parameters, about 3 GB) written and read at 1 GB/s
    "ranks": (127, "process 5 s + 3 runs x (start 20 s + 12 steps x 0.1 s + 2 growths x 4 s) + 2 saves x 3 s "
              "(--save_interval 5 of 12 steps) + resume (start 20 s + load 3 s + 7 steps x 0.1 s + growth 4 s)"),
    "offload": (99, "process 5 s + CPU Adam op build 60 s (first use; 0 once cached) + start 20 s + 12 steps x "
                "0.5 s (Adam on the host) + growth 8 s"),
}  # fmt: skip


class GpuCheckError(Exception):
    """Bad input: printed as one line, exit status 2."""


def device_slug(name: str) -> str:
    """A folder name for a device: 'NVIDIA H200' -> 'nvidia-h200'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:60] or "device"


# ---------------------------------------------------------------------------------------------------------------
# processes: a section's child and everything it started


def run_child(cmd: list[str], env: dict[str, str], log: Path, timeout_s: float) -> tuple[int, bool]:
    """Run ``cmd`` in a new session (``runtime.launch.start_rank``), output to ``log``; after ``timeout_s`` seconds
    SIGKILL its process group and those of all its descendants and wait until they are gone.

    Returns:
        (exit status, negative for a signal; whether it was killed at ``timeout_s``).
    """
    p = launch.start_rank(cmd, env, None, log)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            pid, status, _ = os.wait4(p.pid, os.WNOHANG)
            if pid:
                p.returncode = os.waitstatus_to_exitcode(status)
                return p.returncode, False
            if time.monotonic() >= deadline:
                kill_groups_and_wait([p.pid, *descendant_groups(p.pid)])
                _, status, _ = os.wait4(p.pid, 0)
                p.returncode = os.waitstatus_to_exitcode(status)
                return p.returncode, True
            time.sleep(0.1)
    finally:
        if p.returncode is None:  # an exception while waiting (KeyboardInterrupt): leave nothing behind
            kill_groups_and_wait([p.pid, *descendant_groups(p.pid)])
            p.wait()


def die_with_parent(parent_pid: int, poll_s: float = 0.5) -> None:
    """In a section's process: a daemon thread that, once process ``parent_pid`` (growlm-gpu-check) is gone, kills
    every process this one started, including one being started at that moment and the orphans of killed ones
    (``runtime.processes.kill_descendants``, with this process their subreaper), and then this one's own process
    group."""
    adopt_orphans()

    def watch() -> None:
        while alive(parent_pid):
            time.sleep(poll_s)
        kill_descendants()
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="growlm-gpu-check-parent-watchdog", daemon=True).start()


# ---------------------------------------------------------------------------------------------------------------
# one section, in its own process (its steps: gpu_check_sections)


def section_main(args: argparse.Namespace) -> int:
    """The process of one section (``--_section``): run it, recording as it goes; exit status 0 once it finished
    (its checks say whether it passed)."""
    if args._parent is not None:
        die_with_parent(args._parent)
    if args.smoke:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    select_accelerator()
    r = Runner(SMOKE if args.smoke else GPU, args._section, Path(args._folder), Path(args._work), args.data,
               args.smoke, args.keep_work)  # fmt: skip
    r.save()
    SECTION_FNS[args._section](r)
    r.finished = True
    r.save()
    return 0


# ---------------------------------------------------------------------------------------------------------------
# the sections in turn, and the report


def last_line(path: Path) -> str:
    """The last non-empty line of a log file ('' when there is none)."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][-300:] if lines else ""


def section_record(name: str, meta: dict[str, Any], partial: dict[str, Any], rc: int | None, timed_out: bool,
                   log: Path) -> dict[str, Any]:  # fmt: skip
    """A finished (or killed) section's record from what its process wrote (``partial``), its exit status ``rc``
    (None: never reaped, an interrupted run) and whether it was killed at its budget; ``meta``: mode, device,
    budget_s, seconds."""
    checks = list(partial.get("checks", []))
    if timed_out:
        status = "timed out"
        checks.append({"section": name, "name": "finished within its budget", "ok": False,
                       "detail": f"killed after {meta['budget_s']:g} s (--budget {name}=SECONDS)"})  # fmt: skip
    elif rc is None:
        status = "interrupted"
    elif rc != 0 or not partial.get("finished"):
        status = "failed"
        checks.append({"section": name, "name": "section process", "ok": False,
                       "detail": f"exit status {rc}: {last_line(log)}"})  # fmt: skip
    elif partial.get("skipped"):
        status = f"skipped: {partial['skipped']}"
    else:
        status = "passed" if all(c["ok"] for c in checks) else "failed"
    return {
        "section": name,
        "status": status,
        **meta,
        "finished_at": None if rc is None else datetime.now(UTC).isoformat(timespec="seconds"),
        "checks": checks,
        "results": partial.get("results", {}),
        "log": f"sections/{name}.log",
    }


def load_sections(folder: Path) -> dict[str, dict[str, Any]]:
    """Every section record in ``folder/sections``, in section order; a section that left only its partial file
    (killed with growlm-gpu-check itself) is 'interrupted' with the checks it had recorded."""
    recs: dict[str, dict[str, Any]] = {}
    for name in SECTIONS:
        final, partial = folder / "sections" / f"{name}.json", folder / "sections" / f"{name}.partial.json"
        if final.is_file():
            recs[name] = json.loads(final.read_text())
        elif partial.is_file():
            meta = {"mode": None, "device": None, "budget_s": None, "seconds": None}
            recs[name] = section_record(name, meta, json.loads(partial.read_text()), None, False, Path())
    return recs


def failed(status: str) -> bool:
    """Whether a section's status fails the check (failed, timed out, interrupted; not passed or skipped)."""
    return not (status == "passed" or status.startswith("skipped"))


def build_report(recs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The report of ``recs`` (section name -> record): mode, device, environment, every check, each section."""
    some = next((x for x in recs.values() if x.get("device")), {})
    env = recs.get("env", {}).get("results", {}).get("environment") or {"device": some.get("device")}
    return {
        "mode": some.get("mode"),
        "device": some.get("device"),
        "passed": bool(recs) and not any(failed(x["status"]) for x in recs.values()),
        "seconds": sum(x.get("seconds") or 0.0 for x in recs.values()),
        "environment": env,
        "checks": [c for x in recs.values() for c in x["checks"]],
        "sections": recs,
    }


def markdown(report: dict[str, Any]) -> str:
    """The report as markdown: sections, environment, checks, throughput table."""
    lines = [f"# growlm gpu-check: {report['device']}", "", f"mode: {report['mode']}; {report['seconds']:.0f} s of "
             "sections; each section's record is in sections/NAME.json", ""]  # fmt: skip
    lines += ["| section | status | seconds | budget s | finished at |", "|---|---|---|---|---|"]
    for name, x in report["sections"].items():
        sec = "-" if x.get("seconds") is None else f"{x['seconds']:.0f}"
        lines.append(f"| {name} | {x['status']} | {sec} | {x.get('budget_s') or '-'} | {x.get('finished_at')} |")
    lines += [""] + [f"- {k}: {v}" for k, v in report["environment"].items()]
    lines += ["", "| section | check | result | detail |", "|---|---|---|---|"]
    for c in report["checks"]:
        lines.append(f"| {c['section']} | {c['name']} | {'pass' if c['ok'] else 'FAIL'} | {c['detail']} |")
    results = report["sections"].get("throughput", {}).get("results", {})
    rows = [rec for v in results.values() if isinstance(v, list) for rec in v if not rec.get("failed")]
    if rows:
        lines += ["", "| run | micro batch | tokens/s | model TFLOP/s | MFU | peak memory MiB | recompute saves MiB |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for x in rows:
            peak = x.get("peak_device_bytes_rank0") or max(x.get("peak_rss_bytes_per_rank") or [0])
            saved = x.get("recompute_memory_saved_bytes")
            lines.append(
                f"| {x['name']} | {x.get('micro_batch', '-')} | {x['tokens_per_s']:,.0f} "
                f"| {x['model_flops_per_s'] / 1e12:.2f} | {format_mfu(x['mfu'])} | {peak / 2**20:,.0f} "
                f"| {'-' if saved is None else f'{saved / 2**20:,.0f}'} |"
            )
    return "\n".join(lines) + "\n"


def write_report(folder: Path, recs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Rebuild ``gpu_check.json`` and ``gpu_check.md`` in ``folder`` from ``recs`` (atomically); the report."""
    report = build_report(recs)
    write_json(folder / "gpu_check.json", report, overwrite=True)
    write_text(folder / "gpu_check.md", markdown(report), overwrite=True)
    return report


def run_section(name: str, budget_s: float, args: argparse.Namespace, folder: Path, device: str) -> dict[str, Any]:
    """Run section ``name`` in its own process for at most ``budget_s`` seconds, then publish it: the report
    rebuilt with its record, then ``sections/NAME.json``; its record."""
    sections = folder / "sections"
    sections.mkdir(parents=True, exist_ok=True)
    final, partial, log = sections / f"{name}.json", sections / f"{name}.partial.json", sections / f"{name}.log"
    final.unlink(missing_ok=True)
    partial.unlink(missing_ok=True)
    shutil.rmtree(folder / "logs" / name, ignore_errors=True)
    if args.keep_work:
        work = folder / "runs" / name
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
    else:
        work = Path(tempfile.mkdtemp(prefix=f"growlm-gpu-check-{name}-"))
    cmd = [sys.executable, "-m", "growlm.eval.bench.gpu_check", "--_section", name, "--_folder", str(folder),
           "--_work", str(work), "--_parent", str(os.getpid()), *(["--smoke"] if args.smoke else []),
           *(["--data", args.data] if args.data else []), *(["--keep_work"] if args.keep_work else [])]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **({"DS_ACCELERATOR": "cpu"} if args.smoke else {})}
    t = time.monotonic()
    try:
        rc, timed_out = run_child(cmd, env, log, budget_s)
    finally:
        if not args.keep_work:
            shutil.rmtree(work, ignore_errors=True)
    meta = {"mode": "smoke (CPU, tiny shapes)" if args.smoke else "GPU", "device": device, "budget_s": budget_s,
            "seconds": time.monotonic() - t}  # fmt: skip
    rec = section_record(name, meta, json.loads(partial.read_text()) if partial.is_file() else {}, rc, timed_out, log)
    write_report(folder, {**load_sections(folder), name: rec})
    write_json(final, rec, overwrite=True)
    partial.unlink(missing_ok=True)
    return rec


def parse_sections(text: str) -> list[str]:
    """``--sections``: comma-separated names, run in the order given.

    Raises:
        GpuCheckError: an unknown or repeated name, or none.
    """
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in SECTIONS]
    if unknown or not names or len(set(names)) != len(names):
        raise GpuCheckError(f"--sections {text}: give distinct names from {', '.join(SECTIONS)}, comma-separated")
    return names


def parse_budgets(items: list[str], defaults: dict[str, float]) -> dict[str, float]:
    """``defaults`` with every ``--budget SECTION=SECONDS`` applied.

    Raises:
        GpuCheckError: not SECTION=SECONDS, an unknown section, or seconds that are not a positive number.
    """
    budgets = dict(defaults)
    for item in items:
        name, _, value = item.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = float("nan")
        if name not in SECTIONS or not seconds > 0 or math.isinf(seconds):
            raise GpuCheckError(f"--budget {item}: give SECTION=SECONDS, SECTION one of {', '.join(SECTIONS)} and "
                                "SECONDS a positive number")  # fmt: skip
        budgets[name] = seconds
    return budgets


def help_epilog() -> str:
    """--help's table of the sections: budget (GPU, smoke) and the H200 estimate with its arithmetic."""
    lines = ["sections (* default set): budget s on a GPU / in smoke mode; estimated H200 s (an estimate: not",
             "measured on a GPU; docs/benchmarks.md shows the arithmetic):"]  # fmt: skip
    for name in SECTIONS:
        est, how = H200_ESTIMATE_S[name]
        star = "*" if name in DEFAULT_SECTIONS else " "
        lines.append(f"  {star}{name:<10} {BUDGETS['gpu'][name]:>4} / {BUDGETS['smoke'][name]:>3}   "
                     f"~{est:>3} s = {how}")  # fmt: skip
    gpu = sum(BUDGETS["gpu"][s] for s in DEFAULT_SECTIONS)
    est = sum(H200_ESTIMATE_S[s][0] for s in DEFAULT_SECTIONS)
    others = [s for s in SECTIONS if s not in DEFAULT_SECTIONS]
    lines += [
        f"default set: budgets {gpu} s (estimate ~{est} s), plus this process's start (~10 s from a cold start) and",
        "the built-in corpus prepared once where --data is not given (~10 s): under "
        f"{math.ceil((gpu + 20) / 60)} minutes on one H200",
        f"second set (e.g. a second lease): --sections {','.join(others)}, budgets "
        f"{sum(BUDGETS['gpu'][s] for s in others)} s",
        "ranks (multi-GPU) and offload run train.py on N ranks: the visible GPUs (at most 8) when there are 2 or",
        "more, else 1 (recorded as 'one GPU: cross-rank paths not exercised'); smoke: 2 gloo ranks on the CPU;",
        "their GPU budgets and estimates are estimates until a (multi-)GPU node measures them",
    ]
    lines += [
        "basis: a run's start 15 s = 6-8 s measured for a tiny train.py on a 2-core CPU (imports, engine build)",
        "+ 7 s assumed for CUDA init and first-step kernels; steps at 40% MFU of 989 TFLOP/s; a live growth 4 s;",
        "files at 1 GB/s; growlm-grow (7 s) and export (5 s) of the offline/export source as measured on 2 CPU cores",
    ]
    return "\n".join(lines)


class _Help(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """The shared help formatter, keeping the section table's lines as written."""


def build_parser() -> argparse.ArgumentParser:
    """The growlm-gpu-check argument parser."""
    p = argparse.ArgumentParser(
        prog="growlm-gpu-check",
        description="Prove growlm on this machine's GPU in sections that each fit a short lease:\n"
        "environment, bf16 training at ZeRO 1-3 with live growth, offline growth and resume,\n"
        "export round trip, throughput and MFU, the same growths and a save/resume on all GPUs\n"
        "(ranks), torch.compile, fp16, ZeRO offload. Each section runs in its\n"
        "own process, is killed at its budget, and its record and the report are written the\n"
        "moment it ends. --smoke: the same at tiny shapes on a CPU.",
        epilog=help_epilog(),
        formatter_class=_Help,
    )
    p.add_argument("--out", default="eval/results/gpu", help="results go to OUT/<device>/")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, fp32, on the CPU (the test suite's run)")
    p.add_argument("--sections", default=",".join(DEFAULT_SECTIONS),
                   help=f"comma-separated sections to run, in this order, from {', '.join(SECTIONS)}")  # fmt: skip
    p.add_argument("--budget", action="append", default=None, metavar="SECTION=SECONDS",
                   help="override one section's budget (repeatable); a section past it is killed, recorded as timed "
                   "out, and the next one runs")  # fmt: skip
    p.add_argument("--report_only", action="store_true",
                   help="run nothing: rebuild gpu_check.json and gpu_check.md in every OUT/<device>/ from its "
                   "section records")  # fmt: skip
    p.add_argument("--data", default=None, help="prepared token folder for every run (default: the built-in corpus)")
    p.add_argument("--keep_work", action="store_true", help="keep run folders and checkpoints (OUT/<device>/runs)")
    for hidden in ("--_section", "--_folder", "--_work"):  # a section's own process (run_section)
        p.add_argument(hidden, default=None, help=argparse.SUPPRESS)
    p.add_argument("--_parent", type=int, default=None, help=argparse.SUPPRESS)
    return add_version(p)


def report_only(out: Path) -> int:
    """Rebuild the report of every OUT/<device>/ with section records and print it; 0 when every section there
    passed or was skipped, else 1.

    Raises:
        GpuCheckError: no OUT/<device>/sections folder.
    """
    folders = sorted(f for f in out.glob("*") if (f / "sections").is_dir())
    if not folders:
        raise GpuCheckError(f"--report_only: no section records under {out} (no {out}/<device>/sections)")
    rc = 0
    for folder in folders:
        report = write_report(folder, load_sections(folder))
        print(markdown(report), flush=True)
        print(f"growlm-gpu-check: report rebuilt: {folder / 'gpu_check.json'}", flush=True)
        rc = max(rc, 0 if report["passed"] else 1)
    return rc


def run(args: argparse.Namespace) -> tuple[dict[str, Any], Path, list[dict[str, Any]]]:
    """Every section asked for, in turn; returns the report (every section record in the folder, earlier runs'
    included), its folder and this run's section records.

    Raises:
        GpuCheckError: no CUDA device without --smoke, or bad --sections / --budget.
    """
    names = parse_sections(args.sections)
    budgets = parse_budgets(args.budget or [], BUDGETS["smoke" if args.smoke else "gpu"])
    if not args.smoke and not torch.cuda.is_available():
        raise GpuCheckError("no CUDA device is visible: run on a GPU node, or pass --smoke for the CPU rehearsal")
    device = device_description("cpu" if args.smoke else None)
    folder = Path(args.out) / device_slug(device + ("-smoke" if args.smoke else ""))
    folder.mkdir(parents=True, exist_ok=True)
    if args.data is None:  # once here, not by the first train.py run inside a section's budget
        t = time.monotonic()
        args.data = str(ensure_builtin_prepared())
        print(f"growlm-gpu-check: built-in corpus ready ({time.monotonic() - t:.0f} s): {args.data}", flush=True)
    total = sum(budgets[n] for n in names)
    print(f"growlm-gpu-check: {', '.join(f'{n} ({budgets[n]:g} s)' for n in names)}: at most {total:g} s; "
          f"results in {folder}", flush=True)  # fmt: skip
    recs = []
    for name in names:
        rec = run_section(name, budgets[name], args, folder, device)
        recs.append(rec)
        ok = sum(c["ok"] for c in rec["checks"])
        print(f"growlm-gpu-check: {name}: {rec['status']} in {rec['seconds']:.0f} s (budget {budgets[name]:g} s), "
              f"{ok}/{len(rec['checks'])} checks passed; {folder / 'sections' / name}.json", flush=True)  # fmt: skip
    return build_report(load_sections(folder)), folder, recs


def main(argv: list[str] | None = None) -> int:
    """growlm-gpu-check's entry point: 0 when every check passed, 1 when one failed or a section timed out, 2 for bad
    input (one line)."""
    args = build_parser().parse_args(argv)
    if args._section:
        return section_main(args)
    try:
        if args.report_only:
            return report_only(Path(args.out))
        report, folder, recs = run(args)
    except GpuCheckError as e:
        print(f"growlm-gpu-check: error: {e}", file=sys.stderr)
        return 2
    checks = [c for rec in recs for c in rec["checks"]]
    print((folder / "gpu_check.md").read_text(), flush=True)
    statuses = ", ".join(f"{x['section']}: {x['status']}" for x in recs)
    print(f"growlm-gpu-check: {sum(c['ok'] for c in checks)}/{len(checks)} checks of this run passed ({statuses}); "
          f"{folder / 'gpu_check.json'}")  # fmt: skip
    return 1 if any(failed(x["status"]) for x in recs) else 0


if __name__ == "__main__":
    sys.exit(main())
