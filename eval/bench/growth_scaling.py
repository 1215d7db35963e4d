"""Benchmark: how a live growth's seconds and each rank's memory change with the world size.

The same model (52.5M parameters: 14 x 512, 8 heads, a 16,384-token vocabulary) is grown live, depth x2 (96.6M) and
width x2 (193M), at ZeRO-2 and ZeRO-3, on 1, 2, 4 and 8 real ranks (gloo on CPU, NCCL on GPUs) of one machine. Each
rank builds the engine, takes one training step, grows it (``growth.live.grow.grow_engine`` then
``collect_old_engine``) and computes one loss with the grown engine (a forward pass: a training step of ZeRO-3 on a
CPU holds far more than its model states, and 8 such ranks do not fit a 24 GiB machine); ``loss_before`` is the
same forward pass of the old engine after its step, which the function-preserving growth keeps. Recorded per rank:

* ``growth_s``: wall seconds of the growth (the barrier before it to the old engine freed); ``growth_cpu_s``: the
  process's CPU seconds in that time (every thread, ``time.process_time``), the work a rank does whatever else shares
  its cores; ``phase_s``: the growth's phases (growth.live.grow.GROWTH_PHASES);
* ``rss_base_bytes`` (VmRSS of the process before any model: interpreter, torch, DeepSpeed, the process group),
  ``rss_before_bytes`` (after the old engine's step), ``peak_rss_bytes`` (the growth's own peak: the kernel's
  high-water mark VmHWM, reset just before the growth by writing 5 to ``/proc/self/clear_refs`` and read right
  after it; ``peak_before_bytes`` is the mark before the reset, the peak of building and stepping the old engine)
  and ``rss_after_bytes`` (old engine freed);
* ``predicted_old_bytes`` / ``predicted_new_bytes``: the model states the ZeRO formula gives one rank for the old and
  the grown model (``runtime.memory.model_state_bytes``: parameters, gradients and Adam state by stage, precision
  and world size), and ``predicted_work_bytes``, the growth's working set (``runtime.memory.growth_working_set_bytes``);
  during a growth both engines live, so the formula's peak is old + new + working set above the base;
* ``threads``: torch's CPU threads in the rank (``runtime.dist.rank_threads``: the node's cores over its ranks);
  ``fp32_master_separate``: whether the grown engine's optimizer keeps its fp32 master partitions in their own
  storage, as the formula's fp32 bytes assume (``runtime.engine.fp32_master_is_separate``).

Rows are appended to the JSON file as each (case, stage, precision, world size) finishes, and a run skips the rows
the file already holds, so a long measurement can be stopped and resumed. Writes a Markdown table beside the JSON
(``.md``). Run ``python -m growlm.eval.bench.growth_scaling --help``; ``--small`` grows 0.1-0.5M-parameter models
(a quick check of the rows, not the measurement).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from growlm.growth.live.grow import collect_old_engine, grow_engine
from growlm.growth.ops import make_rules
from growlm.growth.ops.apply import OptimizerPolicy
from growlm.growth.ops.schedule_rule import ScheduleRule
from growlm.model.config import GPTConfig, largest_param_numel, param_count
from growlm.runtime import collectives
from growlm.runtime.commands import HelpFormatter, add_version
from growlm.runtime.dist import init_distributed
from growlm.runtime.ds_config import shipped_ds_config
from growlm.runtime.engine import build_engine, fp32_master_is_separate
from growlm.runtime.launch import launch_ranks
from growlm.runtime.memory import growth_working_set_bytes, model_state_bytes
from growlm.runtime.process_memory import peak_rss_bytes, release_heap, reset_peak_rss, rss_bytes

START = dict(n_layer=14, n_embd=512, n_head=8, vocab_size=16384)
SCENARIOS = {
    "depth x2": (START, {**START, "n_layer": 28}),
    "width x2": (START, {**START, "n_embd": 1024, "n_head": 16}),
}
SMALL_START = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=512)
SMALL = {
    "depth x2": (SMALL_START, {**SMALL_START, "n_layer": 4}),
    "width x2": (SMALL_START, {**SMALL_START, "n_embd": 128, "n_head": 8}),
}
KEY = ("case", "zero_stage", "precision", "world_size")


def _loss(engine, vocab: int, seq_len: int, device: torch.device, step: bool) -> float:
    """The loss on random tokens (the same on every rank), with a training step when ``step``."""
    x = torch.randint(0, vocab, (1, seq_len + 1), device=device, generator=torch.Generator(device).manual_seed(1))
    if not step:
        with torch.no_grad():
            return float(engine(x[:, :-1], x[:, 1:]).item())
    loss = engine(x[:, :-1], x[:, 1:])
    engine.backward(loss)
    engine.step()
    return float(loss.item())


def worker(case: str, stage: int, precision: str, out: str, seq_len: int, small: bool) -> None:
    """One rank: base RSS, build + one step, live growth, one loss of the grown engine; rank 0 writes every rank's
    record to ``out``."""
    info = init_distributed(1800)
    world = collectives.world_size()
    gc.collect()
    rec: dict = {"rank": info.rank, "threads": torch.get_num_threads(), "rss_base_bytes": rss_bytes()}
    ds_cfg = json.loads(shipped_ds_config(stage, precision, info.device.type).read_text())  # GPU variant on CUDA
    ds_cfg["train_micro_batch_size_per_gpu"] = 1
    ds_cfg["gradient_accumulation_steps"] = 1
    ds_cfg["scheduler"]["params"]["total_num_steps"] = 100
    old_shape, new_shape = (SMALL if small else SCENARIOS)[case]
    old_cfg, new_cfg = GPTConfig(n_positions=seq_len, **old_shape), GPTConfig(n_positions=seq_len, **new_shape)
    n_old, n_new = param_count(old_cfg), param_count(new_cfg)
    rec.update(params_from=n_old, params_to=n_new, shape_from=old_cfg.shape_str(), shape_to=new_cfg.shape_str())
    rec["predicted_old_bytes"] = model_state_bytes(n_old, stage, precision, world)
    rec["predicted_new_bytes"] = model_state_bytes(n_new, stage, precision, world)
    rec["predicted_work_bytes"] = growth_working_set_bytes(largest_param_numel(old_cfg), largest_param_numel(new_cfg))
    torch.manual_seed(0)
    engine = build_engine(old_cfg, None, ds_cfg)
    _loss(engine, old_cfg.vocab_size, seq_len, info.device, step=True)
    rec["loss_before"] = _loss(engine, old_cfg.vocab_size, seq_len, info.device, step=False)  # what growth keeps
    gc.collect()
    release_heap()
    rec["rss_before_bytes"], rec["peak_before_bytes"] = rss_bytes(), peak_rss_bytes()
    rec["peak_reset"] = reset_peak_rss()
    plan = make_rules(old_cfg, new_cfg, "duplicate")
    build = functools.partial(build_engine, ds_config=ds_cfg, partitioned=stage == 3)
    collectives.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    result = grow_engine(engine, plan, build, policy=OptimizerPolicy(), schedule_rule=ScheduleRule())
    new = result.engine
    del engine
    rec["fp32_master_separate"] = fp32_master_is_separate(new)  # runtime.memory's fp32 formula assumes it
    result = collect_old_engine(result)
    rec["growth_s"], rec["growth_cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
    rec["peak_rss_bytes"], rec["rss_after_bytes"] = peak_rss_bytes(), rss_bytes()
    rec["phase_s"], rec["collectives"] = result.phase_seconds, result.collectives
    rec["bytes_moved"] = result.bytes_moved
    rec["cuda_memory"] = result.cuda_memory
    rec["loss_after"] = _loss(new, new_cfg.vocab_size, seq_len, info.device, step=False)
    recs = collectives.all_gather_object(rec)
    if info.rank == 0:
        Path(out).write_text(json.dumps(recs))
    collectives.barrier()


def run_row(case: str, stage: int, precision: str, world: int, seq_len: int, small: bool) -> list[dict]:
    """Launch ``world`` ranks of the worker on loopback for one row; every rank's record, with the row's key."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rec.json"
        cmd = [sys.executable, "-m", "growlm.eval.bench.growth_scaling", "--worker", case, "--stage", str(stage),
               "--precision", precision, "--out", str(out), "--seq_len", str(seq_len)]  # fmt: skip
        cmd += ["--small"] if small else []
        res = launch_ranks(cmd, world, envs=[{"THP_MEM_ALLOC_ENABLE": "1"}] * world, timeout_s=3600)
        if res.returncode or res.timed_out:
            raise SystemExit(f"benchmark ranks failed for {case!r} at {world} ranks: exit codes {res.returncodes}\n"
                             f"{res.output[-3000:]}")  # fmt: skip
        recs = json.loads(out.read_text())
    key = dict(zip(KEY, (case, stage, precision, world), strict=True))
    return [{**key, **r} for r in recs]


