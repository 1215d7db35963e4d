"""growlm-run: run a multi-stage growth plan, each stage on its own resources (trainer.driver).

    growlm-run PLAN.yaml [--dry_run] [--mem_per_rank_gib G] -- TRAIN_ARGS

TRAIN_ARGS are train.py's flags (--out_dir, --ds_config, --max_steps, --seq_len, ...). The driver adds
--growth_plan, --ds_config (the given one with the segment's ZeRO stage and batch split, written into
``<out_dir>/driver/``), --resume and --stop_before_stage itself. Run the same command again after an interruption:
it continues where the run stopped. One driver per run folder (``<out_dir>/driver/lock``, fcntl.flock).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from growlm import TRAIN_SCRIPT
from growlm.growth.errors import GrowthError
from growlm.runtime import checkpoint
from growlm.runtime import processes as procs
from growlm.runtime.atomic import write_json
from growlm.runtime.checkpoint import CheckpointError
from growlm.runtime.commands import HelpFormatter, add_version
from growlm.runtime.dist import select_accelerator
from growlm.runtime.ds_config import DSConfigError, check_ds_config, choose_ds_config, load_ds_config
from growlm.runtime.launch import free_port
from growlm.runtime.lock import LockHeldError, hold_lock
from growlm.runtime.manifest import ManifestError
from growlm.trainer import cli as train
from growlm.trainer.driver.dry_run import print_dry_run
from growlm.trainer.driver.fits_here import check_jobs_fit_here
from growlm.trainer.driver.phases import PROGRESS_VERSION, Run, drive
from growlm.trainer.driver.segments import (
    DriverError,
    check_hostfile,
    deepspeed_path,
    ds_config_path,
    hostfile_for,
    job_args,
    launcher_commands,
    make_segments,
    segment_ds_config,
)
from growlm.trainer.errors import UsageError
from growlm.trainer.plan_checks import check_plan_fits_run, load_growth_plan

DRIVER_FLAGS = ("growth_plan", "resume", "stop_before_stage")


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """(driver flags, TRAIN_ARGS): everything after ``--`` goes to train.py."""
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    return build_parser().parse_args(argv[:split]), argv[split + 1 :]


def build_parser() -> argparse.ArgumentParser:
    """The growlm-run argument parser (the driver's own flags, before ``--``)."""
    p = argparse.ArgumentParser(
        prog="growlm-run",
        formatter_class=HelpFormatter,
        usage="growlm-run PLAN.yaml [--dry_run] [--mem_per_rank_gib G] [--deepspeed PATH] [--version] -- TRAIN_ARGS",
        description="Run a growth plan whose stages declare their resources (nodes, ranks, ZeRO stage, batch split): "
        "live growth inside a job while the resources stay, save -> offline grow + reshard -> relaunch where they "
        "change. Everything after '--' goes to train.py. Restart the same command to continue an interrupted run.",
    )
    p.add_argument("plan", help="YAML growth plan with optional 'resources:' per stage (trainer/driver/resources.py)")
    p.add_argument(
        "--dry_run",
        action="store_true",
        help="print each stage's shape, parameters, launcher command and model-state memory per rank; start nothing",
    )
    p.add_argument(
        "--mem_per_rank_gib",
        type=float,
        metavar="G",
        help="warn (dry run) where a stage's model states per rank exceed G GiB (2^30 bytes)",
    )
    p.add_argument("--deepspeed", default=None, help="the deepspeed launcher (default: the one beside this Python)")
    return add_version(p)


def train_namespace(train_args: list[str]) -> argparse.Namespace:
    """TRAIN_ARGS parsed by train.py's own parser.

    Raises:
        DriverError: a flag the driver sets itself, --init_from (its jobs resume with --resume, which train.py does
            not combine with it), --no_final_save, or a missing --out_dir.
    """

    ns = train.parse_args(train_args)
    given = [f"--{k}" for k in DRIVER_FLAGS if getattr(ns, k) is not None]
    if given:
        raise DriverError(f"{', '.join(given)} after '--': growlm-run sets these itself; drop them")
    if ns.init_from is not None:
        raise DriverError(
            "--init_from after '--': growlm-run restarts its jobs with --resume, which train.py does not combine "
            "with --init_from; drop it (the plan's start shape is trained from scratch)"
        )
    if ns.no_final_save:
        raise DriverError("--no_final_save: growlm-run needs the final checkpoint to know the run has finished")
    if ns.out_dir == train.parse_args([]).out_dir:  # not given (or given as the default): no run folder chosen
        raise DriverError(
            "give --out_dir (not the default) after '--': the run folder of the whole plan (checkpoints, metrics, "
            "driver/)"
        )
    return ns


def child_env() -> dict[str, str]:
    """The jobs' environment: this one (growlm importable as it is here), the accelerator chosen (DS_ACCELERATOR),
    no rank variables inherited."""
    env = dict(os.environ)
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        env.pop(k, None)
    return env


def make_launch(args: argparse.Namespace, train_args: list[str], plan_path: str, base_cfg: dict, driver_dir: Path):
    """``launch(segment, resume) -> (launcher processes, log files)`` for phases.Run."""

    def launch(seg, resume):
        cfg_path = ds_config_path(driver_dir, seg.index)
        write_json(cfg_path, segment_ds_config(base_cfg, seg.resources), overwrite=True)
        hostfile = hostfile_for(seg.resources, driver_dir, seg.index)
        cmds = launcher_commands(
            seg.resources,
            deepspeed_path(args.deepspeed),
            free_port(),
            str(TRAIN_SCRIPT),
            job_args(train_args, plan_path, cfg_path, resume, seg.stop_stage),
            hostfile,
        )
        jobs, logs = [], []
        for node, cmd in enumerate(cmds):
            log = driver_dir / f"segment{seg.index}.node{node}.log"
            print(f"growlm-run: segment {seg.index}: {shlex.join(cmd)}  (log {log})", flush=True)
            try:
                jobs.append(procs.spawn(cmd, child_env(), log))
            except OSError as e:
                for j in jobs:
                    procs.kill_group(j.pid)
                msg = f"cannot start {cmd[0]}: {e.strerror}; install DeepSpeed or pass --deepspeed PATH"
                raise DriverError(msg) from None
            logs.append(log)
        return jobs, logs

    return launch


def start_progress(path: Path, plan_sha: str, train_args: list[str], save_dir: Path) -> dict[str, Any]:
    """The progress read back (same plan and TRAIN_ARGS), or a new one.

    Raises:
        DriverError: the progress file is damaged or of another version; the run folder holds another plan's or
            command's run, or checkpoints growlm-run did not write.
    """

    if path.exists():
        try:
            prog = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DriverError(f"{path}: not valid JSON ({e}); it is written atomically, so it was changed by hand: "
                              "restore it or choose another --out_dir") from None  # fmt: skip
        if not isinstance(prog, dict) or prog.get("version") != PROGRESS_VERSION:
            version = prog.get("version") if isinstance(prog, dict) else None
            raise DriverError(
                f"{path}: progress version {version!r}, this growlm-run reads version {PROGRESS_VERSION}; "
                "continue it with the growlm version that started it, or choose another --out_dir"
            )
        if prog.get("plan_sha256") != plan_sha or prog.get("train_args") != train_args:
            raise DriverError(
                f"{path.parent.parent} holds a growlm-run of another plan or other train.py flags; run "
                "the same command to continue it, or choose another --out_dir"
            )
        return prog
    if checkpoint.existing_tags(save_dir):
        raise DriverError(f"{save_dir} holds checkpoints growlm-run did not write; choose another --out_dir")
    return {
        "version": PROGRESS_VERSION,
        "plan_sha256": plan_sha,
        "train_args": train_args,
        "segment": 0,
        "phase": "train",
        "resume": None,
        "start_step": 0,
        "record_written": False,
        "pgids": [],
        "timings": {},
    }


def hold_driver_lock(driver_dir: Path) -> Any:
    """Take ``driver_dir/lock`` (runtime.lock: exclusive, not waiting, the holder named in it) for this process's
    lifetime; returns the open file, which must stay referenced (closing it, or the process ending, releases it).

    Raises:
        DriverError: another growlm-run holds it (two drivers on one run folder would kill each other's jobs).
    """
    try:
        return hold_lock(driver_dir / "lock")
    except LockHeldError as e:
        raise DriverError(
            f"another growlm-run is driving {driver_dir.parent} ({e.holder}; lock {e.path}); wait for it to end "
            "or stop it, or choose another --out_dir"
        ) from None


def _say_config(note: str | None) -> None:
    """Print the DeepSpeed-config choice's note (a shipped config's GPU variant), if any, as growlm-run's."""
    if note:
        print(note.replace("growlm:", "growlm-run:", 1), flush=True)


def main(argv: list[str] | None = None) -> int:
    """growlm-run: 0 when the plan ran to --max_steps, 2 on bad input, a failed job's exit status otherwise."""
    accelerator = select_accelerator()  # DS_ACCELERATOR=cpu without CUDA, inherited by the jobs

    args, train_args = parse_args(argv)
    try:
        ns = train_namespace(train_args)
        # a shipped config's GPU variant on CUDA, as train.py would choose it: the jobs get the driver's copies
        ns.ds_config, note = choose_ds_config(ns.ds_config, accelerator)  # said once the checks have passed
        plan = load_growth_plan(args.plan)
        base_cfg = load_ds_config(ns.ds_config, ns.max_steps)
        segments = make_segments(plan, base_cfg)
        for seg in segments:  # every segment's hostfile and DeepSpeed config now, not when its job launches
            check_hostfile(seg.resources)
            check_ds_config(segment_ds_config(base_cfg, seg.resources), ns.ds_config, seg.resources.world_size)
        # as job 0 will (its memory on its own nodes: the dry run prints each job's)
        check_plan_fits_run(plan, 0, ns, segment_ds_config(base_cfg, segments[0].resources), this_run=False)
        out_dir = Path(ns.out_dir).resolve()  # absolute: the jobs' command lines name it (procs.kill_stale)
        if args.dry_run:
            _say_config(note)
            return print_dry_run(plan, segments, base_cfg, ns, args, train_args)
        for line in check_jobs_fit_here(plan, segments, base_cfg, ns):  # before anything is launched or written
            print(line, file=sys.stderr, flush=True)
        _say_config(note)
        run = Run(plan, segments, out_dir, ns.max_steps)
        run.driver_dir.mkdir(parents=True, exist_ok=True)
        lock = hold_driver_lock(run.driver_dir)  # noqa: F841 (held until this process ends)
        plan_sha = hashlib.sha256(Path(args.plan).read_bytes()).hexdigest()
        prog = start_progress(run.progress_path, plan_sha, train_args, run.save_dir)
        run.launch = make_launch(args, train_args, str(Path(args.plan).resolve()), base_cfg, run.driver_dir)
        return drive(run, prog)
    except (DriverError, UsageError, DSConfigError, GrowthError, CheckpointError, ManifestError) as e:
        print(f"growlm-run: error: {e}", file=sys.stderr)
        return getattr(e, "returncode", 2)
    except OSError as e:  # a folder or file the driver cannot create or read (permissions, disk full)
        print(f"growlm-run: error: {e}; check the run folder and the files the command names", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
