"""growlm-experiment (default protocol): equal-compute staged training against scratch, over several seeds, with
paired savings and 95% intervals (DESIGN.md, "When to grow"; arithmetic in eval.experiments.compute_protocol).

    growlm-experiment                                # default: 5 seeds, 62 min on an idle 2-core CPU
    growlm-experiment --quick --out runs/ec_quick --report runs/ec_quick/report     # the whole pipeline, tiny
    growlm-experiment --report_only                  # rewrite the report from finished runs
    growlm-experiment --protocol equal_steps ...     # the older equal-steps experiment (eval/experiments/staged.py)

Every arm trains for the FLOPs budget of the scratch target run (``--steps`` steps of the target): a staged arm's
step count follows from its stages' costs, and its cosine LR schedule ends at its own last step (schedule rule
'continue'). Arm runs of one seed read the same batches in the same order as that seed's scratch run. Arms (see
``ARMS``): the scratch target; a longer scratch run (1.5 x the budget, first seed) that shapes the
scratch compute-loss curve; a scratch run of the 2-layer model (first two seeds); depth growth 2 -> 4 layers
(duplication, interleaved identity blocks) at three growth steps; the same growth fired by the slope trigger with a
threshold derived from the seed's own curves (growth.stages.trigger.equal_rate_threshold); and a multi-stage arm, 1 x 64
-> 2 x 128 (width and depth at once; LEMON-style split plus zero-sum noise that breaks the copies' symmetry while
keeping the function) -> 4 x 128. Runs go in ``--parallel`` single-thread processes; finished runs
are skipped on a rerun; each run keeps its TensorBoard log in OUT/<arm>/seed<k>/tb.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from growlm import DS_CONFIG_DIR, TRAIN_SCRIPT
from growlm.data.tokens import cache_dir
from growlm.eval.experiments import compute_protocol as cp
from growlm.growth.stages.trigger import equal_rate_threshold, first_trigger_index, slope_trigger
from growlm.model.config import GPTConfig, flops_per_token
from growlm.runtime.commands import HelpFormatter
from growlm.runtime.launch import free_port
from growlm.runtime.metrics_file import read_records, val_points

SLOPE = "slope"  # a growth point fired by the slope trigger
DEPTH_OPTS = {"layer_order": "interleave", "exact": True}
WIDTH_DEPTH_OPTS = {"pattern": "split", "alpha": 0.75, "symmetry": "noise", "noise_std": 1.0,
                    "layer_order": "interleave", "exact": True}  # fmt: skip


@dataclass(frozen=True)
class Arm:
    """One arm: its stage shapes (names in the size table, the last one the target for staged arms), the growth
    points (fractions of the scratch step count T, or SLOPE), each growth's duplication options, the budget factor
    (x the scratch budget), how many seeds run it, and whether it is a paired staged arm."""

    name: str
    shapes: tuple[str, ...]
    grow: tuple = ()
    options: tuple = ()
    budget: float = 1.0
    max_seeds: int | None = None
    fine_eval: bool = False  # evaluated at the slope cadence (the slope arm and its reference)
    deps: tuple[str, ...] = ()

    @property
    def staged(self) -> bool:
        return bool(self.grow)


ARMS = (
    Arm("scratch", ("target",)),
    Arm("scratch-long", ("target",), budget=1.5, max_seeds=1),
    Arm("scratch-2x128", ("half_depth",), max_seeds=2),
    Arm("depth-g12", ("half_depth", "target"), (0.125,), (DEPTH_OPTS,)),
    Arm("depth-g25", ("half_depth", "target"), (0.25,), (DEPTH_OPTS,)),
    Arm("depth-g50", ("half_depth", "target"), (0.5,), (DEPTH_OPTS,), fine_eval=True),
    Arm("depth-slope", ("half_depth", "target"), (SLOPE,), (DEPTH_OPTS,), fine_eval=True,
        deps=("scratch", "depth-g50")),
    Arm("multi-1x64-2x128-4x128", ("quarter", "half_depth", "target"), (0.2, 0.45), (WIDTH_DEPTH_OPTS, DEPTH_OPTS)),
)  # fmt: skip

SIZES = {  # default / --quick model shapes
    "default": {"target": (4, 128, 4), "half_depth": (2, 128, 4), "quarter": (1, 64, 2)},
    "quick": {"target": (4, 32, 2), "half_depth": (2, 32, 2), "quarter": (1, 16, 1)},
}


def shape(args: argparse.Namespace, name: str, vocab_size: int) -> dict:
    """The GPTConfig fields of a named size (n_layer, n_embd, n_head, n_positions, vocab_size)."""
    n_layer, n_embd, n_head = SIZES["quick" if args.quick else "default"][name]
    return {"n_layer": n_layer, "n_embd": n_embd, "n_head": n_head, "n_positions": args.seq_len,
            "vocab_size": vocab_size}  # fmt: skip


def cost(args: argparse.Namespace, name: str, vocab_size: int) -> int:
    """FLOPs per optimizer step of a named size (model.config.flops_per_token x batch x seq_len)."""

    cfg = GPTConfig(**shape(args, name, vocab_size))
    return cp.step_flops(flops_per_token(cfg, args.seq_len), args.batch, args.seq_len)


@dataclass
class Job:
    """One (arm, seed) run: folder, step count, evaluation interval, growth steps (None: slope-triggered)."""

    arm: Arm
    seed: int
    out: Path
    max_steps: int
    eval_interval: int
    grow_steps: list = field(default_factory=list)
    slope_threshold: float | None = None

    @property
    def key(self) -> str:
        return f"{self.arm.name}/seed{self.seed}"


def budget_steps(args: argparse.Namespace, arm: Arm, vocab_size: int, grow_steps: list[int]) -> int:
    """The arm's step count under its FLOPs budget (arm.budget x the scratch target's T steps)."""
    c_target = cost(args, "target", vocab_size)
    budget = arm.budget * args.steps * c_target
    costs = [cost(args, s, vocab_size) for s in arm.shapes]
    return cp.arm_steps(costs, grow_steps, budget) if grow_steps else max(1, round(budget / costs[0]))


def plan_jobs(args: argparse.Namespace, vocab_size: int) -> list[Job]:
    """Every (arm, seed) job of the experiment, in run order (longest first, then seed by seed)."""
    names = [n.strip() for n in args.arms.split(",") if n.strip()]
    arms = [a for a in ARMS if a.name in names]
    unknown = set(names) - {a.name for a in ARMS}
    if unknown or not any(a.name == "scratch" for a in arms):
        raise SystemExit(f"growlm-experiment: error: --arms must include 'scratch'; unknown arms {sorted(unknown)} "
                         f"(known: {', '.join(a.name for a in ARMS)})")  # fmt: skip
    missing = {a.name: [d for d in a.deps if d not in names] for a in arms}
    if any(missing.values()):
        raise SystemExit(f"growlm-experiment: error: arms need their references too: {missing}; add them to --arms")
    jobs = []
    seeds = [args.seed + k for k in range(args.seeds)]
    for arm in sorted(arms, key=lambda a: -a.budget):
        for seed in seeds[: arm.max_seeds or len(seeds)]:
            grow = [round(f * args.steps) for f in arm.grow if f != SLOPE]
            slope = SLOPE in arm.grow
            steps = budget_steps(args, arm, vocab_size, grow) if not slope else 0  # slope: set when it starts
            ev = slope_interval(args) if arm.fine_eval else max(1, round(args.steps / args.evals))
            jobs.append(Job(arm, seed, args.out / arm.name / f"seed{seed}", steps, ev, grow))
    return sorted(jobs, key=lambda j: (j.arm.budget < 1.01, j.seed, j.arm.deps != ()))


def slope_interval(args: argparse.Namespace) -> int:
    """Evaluation cadence of the slope-triggered arm (and of its reference arm): the trigger's window
    (its window of evaluations) fills by T/4, so it can fire from the second growth point of the sweep on; finer
    would cost more evaluation time than training on the small model."""
    return max(1, round(args.steps / 4 / args.slope_window))


def plan_doc(args: argparse.Namespace, job: Job, vocab_size: int) -> dict:
    """The growth plan document of a job (scratch arms: a stage that never fires; train.py takes the shape from it)."""
    arm = job.arm
    start = shape(args, arm.shapes[0], vocab_size)
    if not arm.staged:
        bigger = {"n_layer": start["n_layer"] + 1}
        never = {"name": "never", "target": bigger, "family": "masked", "when": {"step": 10**9}}
        return {"seed": 0, "start": start, "stages": [never]}
    stages, prev = [], start
    for i, name in enumerate(arm.shapes[1:]):
        tgt = shape(args, name, vocab_size)
        change = {k: v for k, v in tgt.items() if prev[k] != v}
        when = {"slope": job.slope_threshold} if arm.grow[i] == SLOPE else {"step": job.grow_steps[i]}
        stages.append({"name": f"to-{name}", "target": change, "family": "duplicate", "when": when,
                       "options": dict(arm.options[i]), "optimizer": {"moments": "carry"},
                       "schedule": {"kind": "continue"}})  # fmt: skip
        prev = tgt
    return {"seed": 0, "start": start, "stages": stages}


def ds_config(args: argparse.Namespace) -> dict:
    """The experiment's DeepSpeed config: ZeRO-2 fp32, micro batch, peak LR, warm-up; total steps = --max_steps."""
    cfg = json.loads((DS_CONFIG_DIR / "zero2_fp32.json").read_text())
    cfg["train_micro_batch_size_per_gpu"] = args.batch
    cfg["optimizer"]["params"]["lr"] = args.lr
    cfg["scheduler"]["params"]["warmup_num_steps"] = args.warmup
    return cfg


