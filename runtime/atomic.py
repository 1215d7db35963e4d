"""Write-to-temp-then-rename: the one way growlm writes a file or a folder that a reader may open.

A reader (a resuming run, ``growlm-eval``, a second rank) sees either the old content or the complete new one, never
a half-written file: the bytes go to a temporary sibling in the same folder (same filesystem, so the rename is
atomic), are flushed to disk with ``fsync``, and only then renamed to the target. An existing target is never
replaced unless the caller asks (``overwrite=True``).

Every file and folder made here follows the process umask, as ``open()`` and ``mkdir()`` do: ``tempfile.mkstemp``
creates 0600 files and ``mkdtemp`` 0700 folders, and some libraries write through such temporary files (a
``model.safetensors`` written by ``save_pretrained`` is 0600), so ``commit_dir`` also brings every file in the
folder it commits to ``0666 & ~umask`` (0777 for executables and folders), i.e. 0644 / 0755 under umask 022.

Standard library only.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TMP_PREFIX = ".tmp-"  # temporary siblings: loaders and manifests ignore names starting with it
OLD_PREFIX = ".old-"  # a replaced folder, kept until its successor is in place


def unfinished(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a temporary sibling (``.tmp-<name>``: not yet renamed into place, perhaps half-written
    by a killed process) or a replaced folder (``.old-<name>``): never something to read."""
    return Path(path).name.startswith((TMP_PREFIX, OLD_PREFIX))


def current_umask() -> int:
    """The process umask (e.g. 0o022), read without changing it where Linux allows (``/proc/self/status``)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # portable fallback: set and put back
    os.umask(mask)
    return mask


def mode_for(path: str | os.PathLike, *, umask: int | None = None) -> int:
    """The permission bits ``open()``/``mkdir()`` would have given ``path``: 0777 & ~umask for folders and
    executable files, 0666 & ~umask for other files."""
    mask = current_umask() if umask is None else umask
    st = os.stat(path)
    full = 0o777 if (os.path.isdir(path) or st.st_mode & 0o111) else 0o666
    return full & ~mask


def fix_mode(path: str | os.PathLike, *, umask: int | None = None) -> None:
    """chmod ``path`` to ``mode_for(path)`` (undoes the 0600/0700 of ``tempfile``)."""
    os.chmod(path, mode_for(path, umask=umask))


def _fsync_dir(folder: Path) -> None:
    """fsync a folder so a rename in it is durable (no-op where folders cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _place(tmp: Path, path: Path, overwrite: bool) -> None:
    """Rename ``tmp`` to ``path``; without ``overwrite`` an existing ``path`` raises FileExistsError (checked
    atomically with a hard link where the filesystem has them)."""
    if overwrite:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)  # fails if path exists, atomically
    except FileExistsError:
        raise FileExistsError(f"{path} already exists; refusing to overwrite it") from None
    except OSError:  # no hard links here: check, then rename
        if os.path.lexists(path):
            raise FileExistsError(f"{path} already exists; refusing to overwrite it") from None
        os.rename(tmp, path)
        return
    os.unlink(tmp)


