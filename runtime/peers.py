"""Which rank stopped answering: a heartbeat every rank keeps in the rendezvous store, read when a collective fails.

A collective that fails because a peer is gone (SIGKILL, a crashed node: gloo's "Connection closed by peer") or
silent (SIGSTOP, a hang, a lost network: the group's timeout) names no rank, and its traceback is long. So every rank
of a multi-rank job bumps a counter in the rendezvous store, ``growlm/heartbeat/<rank>``, once per ``BEAT_S`` from
a daemon thread (``start``). When a collective fails, ``silent_ranks`` reads every counter twice, ``LISTEN_S``
apart, and names the ranks whose counter did not move (a rank that ends on its own says so first, ``leave``), and
``lost_rank_message`` makes the one line a job ends with, naming what the job was doing (``doing``). A stopped
process's threads stop with it and a killed one's end with it, so both read as silent; a rank busy in a long
computation still beats (torch releases the GIL). Every rank also writes its host and PID (``PROC``): a silent rank
on the reader's host whose process is gone ended without a word, as the kernel's out-of-memory killer (a SIGKILL)
ends one, and is named as killed, with the host's out-of-memory kill count when it rose during the job. A rank that
fails with its own reason while the others wait for it (a checkpoint write on a full disk) leaves that reason in the
store first (``tell``), so they end with it (``told``).

The thread and the reader each open their own client of the store (``torch.distributed.TCPStore`` at MASTER_ADDR:
MASTER_PORT, where every launcher growlm supports serves the rendezvous store: the deepspeed launcher, torchrun,
mpirun through ``runtime.dist``), never the process group's own: a client blocks while another thread waits on it
(``runtime.collectives.all_gather_object_within`` waits there), which would stop a healthy rank's beat. The store
lives in global rank 0's process: when rank 0 is gone, nothing can be read, and the line says rank 0 is gone.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from growlm.runtime import collectives
from growlm.runtime.processes import KILLED_BY_KERNEL, oom_kill_count, process_gone

BEAT_S = 1.0  # seconds between a rank's heartbeats
LISTEN_S = 4.0  # seconds the reader watches the counters: a rank that beat in none of them is silent
KEY = "growlm/heartbeat/{rank}"
LEFT = "growlm/left/{rank}"  # set by a rank that ends on its own (``leave``): not silent, it said goodbye
SAID = "growlm/said/{topic}"  # the first rank's one-line reason for failing ``topic`` (``tell``), before it leaves
PROC = "growlm/process/{rank}"  # HOST:PID of the rank's process: a silent rank whose process is gone was killed

_STATE: dict[str, Any] = {"stop": None, "thread": None, "rank": 0, "world": 1, "doing": "training", "oom_kills": None}


def _reachable(timeout_s: float = 1.0) -> bool:
    """Whether the rendezvous store's port still accepts a connection: asked with a plain socket first, because a
    store client that cannot connect logs a C++ error before it raises, which would bury the one line."""
    try:
        with socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), timeout_s):
            return True
    except (OSError, KeyError, ValueError):
        return False


def _client(timeout_s: float) -> Any:
    """A new client of the rendezvous store at MASTER_ADDR:MASTER_PORT (raises when it cannot be reached; check
    ``_reachable`` first)."""
    if not _reachable():
        raise ConnectionError("the rendezvous store does not answer")
    return collectives.store_client(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout_s)


def _beat(rank: int, stop: threading.Event) -> None:
    """The heartbeat thread: bump this rank's counter every BEAT_S until ``stop`` is set or the store is gone."""
    try:
        store = _client(30.0)
        store.set(PROC.format(rank=rank), f"{socket.gethostname()}:{os.getpid()}")
        while not stop.is_set():
            store.add(KEY.format(rank=rank), 1)
            stop.wait(BEAT_S)
    except Exception:  # the store is gone (rank 0 ended): nothing left to beat into, and the job is ending
        return


def start(rank: int, world_size: int) -> bool:
    """Start this rank's heartbeat thread (a daemon; ``stop`` ends it). Nothing for a world of one, or when
    MASTER_ADDR / MASTER_PORT are not set. Returns whether it started."""
    stop()
    _STATE.update(rank=rank, world=world_size, doing="training", oom_kills=oom_kill_count())  # a new job
    if world_size < 2 or not os.environ.get("MASTER_ADDR") or not os.environ.get("MASTER_PORT"):
        return False
    event = threading.Event()
    thread = threading.Thread(target=_beat, args=(rank, event), name="growlm-heartbeat", daemon=True)
    thread.start()
    _STATE.update(stop=event, thread=thread)
    return True


def stop() -> None:
    """End the heartbeat thread, if one runs (it ends within one beat; not waited for)."""
    if _STATE["stop"] is not None:
        _STATE["stop"].set()
    _STATE.update(stop=None, thread=None)


def leave() -> None:
    """Say in the store that this rank ends on its own (it closes its process group: done, or failing with its own
    message), so the others do not report it as silent; then ``stop``. Nothing when it does not beat; a store
    that is gone already (rank 0 ended first) is not waited for."""
    if running():
        try:
            _client(2.0).set(LEFT.format(rank=_STATE["rank"]), "1")
        except Exception:
            pass
    stop()


@contextmanager
def doing(what: str) -> Iterator[None]:
    """For the block, what the job does, as ``lost_rank_message`` names it when a peer is lost ("training" else); an
    error that leaves the block leaves it named."""
    before, _STATE["doing"] = _STATE["doing"], what
    yield
    _STATE["doing"] = before  # not reached on an error: the line after it names what failed


