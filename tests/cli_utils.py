"""Assertions for refused commands: exit status 2 and exactly one ``PROG: error: ...`` line, no traceback."""

from __future__ import annotations

from growlm import train


def one_error_line(err: str, prog: str) -> str:
    """The single stderr line of a refused command (no traceback), without the ``PROG: error: `` prefix.

    Raises:
        AssertionError: stderr holds more or less than one non-empty line, another prefix, or a traceback.
    """
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{prog}: error: "), err
    assert "Traceback" not in err
    return lines[0].removeprefix(f"{prog}: error: ")


def train_fails(capsys, argv: list[str], *needles: str) -> str:
    """Run ``train.main(argv)`` in this process; assert exit status 2 and one ``growlm-train: error:`` line that
    contains every needle; return that line."""
    rc = train.main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = [line for line in err.splitlines() if line.startswith("growlm-train: error:")]
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]
