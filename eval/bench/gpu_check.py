"""growlm-gpu-check: one command that proves growlm on a GPU (``make gpu-check``), and with ``--smoke`` the same
sequence at tiny shapes on a CPU (the test suite runs it).

Sections, in order; each one's checks and seconds go into the report, and a section that no longer fits
``--budget_s`` is skipped (and named so):

1. environment: GPU name and memory, driver, CUDA, cuDNN, NCCL, torch, DeepSpeed, Python; the SDPA kernel.
2. training: every precision (GPU: bf16, fp16; smoke: fp32) at ZeRO 1, 2 and 3 on one rank, each a real train.py
   run. Checks: every loss finite, the loss falls, fp16's overflow-skipped steps counted (the loss scaler at work).
   The ZeRO-2 and ZeRO-3 runs grow live twice: depth by duplication (exact) and width masked (exact at ramp 0);
   checks: the fixed-batch loss after each growth equals the one before (within ``GROWTH_TOL`` of the precision),
   and the growth's seconds and the training steps they equal.
3. offline growth: the first precision's ZeRO-2 checkpoint grown by growlm-grow (masked, one more layer) and
   resumed by train.py for two steps (finite losses); export to transformers -> train.py ``--init_from`` at LR 0
   for one step -> export again, every tensor bit for bit equal.
4. throughput: growlm-bench on GPT-2 124M and 350M (GPU: T = 1024, bf16; 350M also fp16 and ZeRO-3) with and
   without activation checkpointing, the micro batch from ``fit_micro_batch``, plus the plain PyTorch baseline.

Writes ``OUT/<device>/gpu_check.json`` (every section's numbers and checks) and ``gpu_check.md``; exit status 0 when
every check passed, 1 when one failed, 2 for bad input (one line).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from growlm import DS_CONFIG_DIR, TRAIN_SCRIPT
from growlm.eval.bench import throughput as bench
from growlm.eval.bench.peak import format_mfu
from growlm.growth.offline.cli import main as grow_main
from growlm.model.config import GPTConfig, from_preset, param_count
from growlm.model.gpt import attention_kernel
from growlm.runtime.commands import HelpFormatter, add_version
from growlm.runtime.dist import select_accelerator
from growlm.runtime.launch import launch_ranks
from growlm.runtime.machine import device_description
from growlm.runtime.metrics_file import read_records

# |loss after - loss before| allowed for a function-preserving growth, by precision: fp32 rounding only; bf16/fp16
# round the grown model's weights and activations (8 and 11 significand bits)
GROWTH_TOL = {"fp32": 1e-4, "bf16": 5e-2, "fp16": 1e-2}


@dataclass(frozen=True)
class Shapes:
    """The sizes of one mode (GPU or smoke)."""

    precisions: tuple[str, ...]
    train_preset: str
    train_seq_len: int
    train_micro: int
    train_steps: int
    grow_depth_to: int  # n_layer after the duplication growth (x2)
    grow_steps: tuple[int, int]  # the steps of the two growths (after fp16's first overflow-skipped steps)
    grow_width_to: tuple[int, int]  # (n_embd, n_head) after the masked growth
    lr: float
    bench_presets: tuple[str, ...]
    bench_seq_len: int
    bench_steps: int
    bench_skip: int
    timeout_s: float


GPU = Shapes(("bf16", "fp16"), "gpt2", 512, 8, 12, 24, (4, 7), (1024, 16), 6e-4, ("gpt2-medium", "gpt2"), 1024, 8, 3,
             900.0)  # fmt: skip
SMOKE = Shapes(("fp32",), "tiny", 32, 4, 6, 4, (2, 4), (96, 6), 3e-3, ("tiny",), 32, 3, 1, 600.0)


@dataclass
class Check:
    """One pass/fail check of the report."""

    section: str
    name: str
    ok: bool
    detail: str


class GpuCheckError(Exception):
    """Bad input: printed as one line, exit status 2."""


def fit_micro_batch(cfg: GPTConfig, seq_len: int, device_bytes: int, *, recompute: bool, fraction: float = 0.85) -> int:
    """The largest power-of-two micro batch whose estimated peak memory fits ``fraction`` of one device (ZeRO-1 on
    one rank, bf16/fp16 with fp32 Adam).

    Model state: 16 bytes per parameter (2 + 2 half weights and gradients, 4 + 4 + 4 fp32 master, exp_avg,
    exp_avg_sq; Rajbhandari et al. 2020, ZeRO, section 3.1). Activations per sequence and layer: 34 T d bytes
    (Korthikanti et al. 2022, arXiv 2205.05198, eq. 1, without its 5 a T^2 score term: flash attention keeps none);
    with recomputation each layer keeps only its 2 T d-byte input, plus one layer's 34 T d while it recomputes. The
    LM head adds 12 T V bytes per sequence at the backward peak (half logits, their fp32 copy for the cross entropy,
    its fp32 gradient, the half gradient of the logits).

    Returns:
        The micro batch (at least 1).
    """
    state = 16 * param_count(cfg)
    layer = 34 * seq_len * cfg.n_embd
    acts = (cfg.n_layer * 2 * seq_len * cfg.n_embd + layer) if recompute else cfg.n_layer * layer
    per_seq = acts + 12 * seq_len * cfg.vocab_size
    fit = max(1, int((fraction * device_bytes - state) // per_seq))
    return 2 ** int(math.log2(fit))


def environment() -> dict[str, Any]:
    """Versions and the device (section 1)."""
    import deepspeed  # lazy: deepspeed picks its accelerator at import (run() sets it first)

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(device=props.name, device_memory_bytes=props.total_memory, capability=f"{props.major}.{props.minor}")
        try:
            q = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
            env["driver"] = subprocess.run(q, capture_output=True, text=True, timeout=30).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            env["driver"] = None
        env["attention"] = {p: attention_kernel(64, getattr(torch, n), "cuda") for p, n in
                            (("bf16", "bfloat16"), ("fp16", "float16"))}  # fmt: skip
    else:
        env.update(device=device_description(), device_memory_bytes=None, driver=None)
        env["attention"] = {"fp32": attention_kernel(64, torch.float32, "cpu")}
    return env


def device_slug(name: str) -> str:
    """A folder name for a device: 'NVIDIA H200' -> 'nvidia-h200'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:60] or "device"


