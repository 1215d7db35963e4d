"""The driver's phases and its crash-safe progress (DESIGN.md, "Multi-stage driver").

Per segment (trainer.driver.segments): **train** (launch the job; it trains, grows live, and at the next segment's
first stage saves a checkpoint and exits 0: ``train.py --stop_before_stage``), **grow** (growth.offline.pipeline grows
and
reshards that checkpoint into ``<out_dir>/driver/grown/stage<i>``, i the stage's index in the plan, built in a
temporary folder and renamed when complete), **relaunch** (the next segment's job resumes from the grown
checkpoint). The progress file ``<out_dir>/driver/progress.json`` (segment, phase, the checkpoint to resume, the
children's process groups, the timings) is rewritten atomically (runtime.atomic) at every phase change. A driver
started again with the same command continues from what is on disk: the newest complete checkpoint of the segment,
a grown folder only if it was committed; records of metrics.jsonl from steps after the checkpoint it resumes from
are dropped first, so the loss curve has each step once.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from growlm.growth.offline.pipeline import grow_checkpoint, open_source
from growlm.growth.stages.plan import StageList
from growlm.model.config import param_count
from growlm.runtime import checkpoint
from growlm.runtime import processes as procs
from growlm.runtime.atomic import write_json
from growlm.runtime.crash_points import hold_point
from growlm.runtime.metrics_file import append_record, purge_after, read_records
from growlm.runtime.run_state import RunState, RunStateError
from growlm.trainer.driver.segments import DriverError, Segment, grown_path

PROGRESS_VERSION = 1
RECORD_KEYS = ("save_s", "grow_s", "relaunch_s", "seconds")


@dataclass
class Run:
    """What the phases need: the plan, its segments, the run folder, and how to start a segment's job
    (``launch(segment, resume)`` returns the started launcher processes)."""

    plan: StageList
    segments: list[Segment]
    out_dir: Path
    max_steps: int
    launch: Any = None

    @property
    def driver_dir(self) -> Path:
        """``<out_dir>/driver``: progress, lock, per-segment DeepSpeed configs and hostfiles, logs, grown folders."""
        return self.out_dir / "driver"

    @property
    def save_dir(self) -> Path:
        """``<out_dir>/checkpoints``: the one checkpoints folder of every segment's job."""
        return self.out_dir / "checkpoints"

    @property
    def progress_path(self) -> Path:
        """``<out_dir>/driver/progress.json``: the driver's crash-safe progress (module docstring)."""
        return self.driver_dir / "progress.json"


def save_progress(run: Run, prog: dict[str, Any]) -> None:
    """Write the progress file atomically (a reader sees the old or the new one, never a half-written one)."""
    write_json(run.progress_path, prog, overwrite=True)


def trim_metrics(out_dir: Path, step: int, keep_driver_stage: str | None = None, stop_stage: str | None = None) -> int:
    """Drop the records a resume from the checkpoint at ``step`` writes again (runtime.metrics_file.purge_after, the
    rule train.py applies when it resumes), keeping the offline growth record at ``step`` of ``keep_driver_stage``
    (the growth that made the checkpoint); returns the number of records dropped."""
    return purge_after(out_dir, step, stop_stage, grown_stage=keep_driver_stage)


def newest_checkpoint(save_dir: Path) -> tuple[Path, RunState] | None:
    """The complete checkpoint of the highest global step in ``save_dir`` (``latest`` may lag behind a tag that was
    renamed into place just before a kill), with its RunState; None when there is none."""
    tags = checkpoint.existing_tags(save_dir)
    best = None
    for tag in tags:
        path = save_dir / tag / checkpoint.STATE_FILE
        try:
            state = RunState.from_json(path.read_text())
        except (OSError, RunStateError) as e:
            raise DriverError(f"{path}: {e}; a committed checkpoint was changed by hand: remove that tag") from None
        if best is None or state.global_step > best[1].global_step:
            best = (save_dir / tag, state)
    return best


def stopped_at(out_dir: Path, seg: Segment, step: int) -> dict[str, Any] | None:
    """The job's "stop" record at ``step`` for the segment's stop stage, if it wrote one."""
    for r in read_records(out_dir):
        if r.get("event") == "stop" and r.get("step") == step and r.get("stage") == seg.stop_stage:
            return r
    return None


def outcome(run: Run, seg: Segment, start_step: int) -> tuple[str, RunState | None]:
    """Where segment ``seg`` stands on disk: ("done", state) at --max_steps, ("stopped", state) at its stop stage,
    else ("run", state or None): its job must (still) run."""
    found = newest_checkpoint(run.save_dir)
    if found is None or found[1].global_step < start_step:
        return "run", None
    state = found[1]
    if state.global_step >= run.max_steps:
        return "done", state
    if seg.stop_stage is not None and stopped_at(run.out_dir, seg, state.global_step) is not None:
        return "stopped", state
    return "run", state