def read_vals(out: Path) -> list[dict]:
    """The run's validation records with FLOPs > 0, one per step (the final evaluation kept), ordered by step."""
    return val_points(read_records(out / "metrics.jsonl"))


def fingerprint(args: argparse.Namespace, job: Job) -> dict:
    """The settings a finished run must have been made with to be reused on a rerun (else it is run again)."""
    keys = ("steps", "batch", "seq_len", "lr", "warmup", "evals", "eval_tokens", "slope_window", "quick", "device")
    data = args.data.resolve()
    data = data.relative_to(Path.cwd()) if data.is_relative_to(Path.cwd()) else data
    fp = {k: getattr(args, k) for k in keys} | {"data": str(data), "eval_interval": job.eval_interval}
    return fp | ({} if SLOPE in job.arm.grow else {"grow_steps": job.grow_steps, "max_steps": job.max_steps})


def job_done(args: argparse.Namespace, job: Job) -> bool:
    """True when the job's folder holds a finished run made with the same settings (job.json's fingerprint) and its
    final validation at its last step (a job.json without a fingerprint, from an earlier version, is trusted)."""
    meta = job.out / "job.json"
    if not meta.is_file():
        return False
    m, fp = json.loads(meta.read_text()), fingerprint(args, job)
    vals = read_vals(job.out)
    return m.get("fingerprint", fp) == fp and bool(vals) and vals[-1]["step"] == m["max_steps"]