class Runner:
    """Runs the sections' processes in one work folder, with the mode's sizes and a time budget."""

    def __init__(self, shapes: Shapes, work: Path, data: str | None, budget_s: float, smoke: bool) -> None:
        self.s, self.work, self.data, self.smoke = shapes, work, data, smoke
        self.deadline = time.monotonic() + budget_s
        self.last_run_s = 30.0 if smoke else 60.0  # the cost guess for the next run: the last run's wall time
        self.checks: list[Check] = []
        self.sections: dict[str, Any] = {}
        self.device = "cuda" if torch.cuda.is_available() and not smoke else "cpu"

    def check(self, section: str, name: str, ok: bool, detail: str) -> bool:
        """Record one check of the report; returns ``ok``."""
        self.checks.append(Check(section, name, bool(ok), detail))
        return bool(ok)

    def left_s(self) -> float:
        """Seconds of the budget left (negative once it is spent)."""
        return self.deadline - time.monotonic()

    def fits(self, factor: float = 1.0) -> bool:
        """Whether a run like the last one (``factor`` times as long) still fits the budget."""
        return self.left_s() > factor * self.last_run_s

    def ds_config(self, name: str, stage: int, precision: str, lr: float | None = None) -> Path:
        """ds_configs/zero{STAGE}_{PRECISION}.json with the mode's micro batch, peak LR (or ``lr``) and a 2-step
        warm-up, written to WORK/NAME.json; its path."""
        cfg = json.loads((DS_CONFIG_DIR / f"zero{stage}_{precision}.json").read_text())
        cfg["train_micro_batch_size_per_gpu"] = self.s.train_micro
        cfg["optimizer"]["params"]["lr"] = self.s.lr if lr is None else lr
        cfg["scheduler"]["params"]["warmup_num_steps"] = 2
        path = self.work / f"{name}.json"
        path.write_text(json.dumps(cfg, indent=2))
        return path

    def train(self, name: str, args: list[str]) -> tuple[int, Path]:
        """One rank of train.py with ``args`` into WORK/NAME; (exit status, run folder)."""
        out = self.work / name
        cmd = [sys.executable, str(TRAIN_SCRIPT), "--seq_len", str(self.s.train_seq_len), "--no_final_eval"]
        cmd += ["--log_interval", "1", *(["--data", self.data] if self.data else []), *args, "--out_dir", str(out)]
        env = {"OMP_NUM_THREADS": str(max(1, (torch.get_num_threads())))} if self.device == "cpu" else {}
        if self.device == "cpu":
            env["DS_ACCELERATOR"] = "cpu"
        t = time.monotonic()
        res = launch_ranks(cmd, 1, envs=[env], log_dir=out / "logs", timeout_s=self.s.timeout_s)
        self.last_run_s = time.monotonic() - t
        return res.returncode, out

    def plan(self, name: str) -> Path:
        """The live-growth plan of the ZeRO-2/3 runs: depth x2 by duplication at step 2, width masked at step 4."""
        d, h = self.s.grow_width_to
        base = from_preset(self.s.train_preset)
        text = (
            f"seed: 0\nstart: {{preset: {self.s.train_preset}, n_layer: {self.s.grow_depth_to // 2}}}\nstages:\n"
            f"  - name: depth-x2\n    target: {{n_layer: {self.s.grow_depth_to}}}\n    family: duplicate\n"
            f"    options: {{layer_order: interleave, exact: true}}\n    when: {{step: {self.s.grow_steps[0]}}}\n"
            "    optimizer: {moments: carry}\n    schedule: {kind: continue}\n"
            f"  - name: width\n    target: {{n_embd: {d}, n_head: {h}}}\n    family: masked\n"
            f"    when: {{step: {self.s.grow_steps[1]}}}\n"
            "    ramp_steps: 2\n    schedule: {kind: continue}\n"
        )
        assert d > base.n_embd, (d, base.n_embd)
        path = self.work / f"{name}.yaml"
        path.write_text(text)
        return path


