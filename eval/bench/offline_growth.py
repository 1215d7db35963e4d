"""Benchmark: seconds and peak RSS of ``growlm-grow`` on a >= 50M-parameter checkpoint, against DeepSpeed's own
``ds_to_universal`` conversion of the same checkpoint, as ratios (the goal: growth at most 1.5x the conversion).

    python -m growlm.eval.bench.offline_growth [--work DIR] [--json OUT.json] [--repeat N]

Steps: train.py writes the checkpoint (2 ranks, ZeRO-2 fp32, 2 steps, micro batch 1, seq_len 32; preset cpu-medium
widened to 8 x 512, ~51M parameters); then, each in a fresh process and ``--repeat`` times in turn (the fastest
time of each case counts, since other jobs may share the CPU): (a) ds_to_universal alone, (b) growlm-grow reshard
only, (c) growlm-grow masked growth 8 -> 12 layers. growlm-grow reads the ZeRO shards itself and writes the
universal checkpoint in one pass (growth/offline/pipeline.py); it also verifies the input's manifest and fsyncs its
output,
which ds_to_universal does not. Peak RSS is the largest ``ru_maxrss`` of the measured process and of its waited-for
children (the process tree's largest process; growlm-grow starts none).

Saves a JSON list, one row per case: ``case``, ``grow_s``, ``ds_to_universal_s``, ``ratio`` (grow_s /
ds_to_universal_s), ``peak_rss_bytes``, ``ds_to_universal_peak_rss_bytes``, ``rss_ratio``, ``params``,
``grown_params``, ``all_s`` (every repetition), ``command`` (relative to the repository, WORK for the work folder),
``load_average_1m`` (at the end: how busy the CPU was).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from growlm import DS_CONFIG_DIR, TRAIN_SCRIPT
from growlm.eval.bench.throughput import recorded_command
from growlm.model.config import param_count
from growlm.runtime.commands import HelpFormatter, add_version
from growlm.runtime.launch import launch_ranks
from growlm.runtime.run_state import STATE_FILE, RunState

MODEL = ["--preset", "cpu-medium", "--n_layer", "8", "--n_embd", "512", "--n_head", "8"]

_MEASURE = """
import json, resource, subprocess, sys, time
t = time.perf_counter()
if sys.argv[1] == "grow":
    from growlm.growth.offline.cli import main
    rc = main(sys.argv[2:])
else:
    rc = subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