def prepare_slope_job(args: argparse.Namespace, job: Job, done: dict[str, Job], vocab_size: int) -> None:
    """Derive the slope arm's threshold from the seed's own curves (the g50 arm's small-model evaluations and the
    scratch target's), and size its budget for the predicted growth step
    (growth.stages.trigger.equal_rate_threshold)."""
    ref = done[f"{job.arm.deps[1]}/seed{job.seed}"]
    small = [r for r in read_vals(ref.out) if r["step"] <= ref.grow_steps[0]]
    target = read_vals(done[f"{job.arm.deps[0]}/seed{job.seed}"].out)
    thr, i = equal_rate_threshold([r["flops"] for r in small], [r["val_loss"] for r in small],
                                  [r["flops"] for r in target], [r["val_loss"] for r in target],
                                  window=args.slope_window)  # fmt: skip
    job.slope_threshold = math.floor(thr * 1e4) / 1e4  # rounded down: the live trigger fires at or before i
    fire = first_trigger_index([r["flops"] for r in small], [r["val_loss"] for r in small], job.slope_threshold,
                               window=args.slope_window)  # fmt: skip
    job.grow_steps = [small[i if fire is None else fire]["step"]]  # predicted; the growth record holds the actual
    job.max_steps = budget_steps(args, job.arm, vocab_size, job.grow_steps)


