"""Start N ranks of a command on this machine over loopback, the way torchrun would, and collect what they did.

The one rank launcher of tests, benchmarks and the staged experiment: every rank gets RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a MASTER_PORT that was free a moment ago (``free_port``; never a fixed
port, so runs started side by side do not collide). Each rank writes to its own log file; the launcher waits for
all of them and records each exit code and peak resident memory (``os.wait4``). When a rank fails, the others get
``grace_s`` seconds to stop by themselves (every rank usually reports the same error) and are then killed, since
they would otherwise wait for the failed rank until the process-group timeout; on a timeout all are killed.
Standard library only.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from growlm.runtime.processes import LAUNCHER_PID_ENV, SPAWN_LOCK, kill_group, wait_procs


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listened on when asked (the OS picks it; it is released at once)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rank_env(rank: int, world_size: int, port: int, base: Mapping[str, str] | None = None, **extra: str) -> dict:
    """The environment of rank ``rank`` of ``world_size`` on this machine: ``base`` (default ``os.environ``) plus
    RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=``port``, and
    ``GROWLM_LAUNCHER_PID`` naming this process (the rank stops once it is gone: ``runtime.processes.watch_launchers``);
    ``extra`` last."""
    env = dict(os.environ if base is None else base)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    env[LAUNCHER_PID_ENV] = f"{socket.gethostname()}:{os.getpid()}"
    env.update(extra)
    return env


class RankProcess(Protocol):
    """A started rank as ``launch_ranks`` needs it (``subprocess.Popen`` is one): a child PID, which is its process
    group id, and its exit code once reaped."""

    pid: int
    returncode: int | None

    def wait(self) -> int: ...


def start_rank(argv: list[str], env: dict[str, str], cwd: str | os.PathLike | None, log_path: Path) -> RankProcess:
    """Start ``argv`` as a fresh process in a new session, stdout and stderr to ``log_path`` (truncated), holding
    ``runtime.processes.SPAWN_LOCK`` while it starts."""
    with SPAWN_LOCK, open(log_path, "w") as log:
        return subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@dataclass
class LaunchResult:
    """What ``launch_ranks`` saw: per rank, exit code (negative: killed by that signal), output and peak RSS."""

    returncodes: list[int]
    outputs: list[str]
    max_rss_bytes: list[int]
    timed_out: bool
    log_dir: Path | None  # where the rank{i}.log files stay (None: they were temporary)

    @property
    def returncode(self) -> int:
        """The first non-zero exit code of any rank (0 when every rank succeeded)."""
        return next((c for c in self.returncodes if c), 0)

    @property
    def output(self) -> str:
        """Every rank's output, rank by rank, each after a ``--- rank i`` line."""
        return "".join(f"--- rank {i}\n{o}" for i, o in enumerate(self.outputs))


def launch_ranks(
    cmds: Sequence[str] | Sequence[Sequence[str]],
    nproc: int,
    *,
    envs: Sequence[Mapping[str, str]] | None = None,
    base_env: Mapping[str, str] | None = None,
    port: int | None = None,
    cwd: str | os.PathLike | None = None,
    log_dir: str | os.PathLike | None = None,
    timeout_s: float = 600.0,
    grace_s: float = 10.0,
) -> LaunchResult:
    """Run ``nproc`` ranks of a command on loopback and wait for all of them.

    Each rank is started by this module's ``start_rank``, looked up at each call (the test suite replaces it with a
    fork server's, whose ranks are children of this process too).

    Args:
        cmds: one command (argv list) for every rank, or one per rank.
        nproc: number of ranks (world size).
        envs: per-rank variables added last (after the rendezvous variables), or None.
        base_env: the environment the ranks start from (default ``os.environ``).
        port: MASTER_PORT (default: ``free_port()``).
        cwd: working folder of the ranks.
        log_dir: keep each rank's output in ``log_dir/rank{i}.log`` (default: a temporary folder, removed).
        timeout_s: seconds before every rank still running is killed (``LaunchResult.timed_out``).
        grace_s: seconds the other ranks get to exit by themselves after one fails, before they are killed.

    Returns:
        LaunchResult (exit codes, outputs, peak RSS per rank).

    Raises:
        ValueError: ``cmds`` or ``envs`` do not have one entry per rank.
    """
    per_rank = [list(c) for c in cmds] if cmds and not isinstance(cmds[0], str) else [list(cmds)] * nproc
    if len(per_rank) != nproc or (envs is not None and len(envs) != nproc):
        raise ValueError(f"{nproc} ranks need one command (or {nproc}) and {nproc} environments")
    port = free_port() if port is None else port
    with tempfile.TemporaryDirectory(prefix="growlm-ranks-") as scratch:
        logs = Path(log_dir) if log_dir is not None else Path(scratch)
        logs.mkdir(parents=True, exist_ok=True)
        procs: list[RankProcess] = []
        try:
            for r in range(nproc):
                env = rank_env(r, nproc, port, base_env, **dict(envs[r] if envs else {}))
                procs.append(start_rank(per_rank[r], env, cwd, logs / f"rank{r}.log"))
            codes, rss, timed_out = wait_procs(procs, timeout_s, grace_s)
        finally:
            for p in procs:  # an exception (KeyboardInterrupt) while waiting: leave no rank behind
                if p.returncode is None:
                    kill_group(p.pid)
                    p.wait()
        outputs = [(logs / f"rank{r}.log").read_text(errors="replace") for r in range(nproc)]
    return LaunchResult(codes, outputs, rss, timed_out, Path(log_dir) if log_dir is not None else None)
