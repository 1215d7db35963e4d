"""Process groups: start a child in its own, kill a group and wait until it is gone, reap children, die with a driver.

The one home of process-group handling for the rank launcher (``runtime.launch``), the multi-stage driver
(growlm-run) and the ranks it starts. Every child is started in a new session, so its PID is its process group id
and killing the group reaches everything it started.

growlm-run's children never outlive it: a stage's job is a launcher (``deepspeed ...``) started by ``spawn`` with
``PR_SET_PDEATHSIG = SIGKILL`` (Linux ``prctl``, through ctypes in the child before it runs the launcher), so the
launcher dies with the driver. The ranks are grandchildren, which a parent-death signal does not reach, so each rank
started under the driver (``GROWLM_DRIVER_PID`` in its environment) runs a watchdog thread (``watch_driver``) that
kills its whole process group once the driver is gone. A restarted driver also kills the process groups its
progress file still lists (``kill_stale``) before it starts anything.

Ranks of other launchers watch their launchers too (``watch_launchers``, started by ``runtime.dist.init_distributed``):
DeepSpeed's ``deepspeed`` runner ends on SIGTERM without passing it on to its per-node ``launch.py`` and the ranks
(it does so only for pdsh), and no launcher's ranks get a signal when the launcher is SIGKILLed. A rank's launchers
are its ancestors whose command lines are launchers (``is_launcher``) and the rank launcher of ``runtime.launch``
(named in ``LAUNCHER_PID_ENV``); once one is gone the rank is told (``runtime.stop.launcher_gone``) and stops.
Process tables are read with psutil.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

DRIVER_PID_ENV = "GROWLM_DRIVER_PID"
PR_SET_PDEATHSIG = 1  # linux/prctl.h
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
# held while a child is being started (``runtime.launch.start_rank``): a watchdog that takes it and never gives it
# back knows every child this process will ever have is already there to be found (``kill_descendants``)
SPAWN_LOCK = threading.Lock()


KILLED_BY_KERNEL = "killed by the kernel, likely out of memory"
# the exit statuses a SIGKILLed process leaves: its own (-9, Popen's), through a shell (137 = 128 + 9) and through
# DeepSpeed's per-node launch.py, which passes a rank's -9 to sys.exit (247 = -9 mod 256)
SIGKILL_STATUSES = (-signal.SIGKILL, 128 + signal.SIGKILL, 256 - signal.SIGKILL)


def sigkill_note(code: int) -> str:
    """What an exit status ``code`` says when a SIGKILL ended the process (``SIGKILL_STATUSES``): the kernel's
    out-of-memory killer is the usual sender (nothing growlm runs sends it but a timeout or a failed peer's clean-up,
    which their callers name themselves); '' for any other status."""
    return f"{KILLED_BY_KERNEL} (SIGKILL)" if code in SIGKILL_STATUSES else ""


def oom_kill_count() -> int | None:
    """How many processes the kernel's out-of-memory killer has killed so far: the ``oom_kill`` line of this process's
    cgroup's ``memory.events`` (cgroup v2: the container's or the job's own limit), else of ``/proc/vmstat`` (the
    whole machine, Linux 4.13 and later); None where neither can be read."""
    paths = []
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                paths.append(Path("/sys/fs/cgroup") / line[3:].lstrip("/") / "memory.events")
    except OSError:
        pass
    for path in [*paths, Path("/proc/vmstat")]:
        try:
            for line in path.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


def process_gone(host: str, pid: int) -> bool | None:
    """Whether process ``pid`` of ``host`` has ended (no such process, or a zombie its parent has not reaped yet);
    None when ``host`` is not this machine (it cannot be told from here)."""
    if host != socket.gethostname():
        return None
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill_group(pgid: int) -> None:
    """SIGKILL process group ``pgid`` (a process started in its own session, ``pgid`` = its PID, and anything it
    started), if it is still there."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def wait_procs(
    procs: Sequence[subprocess.Popen], timeout_s: float, grace_s: float, poll: Callable[[], None] | None = None
) -> tuple[list[int], list[int], bool]:
    """Reap every process: (exit codes, peak RSS in bytes, timed out). Kills the rest (their process groups)
    ``grace_s`` seconds after the first failure, or all at ``timeout_s`` (``math.inf``: never); ``poll`` is called
    every 0.05 s while any runs. Exit codes are negative for a process ended by a signal (-9: SIGKILL)."""
    codes: list[int | None] = [None] * len(procs)
    rss = [0] * len(procs)
    deadline, kill_at, timed_out = time.monotonic() + timeout_s, None, False
    while any(c is None for c in codes):
        for i, p in enumerate(procs):
            if codes[i] is None:
                pid, status, usage = os.wait4(p.pid, os.WNOHANG)
                if pid:
                    codes[i] = p.returncode = os.waitstatus_to_exitcode(status)
                    rss[i] = usage.ru_maxrss * 1024  # Linux reports KiB
        now = time.monotonic()
        if kill_at is None and any(c not in (None, 0) for c in codes):
            kill_at = now + grace_s
        if now > deadline:
            timed_out = True
        if timed_out or (kill_at is not None and now > kill_at):
            for i, p in enumerate(procs):
                if codes[i] is None:
                    kill_group(p.pid)
                    _, status, usage = os.wait4(p.pid, 0)
                    codes[i] = p.returncode = os.waitstatus_to_exitcode(status)
                    rss[i] = usage.ru_maxrss * 1024
        if poll is not None:
            poll()
        time.sleep(0.05)
    return [int(c) for c in codes], rss, timed_out


