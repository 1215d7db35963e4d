"""Benchmark: what each rank reads and how long it takes to save and to resume a checkpoint, at 2, 4 and 8 ranks.

Per world size, real ranks (gloo on loopback on a CPU, NCCL on GPUs) build a GPT at ZeRO-2 fp32 (default 19.2M
parameters with the GPT-2 vocabulary: a 307 MB checkpoint), train one step, then, as train.py does:

* save: ``runtime.checkpoint.save`` (DeepSpeed's files, the RNG files, each rank hashing its share, rank 0's
  manifest and rename);
* resume: ``open_for_resume`` (manifest and sizes, before the ranks would join), ``verify_shares`` (each rank
  checks the files it loads: sha256 and the weights-only unpickling), ``load`` (DeepSpeed's ``load_checkpoint``
  into the engine, and the RNG file);
* for comparison, the check a resume made before ``verify_shares``: every rank hashing every file and unpickling
  every ``*.pt`` (``verify_manifest`` + ``check_pickles``).

Bytes are each rank process's ``read_chars`` (psutil; Linux ``/proc/self/io`` rchar: bytes passed to read calls,
whether they came from the disk or the page cache) over each phase; seconds are wall time on that rank. The
checkpoint has just been written, so its pages are usually cached: the seconds are those of a warm cache. Also
recorded per rank: the bytes of the files named for it (``own``: its optimizer shard and RNG file), of the files
every rank loads (``shared``: the module states, growlm_state.json), of its share of the check (``split_files``), and
of the whole checkpoint. Prints two tables (per world size; per rank) and writes them to OUT with the suffix .md, and
a JSON list (one row per rank) to OUT. Run
``python -m growlm.eval.bench.checkpoint_io --help``; ``--small`` is a quick check on a 0.4M-parameter model.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch

from growlm import PACKAGE_DIR
from growlm.model.config import GPTConfig, param_count
from growlm.runtime import checkpoint, checkpoint_shares, collectives
from growlm.runtime.commands import HelpFormatter, add_version
from growlm.runtime.dist import init_distributed
from growlm.runtime.ds_config import shipped_ds_config
from growlm.runtime.engine import build_engine
from growlm.runtime.machine import device_description
from growlm.runtime.run_state import RunState

MODEL = dict(n_layer=8, n_embd=256, n_head=8)  # 19.2M parameters with the GPT-2 vocabulary: 307 MB at ZeRO-2 fp32
SMALL = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=4096)  # 0.37M parameters: 6 MB
SEQ_LEN = 32


def read_bytes() -> int:
    """Bytes this process has passed to read calls so far (psutil ``read_chars``, Linux rchar)."""
    return psutil.Process().io_counters().read_chars


class Phase:
    """Bytes read and seconds of the ``with`` block on this rank (after a barrier, so every rank starts together)."""

    def __init__(self, rec: dict, name: str) -> None:
        self.rec, self.name = rec, name

    def __enter__(self) -> Phase:
        collectives.barrier()
        self.b, self.t = read_bytes(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.rec[f"{self.name}_s"] = time.perf_counter() - self.t
        self.rec[f"{self.name}_read_bytes"] = read_bytes() - self.b


def worker(args: argparse.Namespace) -> None:
    """One rank: build, one step, save, resume (open, verify, load), the old check; rank 0 writes the rows."""
    info = init_distributed(600)
    ds_cfg = json.loads(shipped_ds_config(args.zero_stage, "fp32", info.device.type).read_text())
    ds_cfg["train_micro_batch_size_per_gpu"] = 1
    ds_cfg["scheduler"]["params"]["total_num_steps"] = 100
    cfg = GPTConfig(n_positions=SEQ_LEN, **(SMALL if args.small else MODEL))
    torch.manual_seed(0)
    engine = build_engine(cfg, None, ds_cfg)
    x = torch.randint(0, cfg.vocab_size, (1, SEQ_LEN + 1), device=info.device)
    engine.backward(engine(x[:, :-1], x[:, 1:]))
    engine.step()
    state = RunState(model_config=cfg, global_step=1, consumed_samples=info.world_size, seq_len=SEQ_LEN,
                     world_size=info.world_size, zero_stage=args.zero_stage, seed=0, precision="fp32",
                     ds_config=ds_cfg)  # fmt: skip
    rec: dict = {"rank": info.rank, "world_size": info.world_size, "n_params": param_count(cfg),
                 "zero_stage": args.zero_stage, "device": device_description()}  # fmt: skip
    with Phase(rec, "save"):
        final = checkpoint.save(engine, args.ckpt, state, rank=info.rank)
    sizes = checkpoint_shares.tag_files(final)
    files = (final / "growlm_manifest.json").stat().st_size
    rec["checkpoint_bytes"] = sum(sizes.values()) + files
    rec["own_bytes"] = sum(b for f, b in sizes.items() if checkpoint_shares.file_rank(f) == info.rank)
    rec["shared_bytes"] = sum(b for f, b in sizes.items() if checkpoint_shares.file_rank(f) is None)
    rec["share_bytes"] = sum(sizes[f] for f in checkpoint_shares.split_files(sizes, info.world_size)[info.rank])
    with Phase(rec, "open"):
        ckpt = checkpoint.open_for_resume(final)
    with Phase(rec, "verify"):
        rec["verified"] = checkpoint.verify_shares(ckpt, rank=info.rank, world_size=info.world_size)
    with Phase(rec, "load"):
        checkpoint.load(engine, ckpt, rank=info.rank, world_size=info.world_size)
    with Phase(rec, "old_verify"):  # the check before verify_shares, on every rank
        checkpoint.verify_manifest(final)
        checkpoint.check_pickles(final)
    rec["resume_read_bytes"] = rec["open_read_bytes"] + rec["verify_read_bytes"] + rec["load_read_bytes"]
    if args.damage is not None:  # test only: one byte of that rank's optimizer shard changed, every rank refuses
        victim = next(f for f in sizes if checkpoint_shares.file_rank(f) == args.damage and "optim" in f)
        collectives.barrier()  # every rank is done reading the whole checkpoint (old_verify) before one is damaged
        if info.rank == 0:
            with open(final / victim, "r+b") as f:
                f.seek(sizes[victim] // 2)
                byte = f.read(1)
                f.seek(sizes[victim] // 2)
                f.write(bytes([byte[0] ^ 0xFF]))
        collectives.barrier()
        try:
            checkpoint.verify_shares(checkpoint.open_for_resume(final), rank=info.rank, world_size=info.world_size)
            rec["damage_refused"] = None
        except checkpoint.CheckpointError as e:
            rec["damage_refused"] = str(e)
    rows = collectives.all_gather_object(rec)
    if info.rank == 0:
        Path(args.out).write_text(json.dumps(rows))


def run_world(world_size: int, args: argparse.Namespace) -> list[dict]:
    """Launch ``world_size`` ranks of the worker on loopback; their rows (one per rank)."""
    from growlm.runtime.launch import launch_ranks  # lazy: only the launching process needs it

    with tempfile.TemporaryDirectory(prefix="growlm-ckpt-io-", dir=args.work) as tmp:
        out = Path(tmp) / "rows.json"
        cmd = [sys.executable, "-m", "growlm.eval.bench.checkpoint_io", "--worker", "--out", str(out),
               "--ckpt", str(Path(tmp) / "ckpt"), "--zero_stage", str(args.zero_stage)]  # fmt: skip
        cmd += ["--small"] if args.small else []
        cmd += ["--damage", str(args.damage)] if args.damage is not None else []
        threads = max(1, (os.cpu_count() or 1) // world_size)
        env = {"OMP_NUM_THREADS": str(threads)}
        res = launch_ranks(cmd, world_size, envs=[env] * world_size, timeout_s=args.timeout_s)
        if res.returncode or res.timed_out:
            raise SystemExit(f"checkpoint_io: the {world_size} ranks failed (exit codes {res.returncodes})\n"
                             f"{res.output[-3000:]}")  # fmt: skip
        return json.loads(out.read_text())


def table(rows: list[dict]) -> str:
    """The rows as a markdown table: MB (10^6 bytes) read and seconds per rank and phase."""
    mb = 1e-6
    lines = ["| ranks | rank | own MB | shared MB | share MB | save s | save read MB | verify s | verify read MB "
             "| load s | load read MB | resume read MB | old check read MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['world_size']} | {r['rank']} | {r['own_bytes'] * mb:.1f} | {r['shared_bytes'] * mb:.1f} "
            f"| {r['share_bytes'] * mb:.1f} | {r['save_s']:.2f} | {r['save_read_bytes'] * mb:.1f} "
            f"| {r['verify_s']:.2f} | {r['verify_read_bytes'] * mb:.1f} | {r['load_s']:.2f} "
            f"| {r['load_read_bytes'] * mb:.1f} | {r['resume_read_bytes'] * mb:.1f} "
            f"| {r['old_verify_read_bytes'] * mb:.1f} |"
        )
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    """Per world size: the checkpoint, the most any rank read for its check and for the whole resume, what the job
    read for its checks, and the same with the check before ``verify_shares`` (every rank reading every file)."""
    mb = 1e-6
    lines = ["| ranks | checkpoint MB | check, max per rank MB | resume, max per rank MB | check, job MB "
             "| old check, per rank MB | old check, job MB | save s (slowest rank) | resume s (slowest rank) |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for n in sorted({r["world_size"] for r in rows}):
        rs = [r for r in rows if r["world_size"] == n]
        resume_s = max(r["open_s"] + r["verify_s"] + r["load_s"] for r in rs)
        lines.append(
            f"| {n} | {rs[0]['checkpoint_bytes'] * mb:.1f} | {max(r['verify_read_bytes'] for r in rs) * mb:.1f} "
            f"| {max(r['resume_read_bytes'] for r in rs) * mb:.1f} "
            f"| {sum(r['verify_read_bytes'] for r in rs) * mb:.1f} "
            f"| {max(r['old_verify_read_bytes'] for r in rs) * mb:.1f} "
            f"| {sum(r['old_verify_read_bytes'] for r in rs) * mb:.1f} | {max(r['save_s'] for r in rs):.2f} "
            f"| {resume_s:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with the hidden ``--worker``, one rank of it). Exit status 0, 2 for bad flags."""
    p = argparse.ArgumentParser(prog="python -m growlm.eval.bench.checkpoint_io", description=__doc__.split("\n\n")[0])
    p.formatter_class = HelpFormatter  # every flag's default in --help
    add_version(p)
    p.add_argument("--ranks", nargs="+", type=int, default=[2, 4, 8], help="world sizes to run, one after another")
    p.add_argument("--zero_stage", type=int, default=2, choices=[1, 2, 3], help="ZeRO stage of the engine")
    p.add_argument("--small", action="store_true", help="a 0.37M-parameter model (6 MB): a quick check")
    p.add_argument("--out", default=str(Path("runs") / "bench" / "checkpoint_io.json"), help="JSON file (a list)")
    p.add_argument("--work", default=None, help="folder for the checkpoints (default: the system's temporary one)")
    p.add_argument("--timeout_s", type=float, default=3600.0, help="limit for one world size's ranks")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ckpt", help=argparse.SUPPRESS)
    p.add_argument("--damage", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if any(n < 1 for n in args.ranks):
        p.error(f"--ranks {args.ranks}: every world size must be >= 1")
    rows: list[dict] = []
    for n in args.ranks:
        rows += run_world(n, args)
        print(f"done: {n} ranks", flush=True)
    command = ["python", "-m", "growlm.eval.bench.checkpoint_io", *(argv if argv is not None else sys.argv[1:])]
    words = [a.replace(f"{PACKAGE_DIR}/", "") for a in command]
    recorded = shlex.join("OUT" if w == args.out and Path(w).is_absolute() else w for w in words)
    for r in rows:
        r["recorded_command"] = recorded
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1) + "\n")
    report = f"{summary(rows)}\n\n{table(rows)}\n"
    out.with_suffix(".md").write_text(report)
    print(report)
    print(f"wrote {args.out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