def tell(topic: str, line: str) -> str:
    """Leave this rank's one-line reason for failing ``topic`` (e.g. "checkpoint global_step4") in the store, unless
    another rank told one first, and return the one the store holds: the first failure's, which every rank then ends
    with (a peer whose collective fails because this rank left reads it with ``told``; one whose write fails next,
    because the folder was removed under it, ends with the cause, not its consequence). ``line`` itself when this
    process does not beat or the store is gone."""
    if not running():
        return line
    try:
        return _client(2.0).compare_set(SAID.format(topic=topic), "", line).decode()
    except Exception:
        return line


def told(topic: str) -> str | None:
    """The first reason a rank gave for failing ``topic`` (``tell``), or None: none did, this process does not beat,
    or the store is gone (it lives in global rank 0's process)."""
    if not running():
        return None
    try:
        store, key = _client(5.0), SAID.format(topic=topic)
        return store.get(key).decode() if store.check([key]) else None
    except Exception:
        return None


def running() -> bool:
    """Whether this process beats (a multi-rank job whose group ``runtime.dist.init_distributed`` started)."""
    return _STATE["thread"] is not None


def silent_ranks(listen_s: float = LISTEN_S) -> tuple[list[int], list[int]] | None:
    """The other ranks that left (``leave``: they ended on their own, with their own message) and those whose
    heartbeat did not move in ``listen_s`` seconds without leaving, each in rank order; None when the store cannot
    be reached (it lives in global rank 0's process: rank 0 is gone). Blocks up to ``listen_s``: not at all when
    some rank left."""
    me, world = _STATE["rank"], _STATE["world"]
    others = [r for r in range(world) if r != me]
    try:
        store = _client(min(10.0, listen_s + 5))
        left = [r for r in others if store.check([LEFT.format(rank=r)])]
        if left:
            return left, []
        first = {r: store.add(KEY.format(rank=r), 0) for r in others}
        time.sleep(listen_s)
        second = {r: store.add(KEY.format(rank=r), 0) for r in others}
    except Exception:
        return None
    return [], [r for r in others if second[r] == first[r]]


def rank_process(rank: int) -> tuple[str, int] | None:
    """(host, PID) of ``rank``'s process as it wrote it into the store when it started beating; None when it did
    not or the store cannot be read."""
    try:
        store, key = _client(5.0), PROC.format(rank=rank)
        if not store.check([key]):
            return None
        host, _, pid = store.get(key).decode().rpartition(":")
        return host, int(pid)
    except Exception:
        return None


def killed_ranks(silent: list[int]) -> list[int]:
    """The ``silent`` ranks whose process has ended (``runtime.processes.process_gone``: on this host, no such process
    or a zombie): gone without a word (``leave``), as a SIGKILL ends a process, not stopped or hung. A rank on another
    host cannot be told from here and is not listed."""
    gone = []
    for r in silent:
        where = rank_process(r)
        if where is not None and process_gone(*where):
            gone.append(r)
    return gone


def kernel_kill_note() -> str:
    """Why a rank whose process is gone was most likely killed: the kernel's out-of-memory kills here
    (``runtime.processes.oom_kill_count``) since this job started, named when they rose."""
    before, now = _STATE["oom_kills"], oom_kill_count()
    if before is not None and now is not None and now > before:
        rose = now - before
        return f"killed by the kernel, out of memory (this host's out-of-memory kills rose by {rose} during the job)"
    return f"{KILLED_BY_KERNEL} (its process ended without a word, as a SIGKILL ends it)"


def lost_rank_message(resume: str | None, listen_s: float = LISTEN_S) -> str | None:
    """The one line a rank ends with after a collective failed (``silent_ranks``), or None when every other rank
    still answers or this process does not beat (the failure is something else: the caller reports it as it is).
    A silent rank whose process is gone (``killed_ranks``) is named as killed by the kernel (``kernel_kill_note``).

    Args:
        resume: the ``--resume`` argument that continues the job from its last complete checkpoint, or None.
    """
    if not running():
        return None
    found = silent_ranks(listen_s)
    me, during = _STATE["rank"], _STATE["doing"]
    then = f"resume from the last complete checkpoint with --resume {resume}" if resume else "run it again"
    killed = killed_ranks(found[1]) if found is not None else []
    if found is None:
        who, why = "rank 0 is gone (the rendezvous store it serves no longer answers)", "see rank 0's output"
    elif found[0]:
        plural = "s" if len(found[0]) > 1 else ""
        who, why = f"rank{plural} {', '.join(map(str, found[0]))} ended", "see its own message"
    elif killed:
        plural = "s" if len(killed) > 1 else ""
        who = f"rank{plural} {', '.join(map(str, killed))} {'were' if plural else 'was'} {kernel_kill_note()}"
        why = (
            "give it less to hold (a smaller model or micro batch, --activation_checkpointing, a higher ZeRO stage, "
            "more ranks on more hosts)"
        )
    elif found[1]:
        plural = "s" if len(found[1]) > 1 else ""
        who = f"rank{plural} {', '.join(map(str, found[1]))} stopped answering (no heartbeat for {listen_s:.0f} s)"
        why = "find out why on its node (it was killed or stopped, or its node or network is lost)"
    else:
        return None
    return f"rank {me}: {who} during {during}; the job ends here: {why}, then {then}"