def summarise(rows: list[dict]) -> list[dict]:
    """One line per (case, stage, precision, world size): the slowest rank's seconds, the largest rank's bytes
    (MiB), and the formula's per-rank model states (MiB) beside the measured growth above the base."""
    mib = 2**20
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in KEY), []).append(r)
    out = []
    for key, ranks in groups.items():
        peak = max(r["peak_rss_bytes"] for r in ranks)
        base = max(r["rss_base_bytes"] for r in ranks)
        r0 = ranks[0]
        out.append({
            **dict(zip(KEY, key, strict=True)),
            "params": f"{r0['params_from'] / 1e6:.1f}M -> {r0['params_to'] / 1e6:.1f}M",
            "threads": r0["threads"],
            "growth_s": max(r["growth_s"] for r in ranks),
            "growth_cpu_s": max(r["growth_cpu_s"] for r in ranks),
            "expand_s": max(r["phase_s"]["expand"] for r in ranks),
            "base_mib": base / mib,
            "before_mib": max(r["rss_before_bytes"] for r in ranks) / mib,
            "peak_mib": peak / mib,
            "peak_over_base_mib": max(r["peak_rss_bytes"] - r["rss_base_bytes"] for r in ranks) / mib,
            "predicted_peak_mib": (r0["predicted_old_bytes"] + r0["predicted_new_bytes"] + r0["predicted_work_bytes"])
            / mib,
            "after_over_base_mib": max(r["rss_after_bytes"] - r["rss_base_bytes"] for r in ranks) / mib,
            "predicted_new_mib": r0["predicted_new_bytes"] / mib,
        })  # fmt: skip
    return out