def resume_point(run: Run, prog: dict[str, Any]) -> tuple[str | None, int]:
    """The checkpoint the segment's job resumes from and its step: the newest complete one written since the segment
    started, else the segment's start (the grown folder, or nothing for segment 0)."""
    found = newest_checkpoint(run.save_dir)
    if found is not None and found[1].global_step > prog["start_step"]:
        return str(found[0]), found[1].global_step
    return prog["resume"], prog["start_step"]


def driver_record(run: Run, prog: dict[str, Any], seg: Segment) -> dict[str, Any]:
    """The "growth" record (``driver: true``) of the resource change that started segment ``seg``."""
    stage = run.plan.stages[seg.first_stage]
    before = run.segments[seg.index - 1]
    t = prog["timings"].get(stage.name, {})
    old = run.plan.start if seg.first_stage == 0 else run.plan.stages[seg.first_stage - 1].target
    rec = {
        "event": "growth",
        "driver": True,
        "live": False,
        "step": prog["start_step"],
        "stage": stage.name,
        "family": stage.family,
        "from": old.to_dict(),
        "to": stage.target.to_dict(),
        "params_from": param_count(old),
        "params_to": param_count(stage.target),
        "world_size_from": before.resources.world_size,
        "world_size_to": seg.resources.world_size,
        "zero_stage_from": before.resources.zero_stage,
        "zero_stage_to": seg.resources.zero_stage,
        **{k: t.get(k) for k in ("save_s", "grow_s", "relaunch_s", "tokens", "flops")},
    }
    parts = [rec[k] for k in ("save_s", "grow_s", "relaunch_s")]
    rec["seconds"] = sum(parts) if None not in parts else None
    return rec


def log_driver_record(run: Run, rec: dict[str, Any]) -> None:
    """Append ``rec`` to metrics.jsonl (one write in append mode: the job's own appends cannot split it) and its
    seconds to TensorBoard (``growth/<key>`` at its step, beside the job's own scalars)."""
    append_record(run.out_dir, rec)
    from torch.utils.tensorboard import SummaryWriter  # lazy: heavy (about 1 s, tensorboard), rank 0 only

    w = SummaryWriter(str(run.out_dir / "tb"))
    for k in (*RECORD_KEYS, "params_to", "world_size_to"):
        if rec.get(k) is not None:
            w.add_scalar(f"growth/{k}", rec[k], rec["step"])
    w.close()


def wait_job(run: Run, prog: dict[str, Any], seg: Segment, jobs: list, t_launch: float) -> int:
    """Wait for the segment's launcher(s) (runtime.processes.wait_procs: when one fails the others get 10 s, then
    their process groups are killed); meanwhile, after a relaunch, log the driver's growth record once the first
    step after the grown checkpoint is in metrics.jsonl (its ``relaunch_s``: launch to that step). Then wait until
    no process of the jobs' groups is left. Returns the first non-zero exit status (0: all succeeded).

    Raises:
        DriverError: a process of the jobs outlived its launcher by 60 s, even SIGKILLed.
    """
    last = [0.0]

    def poll() -> None:
        if seg.index == 0 or prog["record_written"] or time.monotonic() - last[0] < 0.5:
            return
        last[0] = time.monotonic()
        steps = [r["step"] for r in read_records(run.out_dir) if r.get("event") == "train"]
        if steps and max(steps) > prog["start_step"]:
            stage = run.plan.stages[seg.first_stage].name
            prog["timings"].setdefault(stage, {})["relaunch_s"] = time.perf_counter() - t_launch
            log_driver_record(run, driver_record(run, prog, seg))
            prog["record_written"] = True
            save_progress(run, prog)

    codes, _, _ = procs.wait_procs(jobs, math.inf, grace_s=10.0, poll=poll)
    left = procs.kill_groups_and_wait([j.pid for j in jobs])
    if left:
        raise DriverError(f"processes of segment {seg.index}'s job (process groups {left}) survived SIGKILL for 60 s")
    return next((c for c in codes if c), 0)


