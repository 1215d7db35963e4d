"""A run stopped by a signal: its checkpoint, its "interrupt" record, and the line that says how to continue.

Every rank reaches ``stop_on_signal`` at the same step (the ranks agree on the stop with the step's loss:
``trainer.loop.train_step``, ``runtime.stop``). The step in progress is finished, with its validation and planned
save; the run then saves a checkpoint at that step when it has none (not with --no_final_save), logs
``{"event": "interrupt", "step", "signal", "checkpoint", "tokens", "flops"}`` and prints one line naming the step,
the checkpoint and the command that resumes it. The exit status is ``runtime.stop.exit_status``.
"""

from __future__ import annotations

import shlex
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from growlm.runtime import checkpoint, stop
from growlm.runtime.dist import DistInfo
from growlm.runtime.processes import launch_command
from growlm.trainer.checkpointing import save
from growlm.trainer.config import RunConfig
from growlm.trainer.logger import MetricsLogger
from growlm.trainer.loop import Progress

_DROP_WITH_VALUE = ("--resume", "--init_from")  # replaced by --resume CKPT (--init_from does not combine with it)


def this_command() -> list[str]:
    """The command that started this job as the user typed it: the outermost launcher's (``deepspeed ...``,
    ``torchrun ...``; runtime.processes.launch_command), else this process's own (``python train.py ...``)."""
    outer = launch_command()
    if outer:
        return list(outer)
    script = sys.argv[0]
    return ["python", script, *sys.argv[1:]] if script.endswith(".py") else [Path(script).name, *sys.argv[1:]]


def resume_command(command: Sequence[str], save_dir: Path) -> str:
    """``command`` (argv) with --resume pointing at ``save_dir`` (any earlier --resume and --init_from removed, and
    a launcher's --local_rank=N), quoted for a POSIX shell."""
    out: list[str] = []
    skip = False
    for arg in command:
        if skip:
            skip = False
            continue
        if arg in _DROP_WITH_VALUE:
            skip = True
            continue
        if arg.startswith(tuple(f"{f}=" for f in (*_DROP_WITH_VALUE, "--local_rank"))):
            continue
        out.append(arg)
    return shlex.join([*out, "--resume", str(save_dir)])


def stop_on_signal(
    p: Progress, run: RunConfig, info: DistInfo, log: MetricsLogger, sha: str | None, signum: int, saved: Path | None
) -> int:
    """End the run at this step for signal ``signum`` (a collective: every rank calls it at the same step): save
    unless ``saved`` (this step's planned save) or --no_final_save or the tag exists already (an earlier run's:
    never replaced), log the "interrupt" record, print where the run stopped and how to resume.

    Returns:
        The exit status, 128 + ``signum``.

    Raises:
        CheckpointError, RankError: the save failed (trainer.checkpointing.save).
    """
    path = saved
    if path is None and run.final_save and checkpoint.tag_for(p.step) not in checkpoint.existing_tags(run.save_dir):
        path = save(p, run, info, sha)
    name = signal.Signals(signum).name
    rec = {"event": "interrupt", "step": p.step, "signal": name, "checkpoint": str(path) if path else None,
           "tokens": p.consumed * run.seq_len, "flops": p.consumed_flops}  # fmt: skip
    log.log(rec)
    where = f"growlm: {stop.reason(signum)}: stopped after step {p.step} of {run.max_steps}"
    if path is not None:
        log.console(f"{where}, checkpoint {path}; resume: {resume_command(this_command(), run.save_dir)}")
    else:
        why = "--no_final_save" if not run.final_save else f"{checkpoint.tag_for(p.step)} exists from an earlier run"
        log.console(f"{where}; no checkpoint of this step ({why})")
    return stop.exit_status(signum)


def stop_before_training(p: Progress, run: RunConfig, log: MetricsLogger, signum: int) -> int:
    """End the run before its first step for signal ``signum`` (agreed by every rank): nothing was trained, so
    nothing is saved; print that the same command starts it again. Returns the exit status, 128 + ``signum``."""
    log.console(f"growlm: {stop.reason(signum)}: stopped before training (at step {p.step}); nothing to save")
    return stop.exit_status(signum)
