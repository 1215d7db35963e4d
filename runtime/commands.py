"""What every growlm command line shares: a help formatter that shows each flag's default, ``--version``, and a
Ctrl-C that ends a command in one line.

Used by every console command (growlm-train, -prepare, -build-corpus, -grow, -run, -eval, -experiment, -bench), so
their ``--help`` reads alike. Standard library only.
"""

from __future__ import annotations

import argparse
import functools
import signal
import sys
from collections.abc import Callable

from growlm import __version__

INTERRUPTED = 128 + signal.SIGINT  # the shell's status for a command ended by SIGINT


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's defaults formatter, showing a flag's default only when it has one (not None, not a switch's False)
    and its help does not already say it ("default ...")."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if unset or "default" in text or not action.option_strings:  # identity: a default of 0 is shown
            return text
        return super()._get_help_string(action)


def add_version(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--version`` (prints ``PROG growlm VERSION`` and exits 0) to ``parser``; returns it."""
    parser.add_argument("--version", action="version", version=f"%(prog)s (growlm {__version__})")
    return parser


def interruptible(prog: str) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Decorate a command's ``main`` so that Ctrl-C (SIGINT, ``KeyboardInterrupt``) ends it with one line on stderr
    and exit status 130 instead of a traceback. The command's own writers stage into ``.tmp-`` folders under a
    writer lock and put an output in place only once it is complete (runtime.atomic, runtime.lock), so what it had
    not finished is left there for the next run to replace, and every earlier output is as it was."""

    def wrap(main: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(main)
        def run(*args: object, **kwargs: object) -> int:
            try:
                return main(*args, **kwargs)
            except KeyboardInterrupt:
                print(
                    f"{prog}: interrupted (SIGINT) before it finished; no finished output was changed (outputs are "
                    "put in place only when complete; an unfinished .tmp- folder is replaced by the next run)",
                    file=sys.stderr,
                    flush=True,
                )
                return INTERRUPTED

        return run

    return wrap
