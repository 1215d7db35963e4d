"""Benchmark: live growth against growing by save -> load, at ZeRO-2 and ZeRO-3, fp32 and bf16.

Per row (a growth case at one ZeRO stage and precision) two real ranks (gloo on CPU, NCCL on GPUs) are launched;
they train a 60-80M-parameter GPT for one step, then:

* live: ``growth.live.grow.grow_engine`` grows it 2x (width or depth, staged-training duplication) into a new engine,
  then ``collect_old_engine`` frees the old one;
* save -> load, in the same processes: the grown engine is saved with ``save_checkpoint``, released, and a fresh
  engine of the grown model (``runtime.engine.build_engine``; at ZeRO-3 inside ``zero.Init``, the cheaper of the
  two builds ``train.py`` knows) loads it; what a restart after an offline growth pays on top of the growth itself
  and the launch.

Recorded per row (the slower rank's seconds, the larger rank's bytes): ``live_s``, ``save_load_s`` (save + build +
load; ``fresh_build_s`` is the fresh engine's build inside it), ``ratio`` = live_s / save_load_s, the phases of the
live growth (growth.live.grow.GROWTH_PHASES) and the split of its engine build (runtime.engine.BUILD_SPLIT +
adam_state), ``rss_after_bytes`` (VmRSS after the live growth, old engine freed) and ``rss_fresh_bytes`` (VmRSS
with the fresh engine loaded instead, same processes, after the grown engine was released and freed). The ranks run
with ``THP_MEM_ALLOC_ENABLE=1`` (torch's CPU allocator asks for transparent huge pages for tensors of 2 MiB and
more; ``--no_thp`` turns it off): on this CPU VM the first touch of fresh pages costs about 6x a memset (0.6 s per
400 MB, 0.16 s with huge pages), and every phase of both ways allocates (engine buffers, Adam state, gathered and
grown tensors, checkpoint reads). Prints a table and writes a JSON list. Run ``python -m growlm.eval.bench.live_growth
--help``; ``--small`` runs the same rows on 1-2M-parameter models (a quick check, not the measurement).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from growlm import PACKAGE_DIR
from growlm.growth.live.grow import collect_old_engine, grow_engine
from growlm.growth.ops import make_rules
from growlm.growth.ops.apply import OptimizerPolicy
from growlm.growth.ops.schedule_rule import ScheduleRule
from growlm.model.config import GPTConfig, param_count
from growlm.runtime import collectives
from growlm.runtime.commands import HelpFormatter, add_version
from growlm.runtime.dist import init_distributed
from growlm.runtime.ds_config import shipped_ds_config
from growlm.runtime.engine import build_engine, release_engine
from growlm.runtime.launch import launch_ranks
from growlm.runtime.process_memory import release_heap, rss_bytes

SCENARIOS = {
    # name: (start shape, target shape); both starts have 60-80M parameters with the GPT-2 vocabulary
    "width x2": (dict(n_layer=24, n_embd=384, n_head=4), dict(n_layer=24, n_embd=768, n_head=8)),
    "depth x2": (dict(n_layer=6, n_embd=768, n_head=8), dict(n_layer=12, n_embd=768, n_head=8)),
}
SMALL = {
    "width x2": (dict(n_layer=2, n_embd=32, n_head=2), dict(n_layer=2, n_embd=64, n_head=4)),
    "depth x2": (dict(n_layer=2, n_embd=64, n_head=4), dict(n_layer=4, n_embd=64, n_head=4)),
}


def worker(case: str, stage: int, precision: str, out: str, seq_len: int, small: bool) -> None:
    """One rank: build, one step, live growth, then save -> release -> fresh build -> load of the grown model."""

    info = init_distributed(600)

    ds_cfg = json.loads(shipped_ds_config(stage, precision, info.device.type).read_text())  # GPU variant on CUDA
    ds_cfg["train_micro_batch_size_per_gpu"] = 1
    ds_cfg["scheduler"]["params"]["total_num_steps"] = 100
    shapes = (SMALL if small else SCENARIOS)[case]
    old_cfg, new_cfg = (GPTConfig(n_positions=seq_len, **s) for s in shapes)
    build = functools.partial(build_engine, ds_config=ds_cfg, partitioned=stage == 3)
    rec: dict = {"params_from": param_count(old_cfg), "params_to": param_count(new_cfg)}
    torch.manual_seed(0)
    engine = build_engine(old_cfg, None, ds_cfg)  # GPT-2's init (zero.Init would leave garbage: runtime.engine)
    x = torch.randint(0, old_cfg.vocab_size, (1, seq_len + 1), device=info.device)  # on the engine's device
    engine.backward(engine(x[:, :-1], x[:, 1:]))
    engine.step()
    rec["rss_before_bytes"] = rss_bytes()
    plan = make_rules(old_cfg, new_cfg, "duplicate")
    collectives.barrier()
    t0 = time.perf_counter()
    result = grow_engine(engine, plan, build, policy=OptimizerPolicy(), schedule_rule=ScheduleRule())
    new = result.engine
    del engine
    result = collect_old_engine(result)  # the replaced engine is freed here (growth.live.grow)
    rec["live_s"] = time.perf_counter() - t0
    rec.update(bytes_moved=result.bytes_moved, collectives=result.collectives, peak_rss_bytes=result.peak_rss_bytes)
    rec["cuda_memory"] = result.cuda_memory  # this rank's CUDA bytes before / at the growth's peak / after (or None)
    rec["phase_s"], rec["phase_bytes"], rec["build_split_s"] = (
        result.phase_seconds,
        result.phase_bytes,
        result.build_seconds,
    )
    rec["rss_after_bytes"] = rss_bytes()
    ckpt = Path(out).with_suffix(".ckpt")
    collectives.barrier()
    t0 = time.perf_counter()
    new.save_checkpoint(str(ckpt), tag="grown")
    collectives.barrier()
    rec["save_s"] = time.perf_counter() - t0
    release_engine(new)
    del new, result
    gc.collect()  # the grown engine is freed before the fresh one is built (runtime.engine.release_engine)
    release_heap()
    t0 = time.perf_counter()
    fresh = build(new_cfg, None)
    rec["fresh_build_s"] = time.perf_counter() - t0  # part of load_s: what a restart's engine construction costs
    path, _ = fresh.load_checkpoint(str(ckpt), tag="grown")
    collectives.barrier()
    rec["load_s"] = time.perf_counter() - t0
    assert path is not None
    gc.collect()
    release_heap()
    rec["rss_fresh_bytes"] = rss_bytes()
    all_recs = collectives.all_gather_object(rec)
    if info.rank == 0:
        Path(out).write_text(json.dumps(all_recs))
        shutil.rmtree(ckpt, ignore_errors=True)
    collectives.barrier()


def merge(case: str, stage: int, precision: str, ranks: list[dict]) -> dict:
    """One row from the ranks' records: the slowest rank's seconds, the largest rank's bytes."""
    worst = max(ranks, key=lambda r: r["live_s"])
    save_load = max(r["save_s"] + r["load_s"] for r in ranks)
    return {
        "case": case,
        "zero_stage": stage,
        "precision": precision,
        "world_size": len(ranks),
        "params_from": ranks[0]["params_from"],
        "params_to": ranks[0]["params_to"],
        "live_s": worst["live_s"],
        "save_load_s": save_load,
        "ratio": worst["live_s"] / save_load,
        "save_s": max(r["save_s"] for r in ranks),
        "load_s": max(r["load_s"] for r in ranks),
        "fresh_build_s": max(r["fresh_build_s"] for r in ranks),
        "phase_s": worst["phase_s"],
        "phase_bytes": worst["phase_bytes"],
        "build_split_s": worst["build_split_s"],
        "bytes_moved": worst["bytes_moved"],
        "collectives": worst["collectives"],
        "rss_before_bytes": max(r["rss_before_bytes"] for r in ranks),
        "rss_after_bytes": max(r["rss_after_bytes"] for r in ranks),
        "rss_fresh_bytes": max(r["rss_fresh_bytes"] for r in ranks),
        "rss_after_per_rank": [r["rss_after_bytes"] for r in ranks],
        "rss_fresh_per_rank": [r["rss_fresh_bytes"] for r in ranks],
        "peak_rss_bytes": worst["peak_rss_bytes"],
    }