def train_phase(run: Run, prog: dict[str, Any]) -> str:
    """Run (or continue) the current segment's job; returns "done" or "stopped".

    Raises:
        DriverError: the job failed (its exit status), or ended neither at --max_steps nor at its stop stage.
    """
    seg = run.segments[prog["segment"]]
    state, _ = outcome(run, seg, prog["start_step"])
    if state != "run":
        return state
    resume, step = resume_point(run, prog)
    stage = run.plan.stages[seg.first_stage].name if seg.index > 0 else None
    if stage is not None and not prog["record_written"]:
        prog["record_written"] = any(r.get("driver") and r.get("stage") == stage for r in read_records(run.out_dir))
    trim_metrics(run.out_dir, step, stage if prog["record_written"] else None, seg.stop_stage)
    t_launch = time.perf_counter()
    jobs, logs = run.launch(seg, resume)
    prog["pgids"] = [j.pid for j in jobs]
    save_progress(run, prog)
    hold_point(f"driver.launched:{seg.index}")  # test-only (runtime.crash_points): killed right after a (re)launch
    rc = wait_job(run, prog, seg, jobs, t_launch)
    prog["pgids"] = []
    save_progress(run, prog)
    if rc != 0:
        tail = "".join(Path(p).read_text(errors="replace")[-3000:] for p in logs)
        killed = f" ({procs.sigkill_note(rc)})" if procs.sigkill_note(rc) else ""  # the launcher passes a rank's -9 on
        raise DriverError(
            f"segment {seg.index}'s job exited with status {rc}{killed}; its log: {', '.join(map(str, logs))}\n{tail}",
            returncode=rc if rc > 0 else 1,
        )
    state, st = outcome(run, seg, prog["start_step"])
    if state == "run":
        raise DriverError(
            f"segment {seg.index}'s job exited 0 but its newest checkpoint (step "
            f"{st.global_step if st else None}) is neither at --max_steps {run.max_steps} nor its stop "
            f"before stage {seg.stop_stage!r}; see {', '.join(map(str, logs))}"
        )
    return state


def stop_checkpoint(run: Run, prog: dict[str, Any], seg: Segment) -> tuple[Path, RunState, dict[str, Any]]:
    """(folder, RunState, "stop" record) of the checkpoint segment ``seg``'s job stopped at.

    Raises:
        DriverError: no checkpoint since the segment started, or no "stop" record at the newest one's step.
    """
    found = newest_checkpoint(run.save_dir)
    if found is None or found[1].global_step < prog["start_step"]:
        raise DriverError(
            f"{run.progress_path} says segment {seg.index} stopped, but {run.save_dir} holds no checkpoint from "
            f"step {prog['start_step']} on; the run folder was changed by hand: start a new --out_dir"
        )
    src_dir, state = found
    stop = stopped_at(run.out_dir, seg, state.global_step)
    if stop is None:
        raise DriverError(
            f"{src_dir} (step {state.global_step}) has no 'stop' record for stage {seg.stop_stage!r} at its step in "
            f"{run.out_dir / 'metrics.jsonl'}; the run folder was changed by hand: start a new --out_dir"
        )
    return src_dir, state, stop


def grow_phase(run: Run, prog: dict[str, Any]) -> None:
    """Grow and reshard the stop checkpoint of the current segment into the next segment's start (skipped when
    that folder was already committed; its ``grow_s`` is then taken from the commit time), then make the next
    segment current, phase "train".

    Raises:
        DriverError: see ``stop_checkpoint``.
    """

    seg, nxt = run.segments[prog["segment"]], run.segments[prog["segment"] + 1]
    stage = run.plan.stages[nxt.first_stage]
    src_dir, state, stop = stop_checkpoint(run, prog, seg)
    out = grown_path(run.driver_dir, nxt.first_stage)
    timings = prog["timings"].setdefault(stage.name, {})
    timings.update(save_s=stop.get("save_s"), tokens=stop.get("tokens"), flops=stop.get("flops"))
    if not out.exists():  # committed by a rename: an existing folder is complete; a .tmp- one is rebuilt
        timings["grow_started"] = time.time()
        save_progress(run, prog)
        t = time.perf_counter()
        src, zero = open_source(src_dir), nxt.resources.zero_stage
        grow_checkpoint(src, out, stage, seed=run.plan.seed, target_zero_stage=zero, stages_done=nxt.first_stage + 1)
        timings["grow_s"] = time.perf_counter() - t
    elif timings.get("grow_s") is None and timings.get("grow_started") is not None:  # killed after the commit
        timings["grow_s"] = out.stat().st_ctime - timings["grow_started"]  # the rename sets the folder's ctime
    prog.update(segment=nxt.index, phase="train", resume=str(out), start_step=state.global_step, record_written=False)
    save_progress(run, prog)


def drive(run: Run, prog: dict[str, Any]) -> int:
    """Run the phases from ``prog`` (new or read back) to the end of the plan; returns 0.

    Raises:
        DriverError: a job failed or bad input found on the way.
    """
    killed, left = procs.kill_stale(prog.get("pgids", []), marker=str(run.driver_dir.resolve()))
    if killed:
        print(f"growlm-run: killed the job(s) a previous driver left running (process groups {killed})")
    if left:
        raise DriverError(f"the previous driver's jobs (process groups {left}) survived SIGKILL for 60 s")
    while prog["phase"] != "done":
        if prog["phase"] == "train":
            result = train_phase(run, prog)
            prog["phase"] = "done" if result == "done" or prog["segment"] == len(run.segments) - 1 else "grow"
            save_progress(run, prog)
        if prog["phase"] == "grow":
            grow_phase(run, prog)
    print(f"growlm-run: done; run folder {run.out_dir} (checkpoints/, metrics.jsonl, tb/)")
    return 0
