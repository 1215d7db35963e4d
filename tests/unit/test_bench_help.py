"""The benchmark modules (``python -m growlm.eval.bench.NAME``) answer ``--version`` and show their flags' defaults
in ``--help``, as the console commands do."""

from __future__ import annotations

import importlib
import sys

import pytest

from growlm import __version__

BENCHES = ("baseline", "checkpoint_io", "growth_ops", "growth_scaling", "live_growth", "offline_growth",
           "operator_dynamics")  # fmt: skip


@pytest.mark.parametrize("name", BENCHES)
def test_a_benchmark_has_version_and_shows_its_defaults(name, monkeypatch, capsys):
    mod = importlib.import_module(f"growlm.eval.bench.{name}")
    prog = f"python -m growlm.eval.bench.{name}"
    for flag in ("--version", "--help"):
        monkeypatch.setattr(sys, "argv", [prog, flag])
        with pytest.raises(SystemExit) as e:
            mod.main()
        assert e.value.code == 0
        out = capsys.readouterr().out
        if flag == "--version":
            assert out.strip().splitlines()[-1] == f"{prog} (growlm {__version__})"  # after DeepSpeed's import notice
        else:
            assert f"usage: {prog}" in out and "(default: " in out