@contextmanager
def atomic_path(path: str | os.PathLike, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write the file into (``torch.save(obj, tmp)``, a library's
    ``save(tmp)``, ...); when the block ends without an exception the file is fsynced, given the umask's mode
    and renamed to ``path``. On an exception the temporary file is removed and ``path`` is untouched.

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is False (checked when the block ends; the temporary
            file is removed).
    """
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}.", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        fix_mode(tmp)
        _place(tmp, path, overwrite)
        _fsync_dir(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_bytes(path: str | os.PathLike, data: bytes, *, overwrite: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically (see ``atomic_path``); returns ``path``.

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is False.
    """
    with atomic_path(path, overwrite=overwrite) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: str | os.PathLike, text: str, *, overwrite: bool = False, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (see ``atomic_path``); returns ``path``.

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is False.
    """
    return write_bytes(path, text.encode(encoding), overwrite=overwrite)


def write_json(path: str | os.PathLike, obj: Any, *, overwrite: bool = False, indent: int | None = 2) -> Path:
    """Write ``obj`` as JSON (``indent`` spaces, newline-terminated) to ``path`` atomically; returns ``path``.

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is False.
        TypeError: ``obj`` is not JSON-serialisable (nothing is written).
    """
    return write_text(path, json.dumps(obj, indent=indent) + "\n", overwrite=overwrite)


def temp_sibling(target: str | os.PathLike) -> Path:
    """The fixed temporary name ``.tmp-<name>`` beside ``target`` (known to every rank of a run)."""
    target = Path(target)
    return target.with_name(f"{TMP_PREFIX}{target.name}")


def fresh_dir(target: str | os.PathLike, *, unique: bool = False) -> Path:
    """An empty temporary folder beside ``target`` to build it in, with the umask's mode.

    Args:
        target: the folder that ``commit_dir`` will create.
        unique: a new ``.tmp-<name>.<random>`` folder (several writers of the same target at once) instead of the
            fixed ``.tmp-<name>``, which is emptied first (what a crashed earlier run left there is removed).
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if unique:
        tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{target.name}.", dir=target.parent))
    else:
        tmp = temp_sibling(target)
        if os.path.lexists(tmp):
            shutil.rmtree(tmp) if tmp.is_dir() and not tmp.is_symlink() else tmp.unlink()
        tmp.mkdir()
    fix_mode(tmp)
    return tmp


_SYNC_THREADS = 8  # fsyncs in flight at once: the disk merges their cache flushes (one at a time, each waits its own)


def _fsync_path(path: str) -> None:
    """fsync one file or folder (a folder that cannot be opened, e.g. on Windows, is skipped: ``_fsync_dir``)."""
    if os.path.isdir(path):
        _fsync_dir(Path(path))
        return
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def sync_tree(folder: str | os.PathLike, *, umask: int | None = None) -> None:
    """fsync every file and folder under ``folder`` and give each the umask's mode (``fix_mode``).

    The modes are set first, and only where they differ (a chmod dirties the inode again, so it would need another
    journal commit), then every fsync is issued from ``_SYNC_THREADS`` threads at once: each fsync ends with a disk
    cache flush, and concurrent flushes are merged (one after another, a few hundred files wait for as many)."""
    mask = current_umask() if umask is None else umask
    paths = [os.fspath(folder)]
    for root, dirs, files in os.walk(folder):
        paths += [os.path.join(root, name) for name in (*dirs, *files)]
    paths = [p for p in paths if not os.path.islink(p)]
    for p in paths:
        want = mode_for(p, umask=mask)
        if os.stat(p).st_mode & 0o7777 != want:
            os.chmod(p, want)
    with ThreadPoolExecutor(max_workers=_SYNC_THREADS, thread_name_prefix="growlm-sync") as pool:
        list(pool.map(_fsync_path, paths))  # re-raises the first error


def commit_dir(tmp: str | os.PathLike, target: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Make the finished folder ``tmp`` the folder ``target``: sync it (``sync_tree``), then rename it.

    With ``overwrite`` an existing ``target`` is first renamed to ``.old-<name>.<random>``, the new folder put in
    place, and only then the old one deleted, so at every instant either the old or the new folder is complete.

    Returns:
        ``target``.

    Raises:
        FileExistsError: ``target`` exists and ``overwrite`` is False (``tmp`` is left for the caller).
    """
    tmp, target = Path(tmp), Path(target)
    sync_tree(tmp)
    old = None
    if os.path.lexists(target):
        if not overwrite:
            raise FileExistsError(f"{target} already exists; refusing to overwrite it")
        old = target.with_name(f"{OLD_PREFIX}{target.name}.{uuid.uuid4().hex[:8]}")
        os.rename(target, old)
    os.rename(tmp, target)
    _fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
    return target


@contextmanager
def atomic_dir(target: str | os.PathLike, *, overwrite: bool = False, unique: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary folder (``fresh_dir``) to build ``target`` in; commit it (``commit_dir``) when the
    block ends without an exception, delete it otherwise (``target`` then stays as it was).

    Raises:
        FileExistsError: ``target`` exists and ``overwrite`` is False (when the block ends).
        OSError: the block's write failed (``write_error``: torch's writer's RuntimeError is raised as the OSError
            behind it, e.g. ENOSPC, chained to it).
    """
    tmp = fresh_dir(target, unique=unique)
    try:
        yield tmp
        commit_dir(tmp, target, overwrite=overwrite)
    except BaseException as e:
        failed = write_error(e, tmp) if isinstance(e, Exception) else None  # read while tmp still holds the space
        shutil.rmtree(tmp, ignore_errors=True)
        if failed is not None and failed is not e:  # torch's writer's RuntimeError: raised as the OSError behind it
            raise failed from e
        raise


def check_replaceable(
    out: Path,
    *,
    what: str,
    marker: str,
    owned: Callable[[Path], bool],
    foreign: str,
    fix: str,
    error: type[Exception],
) -> None:
    """Refuse to let ``--overwrite`` replace ``out`` unless growlm wrote it: the one rule of every growlm command
    that replaces a folder (growlm-prepare's token folder, growlm-grow's checkpoint and export).

    ``out`` may be replaced when it is missing, an empty folder, or a folder holding the writer's ``marker`` and
    nothing but entries for which ``owned(entry)`` is true. A user's folder, or one a user added files to, is never
    deleted.

    Args:
        what: the kind of folder, for the messages ("a growlm export").
        foreign: the entries that are not the writer's, for the message ("files an export does not write").
        fix: the message's last clause: what the user can do instead.
        error: the exception type the calling command reports with exit status 2.

    Raises:
        error: ``out`` is a file or a link, has no ``marker``, or holds entries the writer did not write (up to five
            named).
    """
    if not os.path.lexists(out):
        return
    if out.is_symlink() or not out.is_dir():
        raise error(f"--overwrite: {out} is not {what}; refusing to replace it; {fix}")
    entries = list(out.iterdir())
    if not entries:
        return
    if not (out / marker).is_file():
        raise error(f"--overwrite: {out} is not {what} (no {marker}); refusing to delete it; {fix}")
    other = sorted(e.name for e in entries if not owned(e))
    if other:
        shown = ", ".join(other[:5]) + (", ..." if len(other) > 5 else "")
        raise error(f"--overwrite: {out} holds {foreign} ({shown}); refusing to delete them; {fix}")


TORCH_WRITER_FAILURES = ("inline_container", "PytorchStreamWriter", "iostream error", "file write failed")
NOT_ENOUGH_SPACE = "Not enough disk space"  # how ``datasets`` refuses to build where its size estimate does not fit
NEARLY_FULL_BYTES = 16 * 2**20  # free bytes under which a failed write is taken for a full disk


def write_error(err: BaseException, folder: str | os.PathLike) -> OSError | None:
    """The OSError behind a failed write into ``folder``, or None when ``err`` is no write failure. Follows the
    causes and contexts libraries wrap it in. Besides an OSError itself: ``datasets``' "Not enough disk space" (an
    OSError without an errno) as ENOSPC; a Rust writer's error (safetensors' "I/O error: No space left on device
    (os error 28)") as the errno it names; torch's file writer, which reports a short write (a full disk, a quota)
    as a RuntimeError ("[enforce fail at inline_container.cc] unexpected pos ...", "basic_ios::clear: iostream
    error"), as ENOSPC when ``folder``'s filesystem has (nearly) no space left for this user (under
    ``NEARLY_FULL_BYTES`` or 1% of it), else as EIO with torch's first line. Read it before removing what the
    write left: that holds the space."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:  # a chain may loop back on itself
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno is None and str(err).startswith(NOT_ENOUGH_SPACE):
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if isinstance(err, OSError):
            return err
        rust = re.search(r"\(os error (\d+)\)", str(err))  # Rust writers (safetensors, tokenizers) name the errno
        if rust:
            return OSError(int(rust.group(1)), os.strerror(int(rust.group(1))))
        if isinstance(err, RuntimeError) and any(k in str(err) for k in TORCH_WRITER_FAILURES):
            try:  # the folder the write left may be gone already: its filesystem is its nearest parent's
                where = next(p for p in (Path(folder), *Path(folder).parents) if p.exists())
                usage = shutil.disk_usage(where)
                full = usage.free < max(NEARLY_FULL_BYTES, usage.total // 100)
            except OSError:
                full = False
            if full:
                return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return OSError(errno.EIO, f"the file writer failed ({str(err).splitlines()[0][:200]})")
        err = err.__cause__ or err.__context__
    return None


def failure_reason(err: OSError) -> str:
    """Why a write failed, as the start of a one-line message: "no space left on device", "disk quota exceeded",
    else the error's own text (e.g. "Read-only file system")."""
    if err.errno == errno.ENOSPC:
        return "no space left on device"
    if err.errno == errno.EDQUOT:
        return "disk quota exceeded"
    return err.strerror or str(err)


def write_failed_message(err: OSError, what: str, target: str | os.PathLike, kept: str) -> str:
    """The one line of a write that failed with ``err`` (``write_error``): why (``failure_reason``), ``what`` was
    written into ``target``, what was ``kept`` (e.g. "nothing was left there"), and the fix."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free space there, or choose a folder on another disk, and run it again"
    else:
        fix = "choose a folder you can write, and run it again"
    return f"{failure_reason(err)} while writing {what} {target}; {kept}: {fix}"
