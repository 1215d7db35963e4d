"""One writer per folder: an exclusive, non-blocking ``fcntl.flock`` on a lock file, held for a process's lifetime.

The lock is released when its file is closed or the process ends, however it ends (a SIGKILL included), so a
crashed holder never leaves a stale lock behind. The holder writes who it is (pid, host, start time, command) into
the file, so a refused second writer can name it. A run folder's lock file is left in place. An
output's writer lock (``output_lock``: one writer of a folder or file set a command builds beside it) is removed by
its holder when the write ends, still holding it; a process that took the lock of a file removed meanwhile sees that
the path no longer names the file it locked and takes the new one, so two writers never hold "the" lock at once.

On a network filesystem flock works across hosts where the filesystem supports it (NFS maps it to a byte-range
lock), so one process of a multi-node run (global rank 0) takes the lock, not one per node. Callers that share an
output rather than compete for it (prepare it if missing, else use it) wait their turn on a separate queue lock
(``queue_lock``) and then take the writer lock. Standard library only.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


class LockHeldError(Exception):
    """The lock file is held by another process.

    Attributes:
        path: the lock file.
        holder: what the holder wrote into it (``describe_self`` of that process), or "unknown" when it wrote nothing.
    """

    def __init__(self, path: Path, holder: str) -> None:
        super().__init__(f"{path} is held by {holder}")
        self.path, self.holder = path, holder


def describe_self() -> str:
    """This process, as the holder of a lock names itself: ``pid N on host H since YYYY-mm-dd HH:MM:SS (PROG)``."""
    prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    since = time.strftime("%Y-%m-%d %H:%M:%S")
    return f"pid {os.getpid()} on host {socket.gethostname()} since {since} ({prog})"


def _holder(f: IO[str], tries: int = 50, pause_s: float = 0.01) -> str:
    """The first line of the held lock file ``f`` (its holder's ``describe_self``). A holder writes it right after it
    takes the lock, so an empty file is read again, ``tries`` times ``pause_s`` seconds apart; "unknown" after."""
    for i in range(tries):
        f.seek(0)
        lines = f.read().strip().splitlines()
        if lines:
            return lines[0]
        if i + 1 < tries:
            time.sleep(pause_s)
    return "unknown"


def hold_lock(path: str | os.PathLike) -> IO[str]:
    """Take the lock file ``path`` (created if missing; fcntl.flock, exclusive, not waiting) and write
    ``describe_self()`` into it. Returns the open file, which must stay referenced for as long as the lock is to be
    held (closing it, or the process ending, releases the lock).

    Raises:
        LockHeldError: another process (or another open file of this one) holds it; names the holder.
        OSError: the lock file cannot be created or opened (a missing folder, permissions).
    """
    path = Path(path)
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(f)
        f.close()
        raise LockHeldError(path, holder) from None
    except BaseException:
        f.close()
        raise
    f.seek(0)
    f.truncate()
    f.write(describe_self() + "\n")
    f.flush()
    return f


def output_lock_path(target: str | os.PathLike) -> Path:
    """The writer lock of the output ``target``: the hidden file ``.<name>.lock`` beside it, e.g.
    ``runs/g/.ckpt.lock`` for ``runs/g/ckpt`` (outside the output, so it never mixes into what is written). The
    parent folder is resolved (links followed), so every spelling of one output names the same lock file."""
    target = Path(os.path.abspath(target))
    return target.parent.resolve() / f".{target.name}.lock"


def _same_file(f: IO[str], path: Path) -> bool:
    """Whether the open file ``f`` is still the file named ``path`` (not removed or replaced since it was opened)."""
    try:
        return os.path.samestat(os.fstat(f.fileno()), os.stat(path))
    except FileNotFoundError:
        return False


@contextmanager
def output_lock(target: str | os.PathLike) -> Iterator[Path]:
    """Hold the writer lock of the output ``target`` (``output_lock_path``, through ``hold_lock``: not waiting) for
    the block: one writer of an output at a time, so a second writer is refused before it reads, deletes or writes
    anything of the output. The parent folder is created if missing. When the block ends, however it ends, the lock
    file is removed and released; a SIGKILLed holder leaves the file, which the next writer takes over.

    Yields:
        the lock file's path.

    Raises:
        LockHeldError: another process (or another block of this one) holds the lock; names the holder.
        OSError: the parent folder cannot be created, or the lock file created or opened there.
    """
    path = output_lock_path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        f = hold_lock(path)
        if _same_file(f, path):
            break
        f.close()  # the previous holder removed this file after we opened it: take the new one
    try:
        yield path
    finally:
        try:
            os.unlink(path)  # still held: a process waiting on this file finds it gone and retries
        except FileNotFoundError:
            pass
        f.close()


@contextmanager
def queue_lock(target: str | os.PathLike) -> Iterator[Path]:
    """Wait for, then hold, the queue lock of the output ``target`` for the block: the hidden file
    ``.<name>.queue.lock`` beside it (fcntl.flock, exclusive, waiting). For the callers that want one output to
    exist and may share it (``ensure_*``: two pytest workers, the ranks of a node, two experiments wanting the same
    cached token folder): each takes its turn, looks whether the output is there, and only the first builds it.

    It is a different file from the writer lock (``output_lock``) on purpose: the writer lock never waits, so a
    second user's command writing the same output is refused at once rather than left hanging, while callers who
    asked to share an output queue here and then, one at a time, take the writer lock, which nobody in the queue
    holds. The file stays in place (a waiting process holds it open; removing it would let a newcomer lock a new
    file beside the queue). A holder that is killed releases it with its process.

    Yields:
        the queue lock file's path.

    Raises:
        OSError: the parent folder cannot be created, or the lock file created or opened there.
    """
    target = Path(os.path.abspath(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    path = target.parent.resolve() / f".{target.name}.queue.lock"
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
        yield path


def output_held_message(what: str, target: str | os.PathLike, err: LockHeldError) -> str:
    """The one-line refusal of a second writer of ``target`` (``what``: how the command names it, e.g.
    "output" or "--export_hf"): who holds it, its lock file, that nothing was changed, and the fix."""
    return (
        f"{what} {target} is being written by another process ({err.holder}; lock {err.path}); nothing was changed: "
        "wait for it to end, or choose another output"
    )