def run_row(case: str, stage: int, precision: str, args: argparse.Namespace) -> dict:
    """Launch ``args.world_size`` ranks of the worker for one row on loopback; the merged row."""

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rec.json"
        cmd = [sys.executable, "-m", "growlm.eval.bench.live_growth", "--worker", case, "--stage", str(stage),
               "--precision", precision, "--out", str(out), "--seq_len", str(args.seq_len)]  # fmt: skip
        cmd += ["--small"] if args.small else []
        env = {"THP_MEM_ALLOC_ENABLE": "0" if args.no_thp else "1"}
        res = launch_ranks(cmd, args.world_size, envs=[env] * args.world_size, timeout_s=3600)
        if res.returncode or res.timed_out:
            raise SystemExit(f"benchmark ranks failed for {case!r}: exit codes {res.returncodes}\n{res.output[-3000:]}")
        return {**merge(case, stage, precision, json.loads(out.read_text())), "thp_mem_alloc": not args.no_thp}


def print_table(rows: list[dict]) -> None:
    """The rows as a fixed-width table: seconds, ratio, phases, RSS after growth against a fresh engine (MiB)."""
    mib = 1 / 2**20
    print(f"{'case':9s} {'ZeRO':>4s} {'prec':>4s} {'params':>15s} {'live s':>7s} {'save+load':>9s} {'ratio':>5s} "
          f"{'build':>6s} {'gather':>6s} {'expand':>6s} {'write':>6s} {'other':>6s} {'fresh build':>11s} "
          f"{'RSS after':>9s} {'RSS fresh':>9s} {'after/fresh':>11s}")  # fmt: skip
    for r in rows:
        ph = r["phase_s"]
        other = ph["refresh"] + ph["teardown"]
        print(f"{r['case']:9s} {r['zero_stage']:4d} {r['precision']:>4s} "
              f"{r['params_from'] / 1e6:5.1f}M->{r['params_to'] / 1e6:6.1f}M {r['live_s']:7.2f} "
              f"{r['save_load_s']:9.2f} {r['ratio']:5.2f} {ph['build']:6.2f} {ph['gather']:6.2f} {ph['expand']:6.2f} "
              f"{ph['write']:6.2f} {other:6.2f} {r['fresh_build_s']:11.2f} {r['rss_after_bytes'] * mib:9.0f} "
              f"{r['rss_fresh_bytes'] * mib:9.0f} "
              f"{r['rss_after_bytes'] / r['rss_fresh_bytes']:11.2f}")  # fmt: skip
    for r in rows:
        split = ", ".join(f"{k} {v:.2f}" for k, v in r["build_split_s"].items())
        print(f"build split s, {r['case']} ZeRO-{r['zero_stage']} {r['precision']}: {split}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m growlm.eval.bench.live_growth", description=__doc__.split("\n\n")[0])
    p.formatter_class = HelpFormatter  # every flag's default in --help
    add_version(p)
    default_out = Path("runs") / "bench" / "live_growth.json"
    p.add_argument("--out", default=str(default_out), help="JSON file for the rows (a list)")
    p.add_argument("--seq_len", type=int, default=32, help="tokens per sequence of the one training step")
    p.add_argument("--world_size", type=int, default=2, help="ranks (processes on this machine)")
    p.add_argument("--cases", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS), help="growths to run")
    p.add_argument("--stages", nargs="+", type=int, default=[2, 3], choices=[1, 2, 3], help="ZeRO stages")
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--small", action="store_true", help="1-2M-parameter models: a quick check of the rows")
    p.add_argument("--no_thp", action="store_true", help="ranks without THP_MEM_ALLOC_ENABLE=1 (see the docstring)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--stage", type=int, help=argparse.SUPPRESS)
    p.add_argument("--precision", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker, args.stage, args.precision, args.out, args.seq_len, args.small)
        return 0
    rows = []
    for case in args.cases:
        for stage in args.stages:
            for prec in args.precisions:
                rows.append(run_row(case, stage, prec, args))
                print(f"done: {case} ZeRO-{stage} {prec}: ratio {rows[-1]['ratio']:.2f}", flush=True)
    out = Path(args.out)
    command = ["python", "-m", "growlm.eval.bench.live_growth", *(argv if argv is not None else sys.argv[1:])]
    words = [a.replace(f"{PACKAGE_DIR}/", "") for a in command]  # relative to the package; any other path as OUT
    recorded = shlex.join("OUT" if w == args.out and Path(w).is_absolute() else w for w in words)
    for r in rows:
        r["recorded_command"] = recorded
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))
    print_table(rows)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
