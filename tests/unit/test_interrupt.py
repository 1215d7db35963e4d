"""Ctrl-C ends growlm-grow, growlm-eval, growlm-prepare, growlm-bench and growlm-experiment in one line with exit
status 130, never a traceback (runtime.commands.interruptible; tests/distributed/test_output_writers.py interrupts a
real growlm-grow mid-write)."""

from __future__ import annotations

import pytest

from growlm.data import prepare
from growlm.eval.bench import throughput as bench_cli
from growlm.eval.experiments import cli as experiment_cli
from growlm.eval.metrics import cli as eval_cli
from growlm.growth.offline import cli as grow_cli
from growlm.runtime.commands import INTERRUPTED, interruptible


@pytest.mark.parametrize(
    "module, prog",
    [
        (grow_cli, "growlm-grow"),
        (eval_cli, "growlm-eval"),
        (prepare, "growlm-prepare"),
        (bench_cli, "growlm-bench"),
        (experiment_cli, "growlm-experiment"),
    ],
)
@pytest.mark.bad_input
def test_each_command_turns_ctrl_c_into_one_line(module, prog, capsys, monkeypatch):
    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "parse_args" if hasattr(module, "parse_args") else "build_parser", stopped)
    assert module.main([]) == INTERRUPTED == 130
    err = capsys.readouterr().err
    assert err.startswith(f"{prog}: interrupted (SIGINT) before it finished;") and err.count("\n") == 1, err


def test_the_decorator_passes_the_status_through():
    assert interruptible("x")(lambda: 3)() == 3
