"""Benchmark: live growth of a ZeRO-3 run against growing by save -> load (issue 4).

Two real ranks (gloo on CPU, NCCL on GPUs) train a >= 50M-parameter GPT for one step, then grow it 2x, once in
width and once in depth, two ways:

* live: ``growth.live.grow_engine`` gathers each parameter, expands it and writes it into a new engine;
* save -> load: the grown engine is saved with ``save_checkpoint`` and a fresh engine for the grown model loads it
  (what a job restart after an offline growth would pay on top of the growth itself).

Per rank it records seconds and peak RSS (bytes, ``ru_maxrss``) before and after each phase. Prints a table and
writes JSON. Run ``python -m eval.bench.live_growth --help``.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from runtime.launch import pythonpath_with

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = {
    # name: (start shape, target shape); both starts have > 50M parameters with the GPT-2 vocabulary
    "width x2": (dict(n_layer=24, n_embd=384, n_head=4), dict(n_layer=24, n_embd=768, n_head=8)),
    "depth x2": (dict(n_layer=6, n_embd=768, n_head=8), dict(n_layer=12, n_embd=768, n_head=8)),
}


def _rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(case: str, out: str, seq_len: int) -> None:
    """One rank: build, one step, live growth, then save -> load of the grown model."""
    sys.path.insert(0, str(REPO))
    from runtime.dist import init_distributed

    info = init_distributed(600)
    import torch
    import torch.distributed as dist

    from growth.apply import OptimizerPolicy
    from growth.live import collect_old_engine, grow_engine
    from growth.ops import make_plan
    from growth.schedule import ScheduleRule
    from model.config import GPTConfig, param_count
    from runtime.engine import build_engine, release_engine

    ds_cfg = json.loads((REPO / "ds_configs" / "zero3_fp32.json").read_text())
    ds_cfg["train_micro_batch_size_per_gpu"] = 1
    ds_cfg["scheduler"]["params"]["total_num_steps"] = 100
    old_cfg = GPTConfig(n_positions=seq_len, **SCENARIOS[case][0])
    new_cfg = GPTConfig(n_positions=seq_len, **SCENARIOS[case][1])
    rec: dict = {
        "case": case,
        "rank": info.rank,
        "params_from": param_count(old_cfg),
        "params_to": param_count(new_cfg),
    }
    torch.manual_seed(0)
    rec["rss_start_bytes"] = _rss()
    engine = build_engine(old_cfg, None, ds_cfg)
    x = torch.randint(0, old_cfg.vocab_size, (1, seq_len + 1))
    loss = engine(x[:, :-1], x[:, 1:])
    engine.backward(loss)
    engine.step()
    rec["rss_trained_small_bytes"] = _rss()
    plan = make_plan(old_cfg, new_cfg, "duplicate")
    dist.barrier()
    t0 = time.perf_counter()
    result = grow_engine(
        engine,
        plan,
        lambda c, m: build_engine(c, m, ds_cfg, partitioned=True),
        policy=OptimizerPolicy(),
        schedule_rule=ScheduleRule(),
    )
    new = result.engine
    del engine
    result = collect_old_engine(result)  # the replaced engine is freed here (growth.live)
    rec["live_seconds"] = time.perf_counter() - t0
    rec["live_bytes_moved"] = result.bytes_moved
    rec["live_phase_seconds"], rec["live_phase_bytes"] = result.phase_seconds, result.phase_bytes
    rec["live_peak_rss_bytes"] = result.peak_rss_bytes  # max over ranks
    rec["rss_after_live_bytes"] = _rss()
    ckpt = Path(out).with_suffix(f".ckpt-{case.replace(' ', '')}")
    dist.barrier()
    t0 = time.perf_counter()
    new.save_checkpoint(str(ckpt), tag="grown")
    dist.barrier()
    rec["save_seconds"] = time.perf_counter() - t0
    release_engine(new)
    del new, result
    gc.collect()  # the grown engine is freed before the fresh one is built (runtime.engine.release_engine)
    t0 = time.perf_counter()
    fresh = build_engine(new_cfg, None, ds_cfg, partitioned=True)
    path, _ = fresh.load_checkpoint(str(ckpt), tag="grown")
    dist.barrier()
    rec["load_seconds"] = time.perf_counter() - t0
    rec["rss_after_load_bytes"] = _rss()
    assert path is not None
    rec["save_load_seconds"] = rec["save_seconds"] + rec["load_seconds"]
    all_recs = [None] * info.world_size
    dist.all_gather_object(all_recs, rec)
    if info.rank == 0:
        Path(out).write_text(json.dumps(all_recs))
        shutil.rmtree(ckpt, ignore_errors=True)
    dist.barrier()


def run_case(case: str, seq_len: int, world_size: int) -> list[dict]:
    """Start ``world_size`` ranks of the worker for one growth case on loopback and return their per-rank records."""
    from runtime.launch import launch_ranks

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rec.json"
        cmd = [sys.executable, "-m", "eval.bench.live_growth", "--worker", case, "--out", str(out),
               "--seq_len", str(seq_len)]  # fmt: skip
        res = launch_ranks(cmd, world_size, envs=[{"PYTHONPATH": pythonpath_with(REPO)}] * world_size, cwd=REPO,
                           timeout_s=3600)  # fmt: skip
        if res.returncode or res.timed_out:
            raise SystemExit(f"benchmark ranks failed for {case!r}: exit codes {res.returncodes}\n{res.output[-3000:]}")
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.bench.live_growth", description=__doc__.split("\n\n")[0])
    default_out = REPO / "eval" / "results" / "live_growth.json"
    p.add_argument("--out", default=str(default_out), help="JSON file for the per-rank records")
    p.add_argument("--seq_len", type=int, default=32, help="tokens per sequence of the one training step")
    p.add_argument("--world_size", type=int, default=2, help="ranks (processes on this machine)")
    p.add_argument("--cases", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS), help="which growths to run")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker, args.out, args.seq_len)
        return 0
    records = [rec for case in args.cases for rec in run_case(case, args.seq_len, args.world_size)]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(records, indent=2))
    mib = 1 / 2**20
    print(f"{'case':10s} {'rank':>4s} {'params':>16s} {'live s':>7s} {'save+load s':>11s} {'ratio':>6s} "
          f"{'RSS before MiB':>14s} {'RSS live MiB':>12s} {'RSS load MiB':>12s}")  # fmt: skip
    for r in records:
        ratio = r["live_seconds"] / r["save_load_seconds"]
        print(f"{r['case']:10s} {r['rank']:4d} {r['params_from'] / 1e6:6.1f}M->{r['params_to'] / 1e6:6.1f}M "
              f"{r['live_seconds']:7.2f} {r['save_load_seconds']:11.2f} {ratio:6.2f} "
              f"{r['rss_trained_small_bytes'] * mib:14.0f} {r['rss_after_live_bytes'] * mib:12.0f} "
              f"{r['rss_after_load_bytes'] * mib:12.0f}")  # fmt: skip
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
