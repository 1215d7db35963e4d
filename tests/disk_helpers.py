"""A small disk for the disk-full tests: a tmpfs of a given size mounted on a test's folder."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_disk(folder: Path, size_bytes: int, read_only: bool = False) -> Iterator[Path]:
    """Mount a tmpfs of ``size_bytes`` (rounded up to KiB; ``read_only``: mounted read-only) on ``folder`` for the
    block, then unmount it. Skips the test, saying why, where this process may not mount one (it needs root or
    CAP_SYS_ADMIN, as CI has)."""
    folder.mkdir(parents=True, exist_ok=True)
    size = f"size={-(-size_bytes // 1024)}k" + (",ro" if read_only else "")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", size, "tmpfs", str(folder)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill ({(r.stderr or r.stdout).strip()}): needs root or "
                    "CAP_SYS_ADMIN")  # fmt: skip
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def tree_bytes(folder: Path, page: int = 4096) -> int:
    """What ``folder``'s files take on a tmpfs: each file's size rounded up to whole pages."""
    return sum(-(-p.stat().st_size // page) * page for p in folder.rglob("*") if p.is_file())
