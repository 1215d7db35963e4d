"""Benchmark: ``growlm-grow`` against DeepSpeed's own ``ds_to_universal`` on the same checkpoint, whole process
against whole process, in pairs: seconds (interpreter start, imports and all) and peak RSS, and from the measured
rates a projection to a 7B model.

    python -m growlm.eval.bench.offline_growth [--model cpu-medium|8x512] [--repeat N] [--work DIR] [--json OUT]

Steps: train.py writes the checkpoint (2 ranks, ZeRO-2 fp32, 2 steps, micro batch 1, seq_len 32; ``--model``:
preset cpu-medium, 6 x 256, 17.6M parameters, or cpu-medium widened to 8 x 512, 51.1M); then ``--repeat`` rounds,
each of: ``ds_to_universal --inject_missing_state`` with DeepSpeed's default workers (the command a user runs),
``growlm-grow CKPT OUT`` (reshard only) right after it, and ``growlm-grow`` growing the model by half its layers
(masked). Every command runs in a fresh process started through a small wrapper that records its wall seconds and
its peak RSS (``ru_maxrss`` of its waited-for children: the largest process of the command's tree). A case's ratio is
the median over rounds of (growlm-grow seconds / the same round's ds_to_universal seconds): other jobs on the CPU
slow both commands of a round alike. growlm-grow also verifies the input's manifest, checks every pickle, hashes and
fsyncs its output; ds_to_universal does none of these.

The projection: ``startup_s`` is the whole-process time of ``python -c "import growlm.growth.offline.cli,
growlm.growth.offline.pipeline"`` (the modules a reshard imports: the command line starts hashing the input before
it imports the pipeline and torch; the median of the rounds), the rest of the reshard's seconds divided by the
parameters gives seconds per parameter, and ``7B`` is startup plus that rate times 6.74e9 parameters (Llama-2 7B
shape); the host peak is the measured base (the import's peak RSS) plus runtime.memory.offline_growth_host_bytes for
that model's largest parameter (its embedding, 32,000 x 4,096) — the formula the command's own memory check uses,
checked here against the measured peak above the base. A 7B checkpoint (about 94 GB for ZeRO-2 bf16) is larger than
most hosts' page cache, so the projection holds for storage at least as fast as this machine's page cache was here:
read it as a lower bound.

Saves a JSON object: ``model``, ``params``, ``checkpoint_bytes`` (the input tag folder), ``cpu``, ``rounds`` (every
round's seconds and peaks), ``cases`` (per case: ``ratio_median``, ``ratios``, ``grow_s_median``,
``ds_to_universal_s_median``, ``peak_rss_bytes``, ``ds_to_universal_peak_rss_bytes``, ``command``),
``startup_s``, ``projection_7b`` and ``load_average_1m`` (at the end: how busy the CPU was).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from growlm import DS_CONFIG_DIR, TRAIN_SCRIPT
from growlm.eval.bench.throughput import recorded_command
from growlm.model.config import from_preset, largest_param_numel, param_count
from growlm.runtime.commands import HelpFormatter, add_version
from growlm.runtime.launch import launch_ranks
from growlm.runtime.machine import device_description
from growlm.runtime.memory import offline_growth_host_bytes
from growlm.runtime.run_state import STATE_FILE, RunState

MODELS = {  # --model: train.py's model flags
    "cpu-medium": ["--preset", "cpu-medium"],
    "8x512": ["--preset", "cpu-medium", "--n_layer", "8", "--n_embd", "512", "--n_head", "8"],
}
# Llama-2 7B's shape (6,738,415,616 parameters: 32 x 4096, FFN 11008, a 32,000-token vocabulary, untied head)
LLAMA_2_7B = dict(n_layer=32, n_embd=4096, n_head=32, n_kv_head=32, head_dim=128, n_inner=11008, vocab_size=32000)

IMPORTS = "import growlm.growth.offline.cli, growlm.growth.offline.pipeline"  # the startup row: what a reshard imports
_MEASURE = """
import json, resource, subprocess, sys, time
t = time.perf_counter()
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
dt = time.perf_counter() - t
kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"rc": rc.returncode, "seconds": dt, "peak_rss_bytes": kib * 1024, "stderr": rc.stderr[-2000:]}))
"""


def env() -> dict[str, str]:
    """The environment of the measured commands: loopback master, DeepSpeed's CPU accelerator; threads as a user's
    (torch's defaults)."""
    e = dict(os.environ)
    e.update(MASTER_ADDR="127.0.0.1", DS_ACCELERATOR="cpu")
    return e


def measure(cmd: list[str]) -> dict:
    """Run ``cmd`` in a fresh process under the wrapper: its wall seconds and peak RSS (bytes)."""
    r = subprocess.run([sys.executable, "-c", _MEASURE, *cmd], env=env(), capture_output=True, text=True)
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode or not lines:
        raise SystemExit(f"{cmd[:3]} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    out = json.loads(lines[-1])
    if out["rc"]:
        raise SystemExit(f"{shlex.join(cmd)} exited {out['rc']}:\n{out['stderr']}")
    return {"seconds": out["seconds"], "peak_rss_bytes": out["peak_rss_bytes"]}


def write_checkpoint(work: Path, model: str) -> Path:
    """The benchmark checkpoint (reused when present)."""
    ckpt = work / "run" / "checkpoints"
    if (ckpt / "latest").is_file():
        return ckpt
    cfg = json.loads((DS_CONFIG_DIR / "zero2_fp32.json").read_text())
    cfg["train_micro_batch_size_per_gpu"] = 1
    cfg["scheduler"]["params"]["total_num_steps"] = 1000
    (work / "ds.json").write_text(json.dumps(cfg))
    args = [*MODELS[model], "--seq_len", "32", "--no_final_eval", "--max_steps", "2"]
    args += ["--ds_config", str(work / "ds.json"), "--out_dir", str(work / "run")]
    res = launch_ranks([sys.executable, str(TRAIN_SCRIPT), *args], 2, base_env=env(), timeout_s=1800)
    if res.returncode or res.timed_out:
        raise SystemExit("train.py failed:\n" + res.outputs[0][-3000:])
    return ckpt


def grow_command() -> list[str]:
    """``growlm-grow`` as installed (its console script), else the module."""
    found = shutil.which("growlm-grow", path=str(Path(sys.executable).parent))
    return [found] if found else [sys.executable, "-m", "growlm.growth.offline.cli"]


def ds_command(tag: Path, out: Path) -> list[str]:
    """DeepSpeed's ds_to_universal on ``tag``, with its default workers (the command a user runs)."""
    return [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(tag),
            "--output_folder", str(out / tag.name), "--inject_missing_state"]  # fmt: skip


def cases(n_layer: int) -> dict[str, list[str]]:
    """case -> growlm-grow arguments after CKPT OUT."""
    grown = n_layer + n_layer // 2
    return {
        "reshard (no growth)": [],
        f"grow masked {n_layer}->{grown} layers": [
            "--family",
            "masked",
            "--n_layer",
            str(grown),
            "--ramp_steps",
            "100",
        ],
    }


def measure_rounds(ckpt: Path, work: Path, repeat: int, n_layer: int) -> list[dict]:
    """``repeat`` rounds of ds_to_universal, then each growlm-grow case, then the import alone; outputs removed."""
    tag = ckpt / (ckpt / "latest").read_text().strip()
    rounds = []
    for i in range(repeat):
        row: dict = {}
        shutil.rmtree(work / "out", ignore_errors=True)
        row["ds_to_universal"] = measure(ds_command(tag, work / "out"))
        for case, extra in cases(n_layer).items():
            shutil.rmtree(work / "out", ignore_errors=True)
            row[case] = measure([*grow_command(), str(ckpt), str(work / "out"), *extra])
        row["import"] = measure([sys.executable, "-c", IMPORTS])
        shutil.rmtree(work / "out", ignore_errors=True)
        rounds.append(row)
        print(f"round {i + 1}: " + ", ".join(f"{k} {v['seconds']:.2f} s" for k, v in row.items()), flush=True)
    return rounds


def summarize(rounds: list[dict], ckpt: Path, work: Path, model: str, params: int, n_layer: int) -> dict:
    """The saved object (see the module docstring)."""
    tag = ckpt / (ckpt / "latest").read_text().strip()
    med = lambda xs: statistics.median(xs)  # noqa: E731
    ds_s = [r["ds_to_universal"]["seconds"] for r in rounds]
    out_cases = {}
    for case, extra in cases(n_layer).items():
        ratios = [r[case]["seconds"] / r["ds_to_universal"]["seconds"] for r in rounds]
        out_cases[case] = {
            "ratio_median": med(ratios),
            "ratios": ratios,
            "grow_s_median": med([r[case]["seconds"] for r in rounds]),
            "ds_to_universal_s_median": med(ds_s),
            "peak_rss_bytes": max(r[case]["peak_rss_bytes"] for r in rounds),
            "ds_to_universal_peak_rss_bytes": max(r["ds_to_universal"]["peak_rss_bytes"] for r in rounds),
            "command": recorded_command(["growlm-grow", str(ckpt), str(work / "out"), *extra], work),
        }
    startup = med([r["import"]["seconds"] for r in rounds])
    base = max(r["import"]["peak_rss_bytes"] for r in rounds)
    reshard = out_cases["reshard (no growth)"]
    per_param = max(0.0, reshard["grow_s_median"] - startup) / params
    cfg = RunState.from_json((tag / STATE_FILE).read_text()).model_config
    llama7b = replace(from_preset("llama-tiny"), **LLAMA_2_7B)
    return {
        "model": model,
        "shape": cfg.shape_str(),
        "params": params,
        "checkpoint_bytes": sum(f.stat().st_size for f in tag.rglob("*") if f.is_file()),
        "cpu": device_description("cpu"),
        "ds_to_universal_command": recorded_command(ds_command(ckpt / "TAG", work / "out"), work),
        "benchmark_command": f"python -m growlm.eval.bench.offline_growth --model {model} --repeat {len(rounds)}",
        "rounds": rounds,
        "cases": out_cases,
        "startup_s": startup,
        "base_rss_bytes": base,
        "reshard_peak_above_base_bytes": reshard["peak_rss_bytes"] - base,
        "reshard_formula_bytes": offline_growth_host_bytes(largest_param_numel(cfg), largest_param_numel(cfg)),
        "projection_7b": {
            "params": param_count(llama7b),
            "reshard_s": startup + per_param * param_count(llama7b),
            "seconds_per_billion_params": per_param * 1e9,
            "host_peak_bytes": base
            + offline_growth_host_bytes(largest_param_numel(llama7b), largest_param_numel(llama7b)),  # fmt: skip
        },
        "load_average_1m": os.getloadavg()[0],  # other jobs on the CPU: the times are noisy when this is high
    }


def report(res: dict) -> str:
    """The printed table."""
    mib = 2**20
    lines = [f"model {res['shape']}: {res['params'] / 1e6:.1f}M parameters, checkpoint "
             f"{res['checkpoint_bytes'] / mib:,.0f} MiB; {res['cpu']}",
             f"{'':30s} {'median s':>9s} {'x ds (median of pairs)':>23s} {'peak RSS MiB':>13s}"]  # fmt: skip
    first = next(iter(res["cases"].values()))
    lines.append(f"{'ds_to_universal':30s} {first['ds_to_universal_s_median']:9.2f} {1:23.2f} "
                 f"{first['ds_to_universal_peak_rss_bytes'] / mib:13.0f}")  # fmt: skip
    for case, c in res["cases"].items():
        lines.append(
            f"{case:30s} {c['grow_s_median']:9.2f} {c['ratio_median']:23.2f} {c['peak_rss_bytes'] / mib:13.0f}"
        )
    p = res["projection_7b"]
    lines.append(
        f"startup (import) {res['startup_s']:.2f} s; reshard peak above base "
        f"{res['reshard_peak_above_base_bytes'] / mib:.0f} MiB (formula {res['reshard_formula_bytes'] / mib:.0f})"
    )
    lines.append(f"7B projection ({p['params'] / 1e9:.2f}B): reshard {p['reshard_s'] / 60:.1f} min "
                 f"({p['seconds_per_billion_params']:.1f} s per billion parameters), host peak "
                 f"{p['host_peak_bytes'] / 2**30:.1f} GiB")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.prog = "python -m growlm.eval.bench.offline_growth"
    p.formatter_class = HelpFormatter  # every flag's default in --help
    add_version(p)
    p.add_argument("--model", default="cpu-medium", choices=list(MODELS), help="the checkpoint's model")
    p.add_argument("--work", default=None, help="working folder (default: a temporary one, removed)")
    default_json = Path("runs") / "bench" / "offline_growth.json"
    p.add_argument("--json", default=str(default_json), help="where to save the results")
    p.add_argument("--repeat", type=int, default=5, help="rounds (each a ds_to_universal and growlm-grow pair)")
    args = p.parse_args(argv)
    tmpdir = tempfile.TemporaryDirectory(prefix="growlm-bench-") if args.work is None else None
    work = Path(tmpdir.name if tmpdir else args.work)
    work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    ckpt = write_checkpoint(work, args.model)
    print(f"checkpoint {ckpt} ({time.perf_counter() - t:.0f} s)", flush=True)
    tag = ckpt / (ckpt / "latest").read_text().strip()
    cfg = RunState.from_json((tag / STATE_FILE).read_text()).model_config
    rounds = measure_rounds(ckpt, work, args.repeat, cfg.n_layer)
    res = summarize(rounds, ckpt, work, args.model, param_count(cfg), cfg.n_layer)
    print(report(res))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    print(f"saved {args.json}")
    if tmpdir is not None:
        tmpdir.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