def start_job(args: argparse.Namespace, job: Job, vocab_size: int) -> subprocess.Popen:
    """Write the job's plan and job.json and start its train.py process (one rank, --threads threads)."""
    job.out.mkdir(parents=True, exist_ok=True)
    if (job.out / "metrics.jsonl").exists():  # an interrupted run: start it again, keeping the old log aside
        (job.out / "metrics.jsonl").rename(job.out / f"metrics.jsonl.incomplete-{int(time.time())}")
    plan = job.out / "plan.yaml"
    plan.write_text(yaml.safe_dump(plan_doc(args, job, vocab_size), sort_keys=False))
    meta = {"arm": job.arm.name, "seed": job.seed, "max_steps": job.max_steps, "eval_interval": job.eval_interval,
            "grow_steps": job.grow_steps, "slope_threshold": job.slope_threshold,
            "fingerprint": fingerprint(args, job)}  # fmt: skip
    (job.out / "job.json").write_text(json.dumps(meta, indent=2) + "\n")
    cmd = [sys.executable, str(TRAIN_SCRIPT), "--growth_plan", str(plan), "--data", str(args.data),
           "--seq_len", str(args.seq_len), "--ds_config", str(args.out / "ds_config.json"),
           "--max_steps", str(job.max_steps), "--eval_interval", str(job.eval_interval),
           "--eval_tokens", str(args.eval_tokens), "--final_eval_tokens", str(args.eval_tokens),
           "--seed", str(job.seed), "--log_interval", str(max(1, job.max_steps // 20)), "--no_final_save",
           "--out_dir", str(job.out)]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               DS_ACCELERATOR=args.device)  # fmt: skip
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(k, None)
    if args.device == "cuda":
        env.setdefault("CUDA_VISIBLE_DEVICES", "0")
    log = open(job.out / "train.log", "w")  # noqa: SIM115 (closed when the process ends)
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    proc.log = log  # type: ignore[attr-defined]
    proc.t0 = time.perf_counter()  # type: ignore[attr-defined]
    return proc


def run_all(args: argparse.Namespace, jobs: list[Job], vocab_size: int) -> list[str]:
    """Run the unfinished jobs, ``--parallel`` at a time, respecting dependencies; print a progress line after each
    start and finish. Returns the keys of failed jobs (their dependents are skipped)."""
    done = {j.key: j for j in jobs if job_done(args, j)}
    for j in done.values():
        j.max_steps = json.loads((j.out / "job.json").read_text())["max_steps"]
    pending = [j for j in jobs if j.key not in done]
    running: dict[str, tuple[Job, subprocess.Popen]] = {}
    failed: list[str] = []
    t_start, walls = time.perf_counter(), []
    print(f"growlm-experiment: {len(jobs)} runs, {len(done)} already finished, {len(pending)} to run, "
          f"{args.parallel} at a time", flush=True)  # fmt: skip
    while pending or running:
        for job in list(pending):
            if len(running) >= args.parallel:
                break
            deps = [f"{d}/seed{job.seed}" for d in job.arm.deps]
            if any(d in failed for d in deps):
                pending.remove(job)
                failed.append(job.key)
                continue
            if not all(d in done for d in deps):
                continue
            if SLOPE in job.arm.grow:
                prepare_slope_job(args, job, done, vocab_size)
            running[job.key] = (job, start_job(args, job, vocab_size))
            pending.remove(job)
        time.sleep(0.5)
        for key, (job, proc) in list(running.items()):
            if proc.poll() is None:
                continue
            proc.log.close()
            del running[key]
            walls.append(time.perf_counter() - proc.t0)
            (job.out / "wall_s.txt").write_text(f"{walls[-1]:.1f}\n")
            if proc.returncode == 0 and job_done(args, job):
                done[key] = job
            else:
                failed.append(key)
                print(f"growlm-experiment: {key} failed (exit {proc.returncode}); see {job.out / 'train.log'}",
                      file=sys.stderr, flush=True)  # fmt: skip
            _progress(len(done), len(jobs), len(failed), t_start, walls, len(pending) + len(running), args.parallel,
                      [k for k in running])  # fmt: skip
    return failed


def _progress(n_done: int, n_all: int, n_failed: int, t0: float, walls: list[float], left: int, par: int,
              running: list[str]) -> None:  # fmt: skip
    """One progress line: runs finished, elapsed, a rough ETA (mean wall of the runs finished here), running."""
    el = time.perf_counter() - t0
    eta = (sum(walls) / len(walls)) * left / par if walls else math.nan
    print(f"growlm-experiment: [{n_done}/{n_all} done, {n_failed} failed] {el / 60:.1f} min elapsed, "
          f"~{eta / 60:.1f} min left; running {', '.join(running) or '-'}", flush=True)  # fmt: skip


PROFILES = {  # --quick / --device cuda change the defaults; explicit flags win
    "default": {"steps": 480, "batch": 16, "seq_len": 128, "seeds": 5, "evals": 20, "lr": 2e-3, "warmup": 24,
                "eval_tokens": 8192, "parallel": 2, "threads": 1},
    "quick": {"steps": 32, "batch": 4, "seq_len": 32, "seeds": 2, "evals": 8, "lr": 3e-3, "warmup": 4,
              "eval_tokens": 1024, "parallel": 2, "threads": 1},
    "gpu": {"steps": 1500, "batch": 16, "seq_len": 128, "seeds": 10, "evals": 30, "lr": 2e-3, "warmup": 60,
            "eval_tokens": 8192, "parallel": 16, "threads": 1},
}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The growlm-experiment (--protocol equal_compute, the default) argument parser."""
    p = argparse.ArgumentParser(
        prog="growlm-experiment",
        description=__doc__.split("\n\n")[0],
        formatter_class=HelpFormatter,
    )
    p.add_argument("--out", type=Path, default=Path("runs") / "equal_compute", help="run folders")
    p.add_argument("--report", type=Path, default=Path("runs") / "equal_compute" / "report", help="report folder")
    p.add_argument("--data", type=Path, default=cache_dir() / "bpe4096", help="token folder (built if missing)")
    p.add_argument("--vocab_size", type=int, default=4096, help="BPE size when the token folder is built")
    p.add_argument("--arms", default=",".join(a.name for a in ARMS), help="comma-separated subset of the arms")
    p.add_argument("--quick", action="store_true", help="tiny models and runs: the whole pipeline in a few minutes")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: the GPU profile (many seeds)")
    p.add_argument("--steps", type=int, help="T: optimizer steps of the scratch target run (sets the FLOPs budget)")
    p.add_argument("--seeds", type=int, help="number of seeds (seed, seed + 1, ...)")
    p.add_argument("--seed", type=int, default=1000, help="first seed")
    p.add_argument("--batch", type=int, help="sequences per step (one process)")
    p.add_argument("--seq_len", type=int, help="tokens per sequence")
    p.add_argument("--lr", type=float, help="peak LR (AdamW)")
    p.add_argument("--warmup_steps", dest="warmup", metavar="STEPS", type=int, help="LR warm-up steps")
    p.add_argument("--evals", type=int, help="validations per scratch-length run (interval = steps / evals)")
    p.add_argument("--eval_tokens", type=int, help="held-out tokens per validation (the same set every time)")
    p.add_argument("--parallel", type=int, help="training processes at once")
    p.add_argument("--threads_per_rank", dest="threads", metavar="N", type=int, help="OMP threads per training process")
    p.add_argument("--report_only", action="store_true", help="only (re)write the report from finished runs")
    p.add_argument("--dry_run", action="store_true", help="print the runs (arm, seed, steps, growth) and exit")
    for action in p._actions:  # the profile's values are the defaults: say them
        if action.dest in PROFILES["default"]:
            values = ", ".join(f"{name} {PROFILES[key][action.dest]:g}" for name, key in
                               (("default", "default"), ("--quick", "quick"), ("--device cuda", "gpu")))  # fmt: skip
            action.help = f"{action.help} (default: {values})"
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line flags; unset ones come from the profile (default, --quick, or --device cuda)."""
    args = build_parser().parse_args(argv)
    args.slope_window = _live_trigger_window()
    prof = PROFILES["quick" if args.quick else ("gpu" if args.device == "cuda" else "default")]
    for k, v in prof.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


def _live_trigger_window() -> int:
    """The window (evaluations) the live slope trigger uses: growth.stages.trigger.slope_trigger's default, which
    trainer/growth_events.py calls it with; the derived threshold must be computed with the same window."""

    return int(inspect.signature(slope_trigger).parameters["window"].default)


# flag -> smallest value (after the profile's defaults are filled in)
_MIN = {"seeds": 1, "batch": 1, "seq_len": 2, "warmup": 0, "evals": 1, "eval_tokens": 1, "parallel": 1, "threads": 1,
        "vocab_size": 1}  # fmt: skip


def min_steps(arm_names: list[str]) -> int:
    """The smallest --steps at which every growth of the named arms lands after step 0 and after the one before it
    (growth step = round(fraction x steps))."""
    fracs = [[f for f in a.grow if f != SLOPE] for a in ARMS if a.name in arm_names]
    for steps in range(1, 10_000):
        grows = ([round(f * steps) for f in fr] for fr in fracs)
        if all(all(b > a for a, b in zip([0, *g], g, strict=False)) for g in grows):
            return steps
    return 10_000


def check_flags(args: argparse.Namespace) -> str | None:
    """The refusal line for a numeric flag out of range (--steps 0, --batch 0, --lr 0, ...), or None when all fit."""
    for name, low in _MIN.items():
        value = getattr(args, name)
        if value < low:
            flag = {"warmup": "warmup_steps", "threads": "threads_per_rank"}.get(name, name)
            return f"--{flag} {value}: must be >= {low}; give a value of at least {low}"
    if not args.lr > 0:
        return f"--lr {args.lr}: must be a positive number"
    names = [n.strip() for n in args.arms.split(",") if n.strip()]
    need = min_steps(names)
    if args.steps < need:
        return (
            f"--steps {args.steps}: must be >= {need}, so that every growth of the chosen arms falls after step 0 and "
            f"after the growth before it (at round(fraction x steps)); give --steps {need} or more"
        )
    return None