def train_and_check(r: Runner, name: str, stage: int, precision: str, extra: list[str]) -> dict[str, Any] | str:
    """One training run of section 2 and its checks; its record (or why it was skipped)."""
    if not r.fits():
        return "skipped: budget"
    args = ["--ds_config", str(r.ds_config(name, stage, precision)), "--max_steps", str(r.s.train_steps)]
    args += ["--preset", r.s.train_preset] if stage == 1 else ["--growth_plan", str(r.plan(name))]
    rc, run = r.train(name, [*args, *extra])
    rec: dict[str, Any] = {"exit_status": rc, "wall_s": r.last_run_s}
    if not r.check("training", f"{name} ran", rc == 0, f"exit status {rc}" + (f", logs in {name}/logs" if rc else "")):
        return rec
    steps = read_records(run, "train")
    losses = [s["loss"] for s in steps]
    times = [s["step_time_s"] for s in steps][1:]
    median = statistics.median(times) if times else float("nan")
    rec.update(losses=losses, skipped_steps=steps[-1].get("skipped_steps", 0) if steps else None,
               step_time_s_median=median)  # fmt: skip
    r.check("training", f"{name} losses finite", all(math.isfinite(x) for x in losses), f"{len(losses)} steps")
    r.check("training", f"{name} loss falls", losses[-1] < losses[0], f"{losses[0]:.4f} -> {losses[-1]:.4f}")
    if precision == "fp16":
        skipped = rec["skipped_steps"]
        r.check("training", f"{name} loss scaler", skipped is not None and skipped < len(losses),
                f"{skipped} overflow-skipped step(s) of {len(losses)}")  # fmt: skip
    growths = read_records(run, "growth")
    rec["growths"] = [
        {k: g[k] for k in ("step", "stage", "family", "loss_before", "loss_after", "seconds")}
        | {"equivalent_steps": g["seconds"] / median if median > 0 else None}
        for g in growths
    ]
    if stage > 1:
        r.check("training", f"{name} grew twice", len(growths) == 2, f"{len(growths)} growth record(s)")
        for g in growths:
            diff = abs(g["loss_after"] - g["loss_before"])
            r.check("training", f"{name} {g['stage']} ({g['family']}) preserves the loss",
                    diff <= GROWTH_TOL[precision],
                    f"{g['loss_before']:.6f} -> {g['loss_after']:.6f} (|diff| {diff:.2e}, tolerance "
                    f"{GROWTH_TOL[precision]:g}); {g['seconds']:.2f} s")  # fmt: skip
    return rec


