"""Stop requests: SIGTERM, SIGINT, or a launcher that is gone, turned into a stop every rank agrees on.

A rank that gets SIGTERM or SIGINT does not die mid-step: ``install`` replaces the two signals' handlers with one
that records the request (``requested``). The training loop sends each rank's requests along with the loss it
already all-reduces every step (``votes`` in, ``agreed`` out), so every rank learns of a request on any rank at
the same step and all stop there together; a rank that stopped alone would leave the others waiting in their next
collective. A second SIGINT (Ctrl-C pressed again) raises ``KeyboardInterrupt`` at once.

A rank whose launcher is gone (DeepSpeed's runner ends on SIGTERM without passing it on; see
``runtime.processes.watch_launchers``) is told through ``launcher_gone``: with the handlers installed that is a
SIGTERM request like any other; without them (a command with no step loop, such as growlm-eval) the rank sends
itself SIGTERM, whose default action ends it.

The exit status after a stop is the shell's convention for a process ended by a signal, 128 + its number
(``exit_status``): 143 for SIGTERM (and for a launcher that is gone), 130 for SIGINT. Standard library only.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Sequence

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # the order of ``votes`` and the precedence of ``agreed``

_STATE: dict = {"installed": False, "counts": dict.fromkeys(STOP_SIGNALS, 0), "why": {}}
_LOCK = threading.RLock()  # re-entrant: a signal handler may run while the main thread holds it


def _say(message: str) -> None:
    """Write one line to stderr from a signal handler or thread (``os.write``: no buffered stream is re-entered);
    on the first local rank only, so a node's ranks do not repeat it."""
    if os.environ.get("LOCAL_RANK", "0") == "0":
        try:
            os.write(2, f"{message}\n".encode())
        except OSError:
            pass


def request(signum: int, why: str) -> None:
    """Record a request to stop for signal ``signum`` (one of ``STOP_SIGNALS``); ``why`` says where it came from.
    Thread-safe; the first request of each signal prints one line."""
    with _LOCK:
        first = _STATE["counts"][signum] == 0
        _STATE["counts"][signum] += 1
        _STATE["why"].setdefault(signum, why)
    if first:
        _say(f"growlm: {why}: stopping after the current step (SIGKILL ends the run at once)")


def _handle(signum: int, frame: object) -> None:
    """The installed handler: a second SIGINT interrupts at once; anything else is recorded as a request."""
    if signum == signal.SIGINT and _STATE["counts"][signal.SIGINT]:
        raise KeyboardInterrupt
    request(signum, f"{signal.Signals(signum).name} received")


def install() -> Callable[[], None]:
    """Handle SIGTERM and SIGINT by recording a stop request (see the module docstring) instead of ending the
    process. A signal the process was started with ignored (a background job's SIGINT) stays ignored. Only the main
    thread can install handlers: elsewhere nothing changes.

    Returns:
        A function that puts the previous handlers back (call it once the run is over).
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {}
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, _handle)
    _STATE["installed"] = True

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _STATE["installed"] = False

    return restore


def launcher_gone(why: str) -> None:
    """Called (from a watchdog thread) when this rank's launcher is gone: a SIGTERM request when ``install``'s
    handlers are in place, else a SIGTERM sent to this process (its handler, or the default action: the end)."""
    if _STATE["installed"]:
        request(signal.SIGTERM, why)
    else:
        os.kill(os.getpid(), signal.SIGTERM)


def requested() -> int:
    """The signal this rank was asked to stop for (``STOP_SIGNALS``' first with a request), 0 when none."""
    return agreed(votes())


def votes() -> list[float]:
    """This rank's requests, one count per signal of ``STOP_SIGNALS``: the values to all-reduce (sum) each step."""
    return [float(_STATE["counts"][s]) for s in STOP_SIGNALS]


def agreed(summed: Sequence[float]) -> int:
    """The signal all ranks stop for, from the sum of every rank's ``votes``: the first of ``STOP_SIGNALS`` any rank
    was sent (SIGINT, the interactive one, before SIGTERM), 0 when no rank has a request."""
    return next((int(s) for s, n in zip(STOP_SIGNALS, summed, strict=True) if n > 0), 0)


def reason(signum: int) -> str:
    """Where this rank's request for ``signum`` came from ('SIGTERM received', 'its launcher ... is gone'), or
    'SIGNAME on another rank' when this rank got none."""
    return _STATE["why"].get(signum, f"{signal.Signals(signum).name} on another rank")


def exit_status(signum: int) -> int:
    """The exit status of a run stopped for ``signum``: 128 + its number (143 for SIGTERM, 130 for SIGINT)."""
    return 128 + int(signum)


def reset() -> None:
    """Forget every request (a process that runs more than one training in turn, such as a test)."""
    with _LOCK:
        _STATE["counts"] = dict.fromkeys(STOP_SIGNALS, 0)
        _STATE["why"] = {}
