"""Child processes of the multi-stage driver (growlm-run) that never outlive it.

A stage's job is a launcher (``deepspeed ...``) and the ranks it starts. The driver starts each launcher in its own
process group (a new session) with ``PR_SET_PDEATHSIG = SIGKILL`` (Linux ``prctl``, through ctypes in the child
before it runs the launcher), so the launcher dies with the driver. The ranks are grandchildren, which a parent-death
signal does not reach, so each rank started under the driver (``GROWLM_DRIVER_PID`` in its environment) runs a
watchdog thread (``watch_driver``) that kills its whole process group once the driver is gone. A restarted driver
also kills the process groups its progress file still lists (``kill_stale``) before it starts anything.
Standard library only (and runtime.launch, which is too).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from runtime.launch import kill_group

DRIVER_PID_ENV = "GROWLM_DRIVER_PID"
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent() -> None:
    """preexec_fn: ask the kernel to SIGKILL this child when its parent (the driver) dies (Linux only)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the ranks' watchdog and kill_stale still apply
        pass


def spawn(cmd: Sequence[str], env: Mapping[str, str], log_path: Path) -> subprocess.Popen:
    """Start ``cmd`` in a new session (its PID is its process group id) that dies with this process, output
    (stdout and stderr) appended to ``log_path``; ``env`` gets ``GROWLM_DRIVER_PID`` = ``<host name>:<this PID>``."""
    full_env = {**env, DRIVER_PID_ENV: f"{socket.gethostname()}:{os.getpid()}"}
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(cmd),
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a killed driver its parent has not reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def group_members(pgid: int) -> list[int]:
    """PIDs of the live (non-zombie) processes in process group ``pgid`` (read from /proc; [] elsewhere)."""
    members = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(d.name))
    return members


def kill_groups_and_wait(pgids: Sequence[int], timeout_s: float = 60.0) -> list[int]:
    """SIGKILL process groups ``pgids`` and poll /proc until none of their processes is left (a killed rank may
    take a moment to exit and free its port and memory), at most ``timeout_s`` seconds; returns the groups that
    still have members then ([] normally)."""
    for pgid in pgids:
        kill_group(pgid)
    deadline = time.monotonic() + timeout_s
    left = [g for g in pgids if group_members(g)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [g for g in left if group_members(g)]
    return left


def kill_stale(pgids: Sequence[int], marker: str, timeout_s: float = 60.0) -> tuple[list[int], list[int]]:
    """Kill the process groups a killed driver left (``pgids`` from its progress file) whose members run a command
    line containing ``marker`` (the run folder: a reused id of an unrelated group is left alone) and wait until
    they are gone (``kill_groups_and_wait``); returns (the groups killed, those still alive after ``timeout_s``)."""
    killed = []
    for pgid in pgids:
        members = group_members(pgid)
        cmdlines = []
        for pid in members:
            try:
                cmdlines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
        if members and any(marker in c for c in cmdlines):
            killed.append(pgid)
    return killed, kill_groups_and_wait(killed, timeout_s)


def watch_driver(poll_s: float = 0.5) -> None:
    """In a rank started under growlm-run (``GROWLM_DRIVER_PID`` set): start a daemon thread that SIGKILLs this
    rank's process group (the launcher and every rank of the job) once the driver process is gone. Does nothing
    when the variable is not set or names another machine (a rank the launcher started on another node over ssh,
    where the driver's PID means nothing)."""
    host, _, pid = os.environ.get(DRIVER_PID_ENV, "").rpartition(":")
    if not pid.isdigit() or host != socket.gethostname():
        return

    def watch() -> None:
        while alive(int(pid)):
            time.sleep(poll_s)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="growlm-driver-watchdog", daemon=True).start()