def section_training(r: Runner) -> dict[str, Any]:
    """Section 2: precision x ZeRO 1-3, live growth at ZeRO 2 and 3; on a GPU also the ZeRO-2 growth run of the first
    precision with --compile (the same losses within the precision's tolerance, its median step time against the
    run without)."""
    out: dict[str, Any] = {}
    for precision in r.s.precisions:
        for stage in (1, 2, 3):
            name = f"train-zero{stage}-{precision}"
            out[name] = train_and_check(r, name, stage, precision, [])
    if not r.smoke:
        p = r.s.precisions[0]
        name, plain = f"train-zero2-{p}-compile", out.get(f"train-zero2-{p}")
        rec = out[name] = train_and_check(r, name, 2, p, ["--compile"])
        if isinstance(rec, dict) and isinstance(plain, dict) and "losses" in rec and "losses" in plain:
            worst = max(abs(a - b) for a, b in zip(rec["losses"], plain["losses"], strict=True))
            rec["step_time_vs_eager"] = rec["step_time_s_median"] / plain["step_time_s_median"]
            r.check("training", f"{name}: the same losses as without --compile", worst <= GROWTH_TOL[p],
                    f"max |diff| {worst:.2e}; median step time {rec['step_time_vs_eager']:.2f}x of eager "
                    "(the first step, which compiles, left out)")  # fmt: skip
    return out


def section_offline(r: Runner) -> dict[str, Any]:
    """Section 3: growlm-grow of the ZeRO-2 checkpoint and its resume; export -> --init_from -> export."""

    precision = r.s.precisions[0]
    src = r.work / f"train-zero2-{precision}" / "checkpoints"
    if not (src / "latest").is_file():
        return {"skipped": f"no checkpoint of train-zero2-{precision}"}
    out: dict[str, Any] = {}
    n_layer = r.s.grow_depth_to + 1
    t = time.monotonic()
    rc = grow_main(
        [str(src), str(r.work / "grown"), "--family", "masked", "--n_layer", str(n_layer), "--ramp_steps", "2"]
    )
    out["grow_s"] = time.monotonic() - t
    if r.check("offline", "growlm-grow (masked, +1 layer)", rc == 0, f"exit status {rc}") and not r.fits():
        out["resume"] = "skipped: budget"
    elif rc == 0:
        name = "resume-grown"
        args = ["--resume", str(r.work / "grown"), "--max_steps", str(r.s.train_steps + 2)]
        args += ["--ds_config", str(r.ds_config(name, 2, precision))]
        rc, run = r.train(name, args)
        losses = [x["loss"] for x in read_records(run, "train")] if rc == 0 else []
        out["resume"] = {"exit_status": rc, "losses": losses}
        r.check("offline", "the grown checkpoint resumes", rc == 0 and len(losses) == 2 and
                all(math.isfinite(x) for x in losses), f"exit status {rc}, losses {losses}")  # fmt: skip
    # export -> --init_from at LR 0 for one step -> export: the weights must come back bit for bit
    a, b = r.work / "hf-a", r.work / "hf-b"
    rc = grow_main([str(src), "--export_hf", str(a)])
    if not r.check("offline", "export to transformers", rc == 0, f"exit status {rc}"):
        return out
    if not r.fits():
        out["init_from"] = "skipped: budget"
        return out
    name = "init-from"
    args = ["--init_from", str(a), "--max_steps", "1", "--ds_config", str(r.ds_config(name, 2, precision, lr=0.0))]
    rc, run = r.train(name, args)
    rc2 = grow_main([str(run / "checkpoints"), "--export_hf", str(b)]) if rc == 0 else None
    if r.check("offline", "--init_from and export again", rc == 0 and rc2 == 0, f"exit status {rc}, export {rc2}"):
        wa, wb = (load_file(str(x / "model.safetensors")) for x in (a, b))
        worst = (
            max(float((wa[k].float() - wb[k].float()).abs().max()) for k in wa) if sorted(wa) == sorted(wb) else None
        )
        out["round_trip_max_abs_diff"] = worst
        r.check("offline", "export -> --init_from -> export is exact", worst == 0.0, f"max |diff| {worst}")
    return out