dt = time.perf_counter() - t
self_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
child_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"rc": rc, "seconds": dt, "self_rss_bytes": self_kib * 1024, "child_rss_bytes": child_kib * 1024}))
"""


def env() -> dict[str, str]:
    """The environment of the measured subprocesses: loopback master, 1 thread, DeepSpeed's CPU accelerator."""
    e = dict(os.environ)
    e.update(MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    return e


def measure(kind: str, argv: list[str]) -> dict:
    """Run one measured command (``kind``: ds_to_universal or growlm-grow) in a subprocess; its seconds and peak RSS
    (bytes, the larger of it and its children)."""
    r = subprocess.run([sys.executable, "-c", _MEASURE, kind, *argv], env=env(), capture_output=True, text=True)
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode or not lines:
        raise SystemExit(f"{kind} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    out = json.loads(lines[-1])
    if out["rc"]:
        raise SystemExit(f"{kind} exited {out['rc']}:\n{r.stderr[-2000:]}")
    out["peak_rss_bytes"] = max(out["self_rss_bytes"], out["child_rss_bytes"])
    return out


def write_checkpoint(work: Path) -> Path:
    """The benchmark checkpoint (reused when present)."""
    ckpt = work / "run" / "checkpoints"
    if (ckpt / "latest").is_file():
        return ckpt
    cfg = json.loads((DS_CONFIG_DIR / "zero2_fp32.json").read_text())
    cfg["train_micro_batch_size_per_gpu"] = 1
    cfg["scheduler"]["params"]["total_num_steps"] = 1000
    (work / "ds.json").write_text(json.dumps(cfg))
    args = [*MODEL, "--seq_len", "32", "--no_final_eval", "--max_steps", "2", "--ds_config", str(work / "ds.json")]
    args += ["--out_dir", str(work / "run")]

    res = launch_ranks([sys.executable, str(TRAIN_SCRIPT), *args], 2, base_env=env(), timeout_s=1800)
    if res.returncode or res.timed_out:
        raise SystemExit("train.py failed:\n" + res.outputs[0][-3000:])
    return ckpt


CASES = {  # case -> growlm-grow arguments after CKPT OUT
    "reshard (no growth)": [],
    "grow masked 8->12 layers": ["--family", "masked", "--n_layer", "12", "--ramp_steps", "100"],
}


def ds_command(tag: Path, out: Path) -> list[str]:
    """DeepSpeed's ds_to_universal on ``tag`` (one extract and one merge worker, as growlm-grow uses one process)."""
    return [
        sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(tag),
        "--output_folder", str(out / tag.name), "--inject_missing_state",
        "--num_extract_workers", "1", "--num_merge_workers", "1",
    ]  # fmt: skip


def measure_all(ckpt: Path, work: Path, repeat: int) -> dict[str, list[dict]]:
    """Every case ``repeat`` times, interleaved with ds_to_universal; each output removed after its run."""

    tag = ckpt / (ckpt / "latest").read_text().strip()
    runs: dict[str, list[dict]] = {"ds_to_universal": [], **{c: [] for c in CASES}}
    for _ in range(repeat):
        shutil.rmtree(work / "out", ignore_errors=True)
        runs["ds_to_universal"].append(measure("cmd", ds_command(tag, work / "out")))
        for case, extra in CASES.items():
            shutil.rmtree(work / "out", ignore_errors=True)
            runs[case].append(measure("grow", [str(ckpt), str(work / "out"), *extra]))
            print(f"{case}: {runs[case][-1]['seconds']:.1f} s", flush=True)
    return runs


def rows(runs: dict[str, list[dict]], ckpt: Path, work: Path, params: int, grown: int) -> list[dict]:
    """The saved rows: the fastest repetition of each case against the fastest ds_to_universal."""

    best = {k: min(v, key=lambda r: r["seconds"]) for k, v in runs.items()}
    ds = best["ds_to_universal"]
    out = []
    for case, extra in CASES.items():
        r = best[case]
        out.append({
            "case": case,
            "grow_s": r["seconds"],
            "ds_to_universal_s": ds["seconds"],
            "ratio": r["seconds"] / ds["seconds"],
            "peak_rss_bytes": r["peak_rss_bytes"],
            "ds_to_universal_peak_rss_bytes": ds["peak_rss_bytes"],
            "rss_ratio": r["peak_rss_bytes"] / ds["peak_rss_bytes"],
            "params": params,
            "grown_params": grown if extra else params,
            "all_s": [x["seconds"] for x in runs[case]],
            "ds_to_universal_all_s": [x["seconds"] for x in runs["ds_to_universal"]],
            "command": recorded_command(["growlm-grow", str(ckpt), str(work / "out"), *extra], work),
            "ds_to_universal_command": recorded_command(ds_command(ckpt / "TAG", work / "out"), work),
            "benchmark_command": "python -m growlm.eval.bench.offline_growth --repeat " + str(len(runs[case])),
            "load_average_1m": os.getloadavg()[0],  # other jobs on the CPU: the times are noisy when this is high
        })  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.prog = "python -m growlm.eval.bench.offline_growth"
    p.formatter_class = HelpFormatter  # every flag's default in --help
    add_version(p)
    p.add_argument("--work", default=None, help="working folder (default: a temporary one, removed)")
    default_json = Path("runs") / "bench" / "offline_growth.json"
    p.add_argument("--json", default=str(default_json), help="where to save the results")
    p.add_argument("--repeat", type=int, default=2, help="runs of each case (the fastest counts)")
    args = p.parse_args(argv)
    tmpdir = tempfile.TemporaryDirectory(prefix="growlm-bench-") if args.work is None else None
    work = Path(tmpdir.name if tmpdir else args.work)
    work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    ckpt = write_checkpoint(work)
    print(f"checkpoint {ckpt} ({time.perf_counter() - t:.0f} s)", flush=True)

    tag = ckpt / (ckpt / "latest").read_text().strip()
    cfg = RunState.from_json((tag / STATE_FILE).read_text()).model_config
    runs = measure_all(ckpt, work, args.repeat)
    grown = param_count(replace(cfg, n_layer=12))
    result = rows(runs, ckpt, work, param_count(cfg), grown)
    print(f"\nmodel {cfg.shape_str()}: {param_count(cfg) / 1e6:.1f}M parameters -> grown {grown / 1e6:.1f}M")
    print(f"{'':28s} {'seconds':>8s} {'x ds':>6s} {'peak RSS MiB':>13s} {'x ds':>6s}")
    ds = result[0]
    print(f"{'ds_to_universal':28s} {ds['ds_to_universal_s']:8.1f} {1:6.2f} "
          f"{ds['ds_to_universal_peak_rss_bytes'] / 2**20:13.0f} {1:6.2f}")  # fmt: skip
    for r in result:
        print(f"{r['case']:28s} {r['grow_s']:8.1f} {r['ratio']:6.2f} {r['peak_rss_bytes'] / 2**20:13.0f} "
              f"{r['rss_ratio']:6.2f}")  # fmt: skip
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {args.json}")
    if tmpdir is not None:
        tmpdir.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
