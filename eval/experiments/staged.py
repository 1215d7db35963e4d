"""growlm-experiment --protocol equal_steps: the older experiment (the default protocol, equal compute with paired
seeds, is eval/experiments/equal_compute.py). It trains a target model from scratch and staged runs that start
smaller and grow, on the built-in corpus, with the same data order, all for the same number of steps, then writes
the report (markdown + JSON + PNG) of compute to the scratch loss.

    growlm-experiment --protocol equal_steps --out runs/staged_experiment --report eval/results/staged   # ~40 min
    growlm-experiment --protocol equal_steps --report_only --out runs/staged_experiment --report eval/results/staged

Setup (CPU scale; every number in the report is for this setup only):
* a ByteLevel BPE with 4,096 tokens trained on the corpus's training split (``data.small_vocab``), not GPT-2's;
* target 4 x 128 (4 heads of 32, FFN 512, context 128); staged runs start at half width (4 x 64, 2 heads) or half
  depth (2 x 128) and grow once, at ``--grow_frac`` of the run, with the duplication family (staged training:
  width x2 with the LEMON-style split, depth x2 interleaved as identity blocks; LR placed on the target schedule at
  S / constant_op, re-warmed) or the masked family (MSG: new units masked, ramped in over ``--ramp_steps``);
* every run: one process, ZeRO-2 fp32, the same seed, batch, sequence length and step count, so every run reads
  the same batches in the same order (the sampler is a pure function of seed and consumed samples); validation on
  the same ``--eval_tokens`` held-out tokens every ``--eval_interval`` steps; TensorBoard logs in OUT/<run>/tb.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from growlm import DS_CONFIG_DIR, TRAIN_SCRIPT
from growlm.data.small_vocab import prepare_small_vocab
from growlm.data.tokens import cache_dir
from growlm.eval.experiments import staged_report as rep
from growlm.runtime.commands import HelpFormatter
from growlm.runtime.launch import free_port
from growlm.runtime.metrics_file import finished_at

TARGET = {"n_layer": 4, "n_embd": 128, "n_head": 4}
HALF_WIDTH = {"n_layer": 4, "n_embd": 64, "n_head": 2}
HALF_DEPTH = {"n_layer": 2, "n_embd": 128, "n_head": 4}


@dataclass(frozen=True)
class RunSpec:
    """One run of the experiment: its start shape and, for a staged run, the family and dimension it grows."""

    name: str
    start: dict
    family: str | None  # None: the scratch run
    dimension: str | None  # "width" | "depth"


RUNS = (
    RunSpec("scratch", TARGET, None, None),
    RunSpec("dup-width", HALF_WIDTH, "duplicate", "width"),
    RunSpec("msg-depth", HALF_DEPTH, "masked", "depth"),
    RunSpec("dup-depth", HALF_DEPTH, "duplicate", "depth"),
    RunSpec("msg-width", HALF_WIDTH, "masked", "width"),
)


def plan_doc(spec: RunSpec, *, vocab_size: int, n_positions: int, grow_step: int, ramp_steps: int, rewarm: int) -> dict:
    """The growth plan YAML document of a run. The scratch run is a plan whose only stage never fires (train.py
    takes its shape, vocab_size included, from the plan's start; it has no --vocab_size flag)."""
    start = {**spec.start, "n_positions": n_positions, "vocab_size": vocab_size}
    if spec.family is None:
        stage = {"name": "never", "target": {"n_layer": spec.start["n_layer"] + 1}, "family": "masked",
                 "when": {"step": 10**9}}  # fmt: skip
        return {"seed": 0, "start": start, "stages": [stage]}
    target = {k: v for k, v in TARGET.items() if spec.start[k] != v}
    stage: dict = {"name": f"{spec.dimension}-x2", "target": target, "family": spec.family, "when": {"step": grow_step}}
    if spec.family == "duplicate":
        stage["options"] = {"pattern": "split", "alpha": 0.75} if spec.dimension == "width" else {
            "layer_order": "interleave", "exact": True}  # fmt: skip
        stage["optimizer"] = {"moments": "carry"}
        stage["schedule"] = {"kind": "target", "constant_op": "auto", "rewarm_steps": rewarm}
    else:
        stage["options"] = {"layer_order": "stack", "new_layers": "copy"} if spec.dimension == "depth" else {}
        stage["ramp_steps"] = ramp_steps
        stage["optimizer"] = {"moments": "carry", "fresh_exp_avg_sq": "mean"}
        stage["schedule"] = {"kind": "continue"}
    return {"seed": 0, "start": start, "stages": [stage]}


def ds_config(batch: int, lr: float, warmup: int) -> dict:
    """The experiment's DeepSpeed config (ZeRO-2 fp32) with micro batch, peak LR and warmup steps set."""
    cfg = json.loads((DS_CONFIG_DIR / "zero2_fp32.json").read_text())
    cfg["train_micro_batch_size_per_gpu"] = batch
    cfg["optimizer"]["params"]["lr"] = lr
    cfg["scheduler"]["params"]["warmup_num_steps"] = warmup
    return cfg


def run_done(out: Path, max_steps: int) -> bool:
    """True when out/metrics.jsonl holds the run's final validation (a finished run is not repeated)."""
    return finished_at(out, max_steps)


def train_cmd(args: argparse.Namespace, plan: Path, ds: Path, out: Path) -> list[str]:
    """The train.py command of one run (same data, seed and evaluation for every run)."""
    return [
        sys.executable, str(TRAIN_SCRIPT), "--growth_plan", str(plan), "--data", str(args.data),
        "--seq_len", str(args.seq_len), "--ds_config", str(ds), "--max_steps", str(args.max_steps),
        "--eval_interval", str(args.eval_interval), "--eval_tokens", str(args.eval_tokens),
        "--final_eval_tokens", str(args.eval_tokens), "--seed", str(args.seed), "--log_interval", "10",
        "--no_final_save", "--out_dir", str(out),
    ]  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The growlm-experiment --protocol equal_steps argument parser (this module's experiment)."""
    p = argparse.ArgumentParser(
        prog="growlm-experiment",
        description=__doc__.split("\n\n")[0],
        formatter_class=HelpFormatter,
    )
    p.add_argument("--out", type=Path, default=Path("runs") / "staged_experiment", help="run folders")
    p.add_argument("--report", type=Path, default=Path("runs") / "staged_experiment" / "report", help="report folder")
    p.add_argument("--data", type=Path, default=cache_dir() / "bpe4096", help="token folder (built if missing)")
    p.add_argument("--vocab_size", type=int, default=4096, help="BPE size when the token folder is built")
    p.add_argument("--runs", default=",".join(r.name for r in RUNS), help="comma-separated subset of the runs")
    p.add_argument("--max_steps", type=int, default=240, help="optimizer steps of every run")
    p.add_argument("--grow_frac", type=float, default=1 / 3, help="staged runs grow after this fraction of steps")
    p.add_argument("--batch", type=int, default=16, help="sequences per step (one process)")
    p.add_argument("--seq_len", type=int, default=128, help="tokens per sequence")
    p.add_argument("--lr", type=float, default=2e-3, help="peak LR (AdamW)")
    p.add_argument("--warmup_steps", dest="warmup", metavar="STEPS", type=int, default=20, help="LR warm-up steps")
    p.add_argument("--ramp_steps", type=int, default=20, help="masked family: mask ramp length")
    p.add_argument("--rewarm_steps", type=int, default=20, help="duplication family: LR re-warm length")
    p.add_argument("--eval_interval", type=int, default=20, help="steps between validations")
    p.add_argument("--eval_tokens", type=int, default=8192, help="held-out tokens per validation")
    p.add_argument("--seed", type=int, default=1234, help="seed of every run")
    p.add_argument(
        "--threads_per_rank", dest="threads", metavar="N", type=int, default=2, help="OMP threads per training process"
    )
    p.add_argument("--report_only", action="store_true", help="only (re)write the report from finished runs")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


_MIN = {"max_steps": 1, "batch": 1, "seq_len": 2, "warmup": 0, "ramp_steps": 0, "rewarm_steps": 0, "eval_interval": 1,
        "eval_tokens": 1, "threads": 1, "vocab_size": 1}  # fmt: skip


def check_flags(args: argparse.Namespace) -> str | None:
    """The refusal line for a numeric flag out of range (--max_steps 0, --batch 0, --lr 0, a --grow_frac that puts
    the growth at step 0 or at the end, ...), or None when all fit."""
    for name, low in _MIN.items():
        value = getattr(args, name)
        if value < low:
            flag = {"warmup": "warmup_steps", "threads": "threads_per_rank"}.get(name, name)
            return f"--{flag} {value}: must be >= {low}; give a value of at least {low}"
    if not args.lr > 0:
        return f"--lr {args.lr}: must be a positive number"
    grow = round(args.max_steps * args.grow_frac) if args.grow_frac == args.grow_frac else 0
    if not 1 <= grow < args.max_steps:
        return (f"--grow_frac {args.grow_frac} with --max_steps {args.max_steps} grows at step {grow}, outside "
                f"[1, {args.max_steps - 1}]; choose a fraction in (0, 1) that lands on such a step")  # fmt: skip
    return None


def setup_text(args: argparse.Namespace, meta: dict) -> str:
    """The report's setup paragraph (data, tokenizer, models, training, compute accounting)."""
    grow = round(args.max_steps * args.grow_frac)
    return f"""Setup (CPU scale, produced by `growlm-experiment`; see `eval/experiments/staged.py`):

* **Data**: the built-in corpus (Austen, World English Bible, Shakespeare); held-out validation = Persuasion, Hamlet,
  The Tempest, the first {args.eval_tokens:,} tokens of their interleaved chunks, the same set at every evaluation.
* **Tokenizer**: a ByteLevel BPE with **{meta.get("vocab_size")} tokens trained with HF `tokenizers` on the
  training split** (not GPT-2's 50,257), so the blocks, not the embedding, dominate the FLOPs. Losses are
  per token of this tokenizer and are not comparable with GPT-2-tokenized numbers.
* **Models**: target 4 x 128 (4 heads of 32, FFN 512, context {args.seq_len}); staged runs start at half width
  (4 x 64, 2 heads) or half depth (2 x 128) and grow once at step {grow} of {args.max_steps}: duplication family
  (staged training: width x2 with a LEMON-style 0.75/0.25 split, depth x2 interleaved identity blocks; LR placed on
  the target schedule at S / constant_op, {args.rewarm_steps}-step re-warm) or masked family (MSG: new units masked
  and ramped in over {args.ramp_steps} steps; LR schedule continued).
* **Training**: one process, DeepSpeed ZeRO-2 fp32, AdamW (peak LR {args.lr:g}, betas 0.9/0.95, weight decay 0.1),
  WarmupCosineLR ({args.warmup} warm-up steps, cosine to 0.1 x peak over {args.max_steps} steps), batch
  {args.batch} x {args.seq_len} tokens, seed {args.seed} for every run: **the same batches in the same order**.
  Validation every {args.eval_interval} steps.
* **Compute**: model FLOPs 6N + 12LHQT per token of the model being trained at each step (a masked model during
  its ramp is charged as the full grown model); evaluation FLOPs are not counted.
"""


def run_equal_steps(argv: list[str] | None = None) -> int:
    """growlm-experiment --protocol equal_steps (every arm stops at the same step): run the unfinished runs and write
    the report; exit status 2 on a flag out of range, a run's own status when it failed."""
    args = parse_args(argv)
    problem = check_flags(args)
    if problem:
        print(f"growlm-experiment: error: {problem}", file=sys.stderr)
        return 2
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    specs = [r for r in RUNS if r.name in names]
    if not specs or specs[0].name != "scratch":
        print("growlm-experiment: error: --runs must include 'scratch' (the reference)", file=sys.stderr)
        return 2
    if not (args.data / "meta.json").is_file():
        print(f"growlm-experiment: training a {args.vocab_size}-token BPE and tokenizing into {args.data}", flush=True)
        prepare_small_vocab(args.data, args.vocab_size)
    meta = json.loads((args.data / "meta.json").read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    grow_step = round(args.max_steps * args.grow_frac)
    ds = args.out / "ds_config.json"
    ds.write_text(json.dumps(ds_config(args.batch, args.lr, args.warmup), indent=2))
    walls: dict[str, float] = {}
    for spec in specs:
        out = args.out / spec.name
        plan = args.out / f"{spec.name}.yaml"
        doc = plan_doc(spec, vocab_size=meta["vocab_size"], n_positions=args.seq_len, grow_step=grow_step,
                       ramp_steps=args.ramp_steps, rewarm=args.rewarm_steps)  # fmt: skip
        plan.write_text(yaml.safe_dump(doc, sort_keys=False))
        if args.report_only or run_done(out, args.max_steps):
            continue
        if (out / "metrics.jsonl").exists():
            (out / "metrics.jsonl").rename(out / f"metrics.jsonl.incomplete-{int(time.time())}")
        env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS=str(args.threads), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(free_port()))  # fmt: skip
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            env.pop(k, None)
        print(f"growlm-experiment: run {spec.name} -> {out}", flush=True)
        t0 = time.perf_counter()
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "train.log", "w") as log:
            rc = subprocess.call(train_cmd(args, plan, ds, out), env=env, stdout=log, stderr=subprocess.STDOUT)
        walls[spec.name] = time.perf_counter() - t0
        (out / "wall_s.txt").write_text(f"{walls[spec.name]:.1f}\n")
        if rc:
            print(f"growlm-experiment: run {spec.name} failed (exit {rc}); see {out / 'train.log'}", file=sys.stderr)
            return rc
    return write_report(args, specs, meta)


def write_report(args: argparse.Namespace, specs: list[RunSpec], meta: dict) -> int:
    """Write report.md, results.json and the loss-vs-FLOPs plot from the finished runs; returns the exit status."""
    curves = []
    for spec in specs:
        out = args.out / spec.name
        if not run_done(out, args.max_steps):
            print(f"growlm-experiment: {spec.name} has not finished; left out of the report", file=sys.stderr)
            continue
        wall = out / "wall_s.txt"
        start = {**spec.start}
        info = {
            "start": f"{start['n_layer']} x {start['n_embd']}",
            "family": spec.family or "-",
            "wall_s": float(wall.read_text()) if wall.is_file() else None,
        }
        curves.append(rep.read_run(spec.name, out, info))
    if not curves or curves[0].name != "scratch":
        print("growlm-experiment: the scratch run has not finished; no report", file=sys.stderr)
        return 1
    summary = rep.summarize(curves[0], curves[1:])
    summary["setup"] = {k: (_rel(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    summary["tokenizer"] = meta.get("tokenizer")
    args.report.mkdir(parents=True, exist_ok=True)
    png = rep.plot(
        curves,
        summary["target_loss"],
        args.report / "val_loss_vs_flops.png",
        f"target 4x128 from scratch vs staged runs (BPE {meta.get('vocab_size')}, seq {args.seq_len}, "
        f"{args.max_steps} steps)",
    )
    dims = {s.name: s.dimension for s in specs if s.dimension}
    summary["planner"] = rep.planner_analysis(curves[0], curves[1:], dims)
    (args.report / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    notes_file = args.report / "notes.md"  # hand-written discussion, kept across report rewrites
    notes = rep.planner_markdown(summary["planner"]) + "\n\n"
    notes += notes_file.read_text() if notes_file.is_file() else ""
    (args.report / "report.md").write_text(rep.markdown(summary, setup_text(args, meta), png.name, notes))
    _tensorboard_summary(args.out / "summary_tb", curves)
    print(f"growlm-experiment: report {args.report / 'report.md'}", flush=True)
    for r in summary["runs"]:
        s = "ref" if r["run"] == "scratch" else ("never" if r["saving"] is None else f"{100 * r['saving']:+.1f}%")
        print(f"  {r['run']:10s} final {r['final_val_loss']:.4f}  FLOPs to L* {r['flops_to_target']}  saving {s}")
    return 0


def _rel(p: Path) -> str:
    """p relative to the working folder when inside it (so committed reports hold no machine paths)."""
    p = p.resolve()
    return str(p.relative_to(Path.cwd())) if p.is_relative_to(Path.cwd()) else str(p)


def _tensorboard_summary(path: Path, curves: list[rep.RunCurve]) -> None:
    """val loss against GFLOPs (the x axis as TensorBoard's step) for every run, in one TensorBoard folder."""
    from torch.utils.tensorboard import SummaryWriter  # lazy: heavy (about 1 s, tensorboard), rank 0 only

    for c in curves:
        w = SummaryWriter(str(path / c.name))
        for f, v in zip(c.flops, c.val_loss, strict=True):
            w.add_scalar("val_loss_vs_gflops", v, int(f / 1e9))
        w.close()