def section_throughput(r: Runner, device_bytes: int | None) -> dict[str, Any]:
    """Section 4: growlm-bench runs (one rank), with and without activation checkpointing, and the baseline."""
    out: dict[str, Any] = {}
    for preset in r.s.bench_presets:  # the largest first: its MFU is the number the check exists for
        big = preset == r.s.bench_presets[0]
        precisions = ["bf16", "fp16"] if not r.smoke and big else [r.s.precisions[0]]
        stages = ["1", "3"] if not r.smoke and big else ["1"]
        cfg = from_preset(preset)
        micro = 4 if r.smoke else fit_micro_batch(cfg, r.s.bench_seq_len, device_bytes or 0, recompute=False)
        name = f"bench-{preset}"
        if not r.fits(3):  # the baseline and two train.py runs at least
            out[name] = "skipped: budget"
            continue
        argv = ["--preset", preset, "--seq_len", str(r.s.bench_seq_len), "--world_size", "1", "--zero_stage", *stages,
                "--precision", *precisions, "--micro_batch", str(micro), "--max_steps", str(r.s.bench_steps),
                "--skip_steps", str(r.s.bench_skip), "--activation_checkpointing", "both",
                "--timeout_s", str(max(30.0, r.left_s())), "--out", str(r.work / name)]  # fmt: skip
        argv += ["--threads_per_rank", "1"] if r.device == "cpu" else []
        argv += ["--data", r.data] if r.data else []
        rc = bench.main(argv)
        if not r.check("throughput", f"{name} (micro batch {micro})", rc == 0, f"growlm-bench exit status {rc}"):
            continue
        records = json.loads((r.work / name / "bench.json").read_text())
        out[name] = [
            {
                k: rec.get(k)
                for k in (
                    "name",
                    "precision",
                    "zero_stage",
                    "micro_batch",
                    "tokens_per_s",
                    "model_flops_per_s",
                    "mfu",
                    "step_time_s_median",
                    "activation_recomputation",
                    "peak_device_bytes_rank0",
                    "peak_rss_bytes_per_rank",
                    "recompute_memory_saved_bytes",
                    "skipped_steps",
                )
            }  # fmt: skip
            for rec in records
        ]
        (r.work / name / "bench.md").replace(r.work / f"{name}.md")
    return out


