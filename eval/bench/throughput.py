"""growlm-bench: training throughput of train.py for a model size, ZeRO stage, precision, batch, length and ranks.

Every DeepSpeed number comes from a real ``train.py`` run (the same code path as training: ``--no_final_eval
--no_final_save``), whose per-step ``metrics.jsonl`` records are read back; the first ``--skip_steps`` steps are left
out. Beside it runs plain PyTorch in the same process layout (``eval/bench/baseline.py``: torch DDP, the same ranks,
threads per rank, model and global batch), so the ratio measures DeepSpeed's overhead only. Each run gives a JSON
record; all runs together a markdown table (``bench.md``) and, for two or more, a bar chart (``bench.png``).
Definitions: DESIGN.md section Evaluation, and ``eval/bench/report.py``. Examples::

    growlm-bench --preset cpu-small --seq_len 128 --zero_stage 2 --precision bf16 --out runs/bench
    growlm-bench --sweep --seq_len 128 --out eval/results/bench_cpu  # ZeRO 0-3 x fp32/bf16
    growlm-bench --preset GPT2_base --seq_len 1024 --micro_batch 8 --world_size 1 --zero_stage 1 --precision fp16 bf16
    growlm-bench ... --growth_plan growth/plans/PLAN.yaml   # also reports each growth's cost

Ranks are started on this machine with RANK/WORLD_SIZE/MASTER_ADDR=127.0.0.1 (like torchrun); on a CPU each rank
gets ``--threads_per_rank`` threads (OMP_NUM_THREADS) and the matmul peak is measured with that many threads.

Each configuration's record is written to ``--out`` the moment its run ends (``NAME.json``, and ``bench.json`` with
every record so far), so a benchmark killed midway keeps what it measured. A run that fails or times out is recorded
as failed (``"failed": true`` and its error line) and the next configuration runs; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from growlm import PACKAGE_DIR, TRAIN_SCRIPT
from growlm.eval.bench.peak import device_peak, format_mfu
from growlm.eval.bench.report import (
    BenchError,
    add_recompute_savings,
    step_statistics,
    summarize_train,
    write_reports,
)
from growlm.growth.errors import GrowthError
from growlm.growth.stages.plan import load_stages
from growlm.model.config import flops_per_token, from_preset, param_count
from growlm.runtime.atomic import write_json
from growlm.runtime.commands import HelpFormatter, add_version, interruptible
from growlm.runtime.dist import select_accelerator
from growlm.runtime.ds_config import shipped_ds_config
from growlm.runtime.launch import launch_ranks
from growlm.runtime.lock import LockHeldError, output_held_message, output_lock
from growlm.runtime.machine import device_description
from growlm.runtime.metrics_file import read_records
from growlm.runtime.processes import sigkill_note

STAGES = (0, 1, 2, 3)
PRECISIONS = ("fp32", "bf16", "fp16")


SHAPE_FLAGS = ("n_layer", "n_embd", "n_head", "n_inner", "n_kv_head", "vocab_size")  # train.py's, passed through
SHAPE_HELP = {
    "n_kv_head": " (Llama presets only)",
    "vocab_size": " (at least the data's: a Llama preset on the built-in corpus needs 50257)",
}


def build_parser() -> argparse.ArgumentParser:
    """The growlm-bench argument parser (its flags; arguments after '--' go to train.py: ``parse_args``)."""
    p = argparse.ArgumentParser(
        prog="growlm-bench",
        description="Measure train.py's training throughput (tokens/s, model TFLOP/s, MFU, fp16 skipped steps, "
        "peak memory) against a plain PyTorch baseline. Arguments after '--' go to train.py unchanged.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--preset", default="cpu-small", help="model shape preset (see train.py --help)")
    for name in SHAPE_FLAGS:
        p.add_argument(f"--{name}", type=int, help=f"override the preset's {name}" + SHAPE_HELP.get(name, ""))
    p.add_argument("--seq_len", type=int, default=128, help="tokens per sequence T")
    p.add_argument("--zero_stage", type=int, nargs="+", default=[2], choices=STAGES, help="ZeRO stage(s)")
    p.add_argument("--precision", nargs="+", default=["bf16"], choices=PRECISIONS, help="precision(s)")
    p.add_argument("--sweep", action="store_true", help="every ZeRO stage x every precision this device supports")
    p.add_argument("--micro_batch", type=int, default=8, help="sequences per rank per micro step")
    p.add_argument("--grad_accum", type=int, default=1, help="micro steps per optimizer step")
    p.add_argument("--world_size", type=int, default=None, help="ranks (default: GPUs on this machine, else 2)")
    p.add_argument("--threads_per_rank", type=int, default=None, help="CPU threads per rank (default cores/ranks)")
    p.add_argument(
        "--max_steps",
        type=int,
        default=12,
        help="optimizer steps per run, the skipped ones included (the default measures 10: one slow step moves "
        "the median by one place, never to the outlier)",
    )
    p.add_argument("--skip_steps", type=int, default=2, help="leading steps left out of every number (warm-up)")
    p.add_argument("--peak_tflops", type=float, default=None, help="peak per device (default: GPU table or measured)")
    p.add_argument("--no_baseline", action="store_true", help="skip the plain PyTorch baseline")
    p.add_argument(
        "--activation_checkpointing",
        choices=("off", "on", "both"),
        default="off",
        help="train.py's --activation_checkpointing: off, on, or both (each run twice; the report then gives the "
        "peak memory each saves)",
    )
    p.add_argument(
        "--growth_plan",
        default=None,
        help="pass a growth plan to train.py (its start replaces --preset) and report each growth's cost",
    )
    p.add_argument("--data", default=None, help="prepared token folder (default: the built-in corpus)")
    p.add_argument("--out", default="runs/bench", help="folder for the JSON records, bench.md and bench.png")
    p.add_argument("--keep_runs", action="store_true", help="keep the train.py run folders and logs in OUT/runs")
    p.add_argument("--timeout_s", type=float, default=3600.0, help="limit for one run")
    return add_version(p)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = build_parser().parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    args.train_extra = extra
    return args


def available_precisions() -> tuple[str, list[str]]:
    """This machine's accelerator name and the precisions DeepSpeed can train with on it (train.py's check)."""

    select_accelerator()
    from deepspeed.accelerator import get_accelerator  # lazy: deepspeed picks its accelerator at import

    acc = get_accelerator()
    avail = ["fp32"] + (["bf16"] if acc.is_bf16_supported() else []) + (["fp16"] if acc.is_fp16_supported() else [])
    return acc.device_name(), avail


def _launch(cmd: list[str], nproc: int, extra_env: dict, log_dir: Path, timeout_s: float, what: str) -> list[int]:
    """Run ``nproc`` ranks of ``cmd`` (runtime/launch.py: loopback, a free port, output to log_dir/rank{i}.log);
    return each rank's peak RSS in bytes. When one rank fails the others are stopped at once.

    Raises:
        BenchError: a rank failed (train.py's own error line when it printed one) or ``timeout_s`` passed.
    """
    res = launch_ranks(cmd, nproc, envs=[extra_env] * nproc, log_dir=log_dir, timeout_s=timeout_s,
                       grace_s=0)  # fmt: skip
    if res.timed_out:
        raise BenchError(f"a run did not finish within --timeout_s {timeout_s:.0f}; logs in {log_dir}")
    if res.returncode:
        raise _failure(log_dir, what, res.returncodes)
    return res.max_rss_bytes


def _failure(log_dir: Path, what: str, codes: list[int]) -> BenchError:
    """A BenchError carrying train.py's own error line if it printed one, else the log tails; where every rank that
    failed was ended by SIGKILL (``codes``: the ranks' exit statuses; a rank launch_ranks killed after another failed
    is one of them), the first line says so (``runtime.processes.sigkill_note``: killed by the kernel, likely out of
    memory), and names an empty output as such."""
    logs = sorted(log_dir.glob("rank*.log"))
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            if "growlm-train: error:" in line:  # may follow a progress bar's carriage return
                return BenchError(f"{what}: {line.split('growlm-train: error:', 1)[1].strip()}")
    tail = "\n".join(log.read_text(errors="replace")[-1500:] for log in logs)
    failed = [(rank, code) for rank, code in enumerate(codes) if code]
    if failed and all(sigkill_note(code) for _, code in failed):
        ranks = ", ".join(str(rank) for rank, _ in failed)
        note = f"{sigkill_note(failed[0][1])}: rank(s) {ranks}, exit status {failed[0][1]}"
        if not tail.strip():
            return BenchError(f"{what} failed: {note}, with no output")
        return BenchError(f"{what} failed ({note}); last output:\n{tail}")
    return BenchError(f"{what} failed; last output:\n{tail}")


def ds_config(
    stage: int, precision: str, micro_batch: int, grad_accum: int, steps: int, path: Path, device_type: str = "cpu"
) -> Path:
    """ds_configs/zero{stage}_{precision}.json (on ``device_type`` "cuda" its GPU variant in ds_configs/gpu/,
    ``runtime.ds_config.shipped_ds_config``) with the benchmark's micro batch and accumulation, and an LR warm-up
    no longer than the run (a growth plan's schedule rules refuse one that is), written to ``path``."""
    cfg = json.loads(shipped_ds_config(stage, precision, device_type).read_text())
    cfg["train_micro_batch_size_per_gpu"] = micro_batch
    cfg["gradient_accumulation_steps"] = grad_accum
    sched = cfg.get("scheduler", {}).get("params", {})
    if isinstance(sched.get("warmup_num_steps"), int):
        sched["warmup_num_steps"] = min(sched["warmup_num_steps"], steps)
    path.write_text(json.dumps(cfg, indent=2))
    return path


def recorded_command(cmd: list[str], work: Path) -> str:
    """``cmd`` as the results record it: relative to the package (``python train.py ...``), with the benchmark's
    temporary folder written as WORK, so that no path of the measuring machine is committed."""
    words = [
        "python" if a == sys.executable else a.replace(f"{PACKAGE_DIR}{os.sep}", "").replace(str(work), "WORK")
        for a in cmd
    ]
    return shlex.join(words)


def bench_deepspeed(
    args: argparse.Namespace, stage: int, precision: str, work: Path, base: dict, recompute: bool = False
) -> dict:
    """One train.py run at ``stage`` and ``precision`` with ``args.world_size`` ranks (``recompute``: with
    --activation_checkpointing, named ``...-ckpt``); its JSON record."""
    name = f"zero{stage}-{precision}" + ("-ckpt" if recompute else "")
    run_dir = work / name
    cfg_path = ds_config(stage, precision, args.micro_batch, args.grad_accum, args.max_steps, work / f"{name}.json",
                         base["device_type"])  # fmt: skip
    shape = [f"--{k}={getattr(args, k)}" for k in SHAPE_FLAGS if getattr(args, k)]
    shape = [] if args.growth_plan else ["--preset", args.preset, *shape]  # a plan sets its own starting shape
    cmd = [sys.executable, str(TRAIN_SCRIPT), *shape, "--seq_len", str(args.seq_len)]
    cmd += ["--ds_config", str(cfg_path), "--max_steps", str(args.max_steps), "--no_final_eval", "--no_final_save"]
    # --log_interval 1: train.py reads its device once per log interval; every step's own time needs one per step
    cmd += ["--log_interval", "1", "--out_dir", str(run_dir)]
    cmd += ["--data", args.data] if args.data else []
    cmd += ["--growth_plan", args.growth_plan] if args.growth_plan else []
    cmd += ["--activation_checkpointing"] if recompute else []
    cmd += args.train_extra
    ws = args.world_size
    env: dict[str, str] = {}
    if base["device_type"] == "cpu":
        env.update(OMP_NUM_THREADS=str(args.threads_per_rank), DS_ACCELERATOR="cpu")
    print(f"growlm-bench: {name}: {ws} rank(s), {args.max_steps} steps ...", flush=True)
    rss = _launch(cmd, ws, env, run_dir / "logs", args.timeout_s, f"train.py ({name})")
    records = read_records(run_dir)
    s = summarize_train(records, warmup_steps=args.skip_steps, world_size=ws)
    peak = base["peaks"][(precision, args.threads_per_rank)]
    rec = {
        "name": name,
        "kind": "deepspeed",
        "zero_stage": stage,
        "precision": precision,
        "world_size": ws,
        **base["common"],
        **s,
        "peak_flops_per_s_per_rank": peak.flops_per_s,
        "peak_source": peak.source,
        "mfu": peak.mfu(s["model_flops_per_s_per_rank"]),  # None: no known peak (an unknown GPU)
        "activation_recomputation": recompute,
        "peak_rss_bytes_per_rank": rss,
        "peak_device_bytes_rank0": s["cuda_max_allocated_bytes_rank0"],  # None off CUDA
        "train_cmd": recorded_command(cmd, work),
    }
    return rec


def bench_pytorch(args: argparse.Namespace, precision: str, work: Path, base: dict) -> dict:
    """The plain PyTorch baseline at ``precision`` in the DeepSpeed run's layout (``args.world_size`` ranks of
    ``args.threads_per_rank`` threads, torch DDP over gloo on loopback or NCCL, the same global batch); its JSON
    record. A step's time is the slowest rank's."""
    name = f"pytorch-{precision}"
    ws, common = args.world_size, base["common"]
    cmd = [sys.executable, "-m", "growlm.eval.bench.baseline", "--config_json", json.dumps(common["model"])]
    cmd += ["--batch", str(common["global_batch"]), "--grad_accum", str(args.grad_accum)]
    cmd += ["--seq_len", str(args.seq_len), "--precision", precision, "--steps", str(args.max_steps)]
    env: dict[str, str] = {}
    if base["device_type"] == "cpu":
        cmd += ["--threads", str(args.threads_per_rank)]
        env.update(OMP_NUM_THREADS=str(args.threads_per_rank))
    print(f"growlm-bench: {name}: {ws} rank(s) (torch DDP), {args.max_steps} steps ...", flush=True)
    rss = _launch(cmd, ws, env, work / name, args.timeout_s, f"the PyTorch baseline ({precision})")
    outs = []
    for r in range(ws):
        lines = (work / name / f"rank{r}.log").read_text().splitlines()
        outs.append(json.loads(next(ln for ln in reversed(lines) if ln.startswith('{"step_times_s"'))))
    times = [max(o["step_times_s"][i] for o in outs) for i in range(args.skip_steps, args.max_steps)]
    stats = step_statistics(
        times,
        tokens_per_step=common["tokens_per_step"],
        flops_per_step=common["tokens_per_step"] * common["flops_per_token"],
        world_size=ws,
    )
    peak = base["peaks"][(precision, args.threads_per_rank)]
    return {
        "name": name,
        "kind": "pytorch",
        "parallel": "torch DDP" if ws > 1 else "single process",
        "precision": precision,
        "world_size": ws,
        **common,
        "threads": args.threads_per_rank if base["device_type"] == "cpu" else None,
        **stats,
        "measured_tokens": common["tokens_per_step"] * len(times),
        "peak_flops_per_s_per_rank": peak.flops_per_s,
        "peak_source": peak.source,
        "mfu": peak.mfu(stats["model_flops_per_s_per_rank"]),
        "skipped_steps": 0,
        "final_loss": sum(o["losses"][-1] for o in outs) / ws,
        "activation_recomputation": False,
        "peak_rss_bytes_per_rank": rss,
        "peak_device_bytes_rank0": outs[0]["peak_device_bytes"],
        "train_cmd": recorded_command(cmd, work),
    }


# flag -> (smallest value, what it counts): every count must be at least 1, --skip_steps at least 0
_MIN = {
    "seq_len": (1, "tokens per sequence"),
    "micro_batch": (1, "sequences per rank per micro step"),
    "grad_accum": (1, "micro steps per optimizer step"),
    "world_size": (1, "ranks"),
    "threads_per_rank": (1, "CPU threads per rank"),
    "max_steps": (1, "optimizer steps per run"),
    "skip_steps": (0, "leading steps left out"),
    "n_layer": (1, "layers"),
    "n_embd": (1, "embedding width"),
    "n_head": (1, "attention heads"),
    "n_inner": (1, "MLP width"),
    "n_kv_head": (1, "key/value heads"),
    "vocab_size": (1, "vocabulary"),
}


def check_flags(args: argparse.Namespace) -> None:
    """Refuse a numeric flag outside its range before anything runs.

    Raises:
        BenchError: a count below its minimum (``_MIN``: --world_size 0, --max_steps 0, --micro_batch 0, ...), or a
            --peak_tflops / --timeout_s that is not a positive number.
    """
    for name, (low, what) in _MIN.items():
        value = getattr(args, name)
        if value is not None and value < low:
            raise BenchError(f"--{name} {value}: must be >= {low} ({what}); give a value of at least {low}")
    for name in ("peak_tflops", "timeout_s"):
        value = getattr(args, name)
        if value is not None and not value > 0:  # also NaN
            raise BenchError(f"--{name} {value}: must be a positive number; give a value above 0")


def _resolve(args: argparse.Namespace):
    """Check the flags against this device and fill defaults; returns (device type, precisions, ZeRO stages, model
    config, model FLOPs per token).

    Raises:
        BenchError: an unsupported precision, --skip_steps >= --max_steps, or a bad model shape / growth plan.
    """

    check_flags(args)
    device_name, avail = available_precisions()
    device_type = "cuda" if device_name.startswith("cuda") else "cpu"
    precisions = [p for p in PRECISIONS if p in avail] if args.sweep else list(dict.fromkeys(args.precision))
    stages = list(STAGES) if args.sweep else list(dict.fromkeys(args.zero_stage))
    for p in precisions:
        if p not in avail:  # the words train.py uses for the same refusal
            raise BenchError(
                f"--precision {p}: this device ({device_name}) does not support {p}; "
                f"available precisions: {', '.join(avail)}"
            )
    if args.skip_steps >= args.max_steps:
        raise BenchError(
            f"--skip_steps {args.skip_steps} must be below --max_steps {args.max_steps}: nothing would be measured"
        )
    if args.world_size is None:
        args.world_size = torch.cuda.device_count() if device_type == "cuda" else 2
    if args.threads_per_rank is None:
        args.threads_per_rank = max(1, (os.cpu_count() or 1) // args.world_size)
    try:
        shape = {k: getattr(args, k) for k in SHAPE_FLAGS}
        if args.growth_plan:  # the model starts at the plan's shape (the baseline trains that one)
            try:
                cfg = load_stages(args.growth_plan).start
            except FileNotFoundError:
                raise BenchError(f"--growth_plan {args.growth_plan}: no such file") from None
            except (GrowthError, OSError) as e:  # YAML syntax (FILE:LINE), a bad plan, an unreadable file
                raise BenchError(f"--growth_plan {args.growth_plan}: {e}") from None
            args.preset = "growth plan start"
        else:
            cfg = from_preset(args.preset, **{k: v for k, v in shape.items() if v is not None})
        fpt = flops_per_token(cfg, args.seq_len)
    except ValueError as e:
        raise BenchError(str(e)) from None
    return device_type, precisions, stages, cfg, fpt


def _common(args: argparse.Namespace, cfg, fpt: int, device_type: str) -> dict:
    """The fields every record shares (model, batch, device, steps)."""

    global_batch = args.micro_batch * args.grad_accum * args.world_size
    return {
        "preset": args.preset,
        "model": cfg.to_dict(),
        "n_params": param_count(cfg),
        "flops_per_token": fpt,
        "seq_len": args.seq_len,
        "micro_batch": args.micro_batch,
        "grad_accum": args.grad_accum,
        "global_batch": global_batch,
        "tokens_per_step": global_batch * args.seq_len,
        "device": device_description(),
        "threads_per_rank": args.threads_per_rank if device_type == "cpu" else None,
        "steps": args.max_steps,
        "warmup_steps": args.skip_steps,
    }


def error_line(e: BenchError) -> str:
    """The one line a failed run is recorded with: the error's message, or, for one that carries the ranks' last
    output, its first line and the last output line that names an exception (else the last line)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else type(e).__name__
    named = [ln for ln in lines[1:] if re.match(r"[\w.]*(Error|Exception|Interrupt)\b", ln)]
    return f"{lines[0].removesuffix('; last output:')}: {(named or lines[1:])[-1]}"


def failed_record(args: argparse.Namespace, name: str, kind: str, precision: str, base: dict, e: BenchError,
                  stage: int | None = None, recompute: bool = False) -> dict:  # fmt: skip
    """The record of a run that failed or timed out: what it was, ``failed: true``, ``error`` (one line,
    ``error_line``) and ``output_tail`` (the error's whole text, at most its last 2,000 characters)."""
    rec = {"name": name, "kind": kind, "precision": precision, "world_size": args.world_size}
    rec.update({"zero_stage": stage} if kind == "deepspeed" else {})
    rec.update(base["common"], activation_recomputation=recompute, failed=True, error=error_line(e))
    rec["output_tail"] = str(e)[-2000:]
    return rec


def _keep(records: list[dict], rec: dict, out: Path) -> None:
    """Append ``rec`` and write it at once: OUT/NAME.json and OUT/bench.json (every record so far), atomically."""
    records.append(rec)
    write_json(out / f"{rec['name']}.json", rec, overwrite=True)
    write_json(out / "bench.json", records, overwrite=True)


def _measure(args: argparse.Namespace, precisions: list[str], stages: list[int], base: dict, work: Path) -> list:
    """The PyTorch baseline and every DeepSpeed run, per precision; one record each, written to ``args.out`` as it
    ends (``_keep``). A run that fails or times out gets a failed record (``failed_record``) and the next runs."""
    records: list[dict] = []
    out = Path(args.out)
    for p in precisions:
        baseline = None
        if not args.no_baseline:
            try:
                baseline = bench_pytorch(args, p, work, base)
            except BenchError as e:
                _keep(records, failed_record(args, f"pytorch-{p}", "pytorch", p, base, e), out)
                print(f"growlm-bench: pytorch-{p}: failed: {records[-1]['error']}", flush=True)
            else:
                _keep(records, baseline, out)
        modes = {"off": [False], "on": [True], "both": [False, True]}[args.activation_checkpointing]
        for s in stages:
            for recompute in modes:
                try:
                    rec = bench_deepspeed(args, s, p, work, base, recompute)
                except BenchError as e:
                    name = f"zero{s}-{p}" + ("-ckpt" if recompute else "")
                    rec = failed_record(args, name, "deepspeed", p, base, e, s, recompute)
                    _keep(records, rec, out)
                    print(f"growlm-bench: {name}: failed: {rec['error']}", flush=True)
                    continue
                rec["baseline_step_time_s"] = baseline["step_time_s_median"] if baseline else None
                rec["overhead_vs_baseline"] = (
                    rec["step_time_s_median"] / baseline["step_time_s_median"] if baseline else None
                )
                _keep(records, rec, out)
                print(
                    f"growlm-bench: {rec['name']}: {rec['tokens_per_s']:,.0f} tokens/s, MFU {format_mfu(rec['mfu'])}",
                    flush=True,
                )
    add_recompute_savings([r for r in records if not r.get("failed")])
    return records


def _write_failures(out: Path, records: list[dict]) -> None:
    """After ``write_reports`` (given the runs that finished): every failed run's JSON record, bench.json with all
    records in run order, and a table of the failed runs under bench.md."""
    failures = [r for r in records if r.get("failed")]
    for rec in failures:
        write_json(out / f"{rec['name']}.json", rec, overwrite=True)
    write_json(out / "bench.json", records, overwrite=True)
    if failures:
        lines = ["", "Failed runs (no numbers; each record's output_tail has the ranks' last output):", "",
                 "| run | error |", "|---|---|"]  # fmt: skip
        lines += [f"| {r['name']} | {r['error'].replace('|', '/')} |" for r in failures]
        with open(out / "bench.md", "a") as f:
            f.write("\n".join(lines) + "\n")


def run(args: argparse.Namespace) -> list[dict]:
    """Run every (ZeRO stage, precision) the flags ask for through train.py, plus the PyTorch baseline; one summary
    record per run (tokens/s, model FLOP/s, MFU, peak RSS bytes), each written to ``--out`` as its run ends; a run
    that failed or timed out has a failed record (``failed_record``: its error line) instead.

    Raises:
        BenchError: bad flags for this device (before anything runs), or another process is writing ``--out``
            (``runtime.lock.output_lock``; its holder named, nothing run or touched).
    """

    device_type, precisions, stages, cfg, fpt = _resolve(args)
    out = Path(args.out)
    try:
        with output_lock(out):  # one growlm-bench per --out: two would interleave their records and reports
            base = {"device_type": device_type, "common": _common(args, cfg, fpt, device_type), "peaks": {}}
            for p in precisions:  # measured only once the lock is held: a refusal is at once
                base["peaks"][(p, args.threads_per_rank)] = device_peak(p, args.threads_per_rank, args.peak_tflops)
            return _run_into(args, out, precisions, stages, base, cfg)
    except LockHeldError as e:
        raise BenchError(output_held_message("--out", out, e)) from None


def _run_into(args: argparse.Namespace, out: Path, precisions, stages, base: dict, cfg) -> list[dict]:
    """``run``'s measurements and reports, with ``out``'s writer lock held."""
    out.mkdir(parents=True, exist_ok=True)
    if args.keep_runs:  # kept where the user looks: OUT/runs (train.py run folders, configs, logs)
        work = out / "runs"
        work.mkdir(parents=True, exist_ok=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="growlm-bench-"))
    try:
        records = _measure(args, precisions, stages, base, work)
    finally:
        if not args.keep_runs:
            shutil.rmtree(work, ignore_errors=True)
    write_reports(args, out, [r for r in records if not r.get("failed")], base, cfg.shape_str())
    _write_failures(out, records)
    return records


@interruptible("growlm-bench")
def main(argv: list[str] | None = None) -> int:
    """growlm-bench's entry point: 0 when every run finished, 1 when one failed or timed out (each named on stderr
    with its error line; its record says so), 2 for bad input (one line, nothing run)."""
    args = parse_args(argv)
    try:
        records = run(args)
    except BenchError as e:
        print(f"growlm-bench: error: {e}", file=sys.stderr)
        return 2
    ok = [r for r in records if not r.get("failed")]
    print((Path(args.out) / "bench.md").read_text(), flush=True)
    print(
        f"growlm-bench: {len(records)} JSON record(s), bench.md{' and bench.png' if len(ok) > 1 else ''} in {args.out}",
        flush=True,
    )
    for r in records:
        if r.get("failed"):
            print(f"growlm-bench: error: {r['name']}: {r['error']}", file=sys.stderr)
    return 1 if len(ok) < len(records) else 0


if __name__ == "__main__":
    sys.exit(main())
