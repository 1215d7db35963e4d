"""What every growlm command line shares: a help formatter that shows each flag's default, and ``--version``.

Used by every console command (growlm-train, -prepare, -build-corpus, -grow, -run, -eval, -experiment, -bench), so
their ``--help`` reads alike. Standard library only.
"""

from __future__ import annotations

import argparse

from growlm import __version__


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