def markdown(report: dict[str, Any]) -> str:
    """The report as markdown: environment, checks, throughput table."""
    env = report["environment"]
    lines = [f"# growlm gpu-check: {env.get('device')}", "", f"mode: {report['mode']}, {report['seconds']:.0f} s", ""]
    lines += [f"- {k}: {v}" for k, v in env.items()]
    lines += ["", "| section | check | result | detail |", "|---|---|---|---|"]
    for c in report["checks"]:
        lines.append(f"| {c['section']} | {c['name']} | {'pass' if c['ok'] else 'FAIL'} | {c['detail']} |")
    rows = [rec for v in report["sections"].get("throughput", {}).values() if isinstance(v, list) for rec in v]
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
    skipped = [f"{s}/{k}" for s, v in report["sections"].items() if isinstance(v, dict)
               for k, x in v.items() if isinstance(x, str) and x.startswith("skipped")]  # fmt: skip
    if skipped:
        lines += ["", f"skipped (time budget or a missing input): {', '.join(skipped)}"]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    """The growlm-gpu-check argument parser."""
    p = argparse.ArgumentParser(
        prog="growlm-gpu-check",
        description="Prove growlm on this machine's GPU: environment, bf16/fp16 training at ZeRO 1-3 with live "
        "growth, offline growth and resume, export round trip, throughput and MFU; --smoke: the same at tiny "
        "shapes on a CPU.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--out", default="eval/results/gpu", help="results go to OUT/<device>/")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, fp32, on the CPU (the test suite's run)")
    p.add_argument("--budget_s", type=float, default=480.0, help="seconds for everything; later sections skip")
    p.add_argument("--data", default=None, help="prepared token folder for every run (default: the built-in corpus)")
    p.add_argument("--keep_work", action="store_true", help="keep the run folders in OUT/<device>/work")
    return add_version(p)


def run(args: argparse.Namespace) -> tuple[dict[str, Any], Path]:
    """Every section; returns the report and its folder.

    Raises:
        GpuCheckError: no CUDA device without --smoke, or a budget that is not positive.
    """
    if not args.budget_s > 0:
        raise GpuCheckError(f"--budget_s {args.budget_s}: give a positive number of seconds")
    if args.smoke:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    select_accelerator()
    if not args.smoke and not torch.cuda.is_available():
        raise GpuCheckError("no CUDA device is visible: run on a GPU node, or pass --smoke for the CPU rehearsal")
    t0 = time.monotonic()
    env = environment()
    folder = Path(args.out) / device_slug(env["device"] + ("-smoke" if args.smoke else ""))
    folder.mkdir(parents=True, exist_ok=True)
    work = folder / "work" if args.keep_work else Path(tempfile.mkdtemp(prefix="growlm-gpu-check-"))
    if args.keep_work:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
    r = Runner(SMOKE if args.smoke else GPU, work, args.data, args.budget_s, args.smoke)
    try:
        for name, fn in (("training", section_training), ("offline", section_offline),
                         ("throughput", lambda x: section_throughput(x, env.get("device_memory_bytes")))):  # fmt: skip
            t = time.monotonic()
            r.sections[name] = fn(r)
            r.sections[f"{name}_s"] = time.monotonic() - t
    finally:
        if not args.keep_work:
            shutil.rmtree(work, ignore_errors=True)
    report = {
        "mode": "smoke (CPU, tiny shapes)" if args.smoke else "GPU",
        "seconds": time.monotonic() - t0,
        "environment": env,
        "checks": [c.__dict__ for c in r.checks],
        "sections": r.sections,
    }
    (folder / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    (folder / "gpu_check.md").write_text(markdown(report))
    return report, folder


def main(argv: list[str] | None = None) -> int:
    """growlm-gpu-check's entry point: 0 when every check passed, 1 when one failed, 2 for bad input (one line)."""
    args = build_parser().parse_args(argv)
    try:
        report, folder = run(args)
    except GpuCheckError as e:
        print(f"growlm-gpu-check: error: {e}", file=sys.stderr)
        return 2
    failed = [c for c in report["checks"] if not c["ok"]]
    print((folder / "gpu_check.md").read_text(), flush=True)
    print(f"growlm-gpu-check: {len(report['checks']) - len(failed)}/{len(report['checks'])} checks passed; "
          f"{folder / 'gpu_check.json'}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
