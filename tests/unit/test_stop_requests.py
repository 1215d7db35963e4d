"""Stop requests (runtime.stop), launchers' command lines (runtime.processes) and the resume command
(trainer.stopping), in this process: signals are sent to itself, nothing is started. Real jobs stopped by signals:
tests/distributed/test_stop.py."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from growlm.runtime import stop
from growlm.runtime.processes import is_launcher
from growlm.trainer.stopping import resume_command


@pytest.fixture
def handlers():
    # the default actions first: a harness may have set SIGINT to SIG_IGN (pytest-xdist's workers do), which
    # install() rightly leaves alone, as a shell's background job expects
    harness = {s: signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGTERM)}
    stop.reset()
    restore = stop.install()
    yield
    restore()
    stop.reset()
    for s, h in harness.items():
        signal.signal(s, h)


def test_a_signal_is_recorded_not_obeyed_and_the_handlers_are_put_back(handlers):
    assert stop.requested() == 0 and stop.votes() == [0.0, 0.0]
    os.kill(os.getpid(), signal.SIGTERM)  # delivered before os.kill returns to Python code
    assert stop.requested() == signal.SIGTERM
    assert stop.votes() == [0.0, 1.0]
    assert stop.reason(signal.SIGTERM) == "SIGTERM received"
    os.kill(os.getpid(), signal.SIGINT)  # the first SIGINT is a request too
    assert stop.votes() == [1.0, 1.0] and stop.requested() == signal.SIGINT
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)  # the second stops at once


def test_restore_puts_the_previous_handlers_back():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    restore = stop.install()
    assert signal.getsignal(signal.SIGTERM) is not before[0]
    restore()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_launcher_gone_is_a_sigterm_request_when_handled(handlers):
    stop.launcher_gone("the job's launcher (deepspeed, pid 12) is gone")
    assert stop.requested() == signal.SIGTERM
    assert stop.reason(signal.SIGTERM) == "the job's launcher (deepspeed, pid 12) is gone"


def test_the_ranks_agree_on_the_summed_votes():
    assert stop.agreed([0.0, 0.0]) == 0
    assert stop.agreed([0.0, 3.0]) == signal.SIGTERM  # 3 ranks got SIGTERM
    assert stop.agreed([1.0, 2.0]) == signal.SIGINT  # the interactive signal first
    assert stop.exit_status(signal.SIGTERM) == 143 and stop.exit_status(signal.SIGINT) == 130
    assert stop.reason(signal.SIGINT) == "SIGINT on another rank"


@pytest.mark.parametrize(
    "cmdline, launcher",
    [
        (["/v/bin/python3.11", "/v/bin/deepspeed", "--num_gpus", "2", "train.py"], True),  # the runner
        (["/v/bin/python3.11", "-u", "-m", "deepspeed.launcher.launch", "--world_info=e30=", "train.py"], True),
        (["/v/bin/python", "/v/bin/torchrun", "--nproc_per_node", "2", "train.py"], True),
        (["python", "-m", "torch.distributed.run", "train.py"], True),
        (["/v/bin/python3.11", "-u", "train.py", "--local_rank=0"], False),  # a rank
        (["-bash"], False),
        (["/usr/bin/python3", "-m", "pytest", "tests/"], False),
        ([], False),
    ],
)
def test_launchers_are_known_by_their_command_lines(cmdline, launcher):
    assert is_launcher(cmdline) is launcher


def test_the_resume_command_points_at_the_checkpoints_and_drops_init_from_and_local_rank():
    cmd = ["/v/bin/deepspeed", "--num_gpus", "2", "train.py", "--init_from", "runs/hf", "--resume=runs/old",
           "--local_rank=1", "--out_dir", "runs/my run"]  # fmt: skip
    assert resume_command(cmd, Path("runs/my run/checkpoints")) == (
        "/v/bin/deepspeed --num_gpus 2 train.py --out_dir 'runs/my run' --resume 'runs/my run/checkpoints'"
    )


def test_an_ignored_signal_stays_ignored():
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # e.g. a shell's background job
    try:
        restore = stop.install()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN  # still handled
        restore()
    finally:
        signal.signal(signal.SIGINT, before)
