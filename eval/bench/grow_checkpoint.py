"""Benchmark: seconds and peak RSS of ``growlm-grow`` on a >= 50M-parameter checkpoint, against DeepSpeed's own
``ds_to_universal`` conversion of the same checkpoint (which growlm-grow runs first), as ratios.

    python -m eval.bench.grow_checkpoint [--work DIR] [--json OUT.json]

Steps: train.py writes the checkpoint (2 ranks, ZeRO-2 fp32, 2 steps, micro batch 1, seq_len 32; preset cpu-medium
widened to 8 x 512, ~51M parameters); then, each in a fresh process: (a) ds_to_universal alone, (b) growlm-grow
reshard only, (c) growlm-grow masked growth 8 -> 12 layers. Peak RSS is ``ru_maxrss`` of the process and of its
waited-for children (growlm-grow's own process does the per-parameter rewrite; its child is ds_to_universal).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runtime.launch import pythonpath_with

REPO = Path(__file__).resolve().parents[2]
MODEL = ["--preset", "cpu-medium", "--n_layer", "8", "--n_embd", "512", "--n_head", "8"]

_MEASURE = """
import json, resource, subprocess, sys, time
t = time.perf_counter()
if sys.argv[1] == "grow":
    from growth.grow_checkpoint import main
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
    e.update(MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", PYTHONPATH=pythonpath_with(REPO))
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
    cfg = json.loads((REPO / "ds_configs" / "zero2_fp32.json").read_text())
    cfg["train_micro_batch_size_per_gpu"] = 1
    cfg["scheduler"]["params"]["total_num_steps"] = 1000
    (work / "ds.json").write_text(json.dumps(cfg))
    args = [*MODEL, "--seq_len", "32", "--no_eval", "--max_steps", "2", "--ds_config", str(work / "ds.json")]
    args += ["--out_dir", str(work / "run")]
    from runtime.launch import launch_ranks

    res = launch_ranks([sys.executable, str(REPO / "train.py"), *args], 2, base_env=env(), cwd=REPO, timeout_s=1800)
    if res.returncode or res.timed_out:
        raise SystemExit("train.py failed:\n" + res.outputs[0][-3000:])
    return ckpt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", default=None, help="working folder (default: a temporary one, removed)")
    default_json = REPO / "eval" / "results" / "grow_checkpoint.json"
    p.add_argument("--json", default=str(default_json), help="where to save the results")
    args = p.parse_args(argv)
    tmpdir = None
    if args.work is None:
        tmpdir = tempfile.TemporaryDirectory(prefix="growlm-bench-")
        work = Path(tmpdir.name)
    else:
        work = Path(args.work)
        work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    ckpt = write_checkpoint(work)
    print(f"checkpoint {ckpt} ({time.perf_counter() - t:.0f} s)", flush=True)
    tag = ckpt / (ckpt / "latest").read_text().strip()
    from model.config import param_count
    from runtime.run_state import STATE_FILE, RunState

    cfg = RunState.from_json((tag / STATE_FILE).read_text()).model_config
    import shutil

    for d in ("ds_universal", "resharded", "grown"):
        shutil.rmtree(work / d, ignore_errors=True)
    rows = {
        "ds_to_universal": measure(
            "cmd",
            [
                sys.executable,
                "-m",
                "deepspeed.checkpoint.ds_to_universal",
                "--input_folder",
                str(tag),
                "--output_folder",
                str(work / "ds_universal" / tag.name),
                "--inject_missing_state",
                "--num_extract_workers",
                "1",
                "--num_merge_workers",
                "1",
            ],
        ),
        "growlm-grow reshard": measure("grow", [str(ckpt), str(work / "resharded")]),
        "growlm-grow grow 8->12 layers": measure(
            "grow", [str(ckpt), str(work / "grown"), "--family", "masked", "--n_layer", "12", "--ramp_steps", "100"]
        ),
    }
    grown_cfg = RunState.from_json((work / "grown" / tag.name / STATE_FILE).read_text()).model_config
    base = rows["ds_to_universal"]
    print(
        f"\nmodel {cfg.shape_str()}: {param_count(cfg) / 1e6:.1f}M parameters -> "
        f"grown {param_count(grown_cfg) / 1e6:.1f}M"
    )
    print(f"{'':32s} {'seconds':>8s} {'x ds':>6s} {'peak RSS MiB':>13s} {'x ds':>6s} {'(rewrite proc MiB)':>19s}")
    for name, r in rows.items():
        print(
            f"{name:32s} {r['seconds']:8.1f} {r['seconds'] / base['seconds']:6.2f} {r['peak_rss_bytes'] / 2**20:13.0f} "
            f"{r['peak_rss_bytes'] / base['peak_rss_bytes']:6.2f} {r['self_rss_bytes'] / 2**20:19.0f}"
        )
    result = {
        "model": cfg.to_dict(),
        "params": param_count(cfg),
        "grown_params": param_count(grown_cfg),
        "checkpoint_bytes": sum(f.stat().st_size for f in tag.rglob("*") if f.is_file()),
        "rows": rows,
        "ratios": {
            n: {"seconds": r["seconds"] / base["seconds"], "peak_rss": r["peak_rss_bytes"] / base["peak_rss_bytes"]}
            for n, r in rows.items()
        },
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"saved {args.json}")
    if tmpdir is not None:
        tmpdir.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