def _die_with_parent() -> None:
    """preexec_fn: ask the kernel to SIGKILL this child when its parent (the driver) dies (Linux only)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the ranks' watchdog and kill_stale still apply
        pass


def descendant_groups(pid: int) -> list[int]:
    """The process groups of every descendant of ``pid`` (ranks start in sessions of their own), collected before
    anything is killed (a killed parent's children are re-parented and could no longer be found); zombies and the
    caller's own group are left out."""
    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    groups = set()
    for q in procs:
        try:
            if q.status() != psutil.STATUS_ZOMBIE:  # an exited child not reaped yet is no one to kill
                groups.add(os.getpgid(q.pid))
        except (ProcessLookupError, psutil.NoSuchProcess):  # ended meanwhile
            continue
    groups.discard(os.getpgrp())
    return sorted(groups)


def adopt_orphans() -> None:
    """Make this process the subreaper of its descendants (Linux ``PR_SET_CHILD_SUBREAPER``): a descendant whose
    parent is killed is re-parented to this process instead of init, so ``kill_descendants`` still finds it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux
        pass


def kill_descendants(timeout_s: float = 30.0) -> list[int]:
    """SIGKILL the process groups of every descendant of this process and wait until they are gone; first take
    ``SPAWN_LOCK`` for good, so no child started meanwhile escapes (call it only on the way out). Repeats until no
    descendant is left (with ``adopt_orphans``, one started by a descendant while it was being killed comes back
    here), at most ``timeout_s`` seconds; returns the groups still alive then ([] normally)."""
    SPAWN_LOCK.acquire()
    deadline = time.monotonic() + timeout_s
    while groups := descendant_groups(os.getpid()):
        left = kill_groups_and_wait(groups, max(0.0, deadline - time.monotonic()))
        if left or time.monotonic() >= deadline:
            return left
    return []


def exit_with_parent(parent: int, poll_s: float = 1.0) -> None:
    """Start a daemon thread that ends this process (``os._exit(1)``) once its parent ``parent`` (a PID the parent
    passed down, so a parent that died before this call is caught too) is gone, polling every ``poll_s`` seconds:
    for worker processes (growlm-experiment's pool) that must not outlive the command that started them, whether it
    ended by SIGTERM, SIGKILL or a crash. A parent that is gone leaves the process reparented (``os.getppid``
    changes), which works whichever thread of the parent started it, unlike a parent-death signal."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="growlm-parent-watchdog", daemon=True).start()


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
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def group_members(pgid: int) -> list[int]:
    """PIDs of the live (non-zombie) processes in process group ``pgid``."""
    members = []
    for p in psutil.process_iter(["status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) == pgid:
                members.append(p.pid)
        except (ProcessLookupError, psutil.Error):  # ended meanwhile
            continue
    return members


def kill_groups_and_wait(pgids: Sequence[int], timeout_s: float = 60.0) -> list[int]:
    """SIGKILL process groups ``pgids`` and poll until none of their processes is left (a killed rank may take a
    moment to exit and free its port and memory), at most ``timeout_s`` seconds; returns the groups that still have
    members then ([] normally)."""
    for pgid in pgids:
        kill_group(pgid)
    deadline = time.monotonic() + timeout_s
    left = [g for g in pgids if group_members(g)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [g for g in left if group_members(g)]
    return left


def _cmdline(pid: int) -> str:
    """The command line of ``pid`` joined by spaces ('' when it is gone or hidden)."""
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def kill_stale(pgids: Sequence[int], marker: str, timeout_s: float = 60.0) -> tuple[list[int], list[int]]:
    """Kill the process groups a killed driver left (``pgids`` from its progress file) whose members run a command
    line containing ``marker`` (the run folder: a reused id of an unrelated group is left alone) and wait until
    they are gone (``kill_groups_and_wait``); returns (the groups killed, those still alive after ``timeout_s``)."""
    killed = [g for g in pgids if any(marker in _cmdline(pid) for pid in group_members(g))]
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


LAUNCHER_PID_ENV = "GROWLM_LAUNCHER_PID"  # <host>:<pid> of runtime.launch's launcher, in every rank it starts
# launchers whose ranks would outlive them: DeepSpeed's runner (which passes SIGTERM on only to pdsh) and its
# per-node launch.py, torchrun; matched on the module run with -m or the script's file name
_LAUNCHER_MODULES = ("deepspeed.launcher.runner", "deepspeed.launcher.launch", "torch.distributed.run")
_LAUNCHER_SCRIPTS = ("deepspeed", "ds", "deepspeed.pt", "torchrun")
_WATCH: dict = {"pid": None, "command": None}


def is_launcher(cmdline: Sequence[str]) -> bool:
    """Whether a command line (psutil's ``cmdline()``) runs a launcher of ranks: DeepSpeed's ``deepspeed`` runner or
    its per-node ``deepspeed.launcher.launch``, or torchrun (script or ``-m`` module)."""
    return any(m in cmdline[:4] for m in _LAUNCHER_MODULES) or any(
        Path(a).name in _LAUNCHER_SCRIPTS for a in cmdline[:2]
    )


def _launcher_name(cmdline: Sequence[str]) -> str:
    """A short name for a launcher's command line: the module or script ``is_launcher`` knows, else its program."""
    for arg in cmdline[:4]:
        if arg in _LAUNCHER_MODULES or Path(arg).name in _LAUNCHER_SCRIPTS:
            return Path(arg).name if Path(arg).name in _LAUNCHER_SCRIPTS else arg
    return Path(cmdline[0]).name if cmdline else "launcher"


def _running(proc: psutil.Process) -> bool:
    """Whether ``proc`` still runs: the same process (psutil compares its start time, so a reused PID is not it)
    and not a zombie."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


@dataclass(frozen=True)
class Launcher:
    """A launcher a rank runs under: its PID, its command line, and the process (None: gone when first looked at)."""

    pid: int
    cmdline: list[str]
    proc: psutil.Process | None

    def running(self) -> bool:
        """Whether the launcher still runs (the same process: a reused PID is not it; a zombie is gone)."""
        return self.proc is not None and _running(self.proc)


def job_launchers() -> list[Launcher]:
    """The launchers this process's job runs under: the rank launcher named by ``LAUNCHER_PID_ENV``
    (``runtime.launch``; on this machine only), then the chain of ancestors from the parent up whose command lines
    are launchers (``is_launcher``: a bare ``deepspeed train.py`` gives launch.py, then the runner). [] for a
    process started without one. A named launcher that is already gone is listed too (not running)."""
    found: list[Launcher] = []
    host, _, pid = os.environ.get(LAUNCHER_PID_ENV, "").rpartition(":")
    if pid.isdigit() and host == socket.gethostname():
        try:
            proc = psutil.Process(int(pid))
            found.append(Launcher(proc.pid, proc.cmdline(), proc))
        except psutil.NoSuchProcess:
            found.append(Launcher(int(pid), [], None))
        except psutil.AccessDenied:
            pass
    try:
        proc = psutil.Process().parent()
        while proc is not None:
            cmdline = proc.cmdline()
            if not is_launcher(cmdline):
                break
            found.append(Launcher(proc.pid, cmdline, proc))
            proc = proc.parent()
    except psutil.Error:  # an ancestor ended or is hidden meanwhile: watch what was found
        pass
    return found


def launch_command() -> list[str] | None:
    """The command line of the outermost launcher ``watch_launchers`` found for this process's job (the
    ``deepspeed ...`` the user typed), the interpreter left out when it runs a launcher script; None when it found
    none, or ran under growlm-run or growlm's own rank launcher (whose command is not the job's)."""
    return _WATCH["command"]


def watch_launchers(on_gone: Callable[[str], None], poll_s: float = 0.5) -> bool:
    """Start a daemon thread that calls ``on_gone(why)`` once any of this process's launchers (``job_launchers``)
    is gone, polling every ``poll_s`` seconds: ranks whose launcher ended without passing a signal on (DeepSpeed's
    runner on SIGTERM, any launcher on SIGKILL) learn that their job is gone. Not under growlm-run, whose ranks
    ``watch_driver`` ends. Once per process. Returns whether a thread watches.
    """
    if os.environ.get(DRIVER_PID_ENV) or _WATCH["pid"] == os.getpid():
        return False
    _WATCH["pid"] = os.getpid()
    launchers = job_launchers()
    outer = launchers[-1].cmdline if launchers and launchers[-1].cmdline and is_launcher(launchers[-1].cmdline) else []
    if len(outer) > 1 and Path(outer[1]).name in _LAUNCHER_SCRIPTS:
        outer = outer[1:]  # python .../bin/deepspeed ARGS -> .../bin/deepspeed ARGS
    _WATCH["command"] = outer or None
    if not launchers:
        return False

    def watch() -> None:
        while True:
            for launcher in launchers:
                if not launcher.running():
                    on_gone(f"the job's launcher ({_launcher_name(launcher.cmdline)}, pid {launcher.pid}) is gone")
                    return
            time.sleep(poll_s)

    threading.Thread(target=watch, name="growlm-launcher-watchdog", daemon=True).start()
    return True