COLUMNS = [
    ("case", "case", "{}"),
    ("zero_stage", "ZeRO", "{}"),
    ("precision", "precision", "{}"),
    ("world_size", "ranks", "{}"),
    ("params", "params", "{}"),
    ("threads", "threads/rank", "{}"),
    ("growth_s", "growth s (slowest rank)", "{:.2f}"),
    ("growth_cpu_s", "growth CPU s (max rank)", "{:.2f}"),
    ("expand_s", "expand s", "{:.2f}"),
    ("base_mib", "base RSS MiB", "{:.0f}"),
    ("peak_over_base_mib", "growth peak - base MiB (max rank)", "{:.0f}"),
    ("predicted_peak_mib", "ZeRO formula old + new + working set MiB", "{:.0f}"),
    ("after_over_base_mib", "after growth - base MiB", "{:.0f}"),
    ("predicted_new_mib", "ZeRO formula new MiB", "{:.0f}"),
]


def markdown(rows: list[dict]) -> str:
    """The summary as a Markdown table."""
    lines = ["| " + " | ".join(h for _, h, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for s in summarise(rows):
        lines.append("| " + " | ".join(f.format(s[k]) for k, _, f in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m growlm.eval.bench.growth_scaling", description=__doc__.split("\n\n")[0])
    p.formatter_class = HelpFormatter  # every flag's default in --help
    add_version(p)
    p.add_argument("--out", default=str(Path("runs") / "bench" / "growth_scaling.json"),
                   help="JSON file of per-rank records (appended to; rows it holds are skipped); the table goes to "
                   "the same name with .md")  # fmt: skip
    p.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 4, 8], help="world sizes to run")
    p.add_argument("--cases", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS), help="growths to run")
    p.add_argument("--stages", nargs="+", type=int, default=[2, 3], choices=[1, 2, 3], help="ZeRO stages")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"], help="training precision")
    p.add_argument("--seq_len", type=int, default=64, help="tokens per sequence of the training steps")
    p.add_argument("--small", action="store_true", help="0.1-0.5M-parameter models: a quick check of the rows")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--stage", type=int, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        worker(args.worker, args.stage, args.precision, args.out, args.seq_len, args.small)
        return 0
    out = Path(args.out)
    rows: list[dict] = json.loads(out.read_text()) if out.exists() else []
    done = {tuple(r[k] for k in KEY) for r in rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    for case in args.cases:
        for stage in args.stages:
            for world in args.ranks:
                if (case, stage, args.precision, world) in done:
                    print(f"skip (recorded): {case} ZeRO-{stage} {args.precision} {world} ranks", flush=True)
                    continue
                rows += run_row(case, stage, args.precision, world, args.seq_len, args.small)
                tmp = out.with_suffix(".tmp")
                tmp.write_text(json.dumps(rows, indent=1))
                tmp.replace(out)
                s = summarise(rows)[-1]
                print(f"done: {case} ZeRO-{stage} {args.precision} {world} ranks: growth {s['growth_s']:.2f} s, "
                      f"peak - base {s['peak_over_base_mib']:.0f} MiB per rank", flush=True)  # fmt: skip
    table = markdown(rows)
    out.with_suffix(".md").write_text(table)
    print(table, end="")
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
