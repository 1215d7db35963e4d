"""One writer per folder: an exclusive, non-blocking ``fcntl.flock`` on a lock file, held for a process's lifetime.

The lock is released when its file is closed or the process ends, however it ends (a SIGKILL included), so a
crashed holder never leaves a stale lock behind. The holder writes who it is (pid, host, start time, command) into
the file, so a refused second writer can name it. The file itself is left in place: deleting a lock file another
process may just have opened would let two processes hold "the" lock at once.

On a network filesystem flock works across hosts where the filesystem supports it (NFS maps it to a byte-range
lock), so one process of a multi-node run (global rank 0) takes the lock, not one per node. Standard library only.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
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
        f.seek(0)
        holder = f.read().strip().splitlines()
        f.close()
        raise LockHeldError(path, holder[0] if holder else "unknown") from None
    except BaseException:
        f.close()
        raise
    f.seek(0)
    f.truncate()
    f.write(describe_self() + "\n")
    f.flush()
    return f
