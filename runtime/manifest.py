"""A checkpoint manifest: size and sha256 of every file in a tag folder, so a truncated, missing or mixed-in file is
found before anything is loaded from it.

``growlm_manifest.json`` is written last into a finished tag folder (before the folder is renamed into place) and
lists every other file under it by relative path. ``verify_manifest`` re-hashes the listed files; files that are not
listed (added later by other tools) are ignored. Standard library only (and runtime.atomic).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from growlm.runtime.atomic import TMP_PREFIX, write_text

MANIFEST_FILE = "growlm_manifest.json"
MANIFEST_FORMAT = "growlm-manifest-v1"
_CHUNK_BYTES = 1 << 22


class ManifestError(ValueError):
    """A tag folder whose files do not match its manifest; the message names the file and what differs."""


def file_sha256(path: Path) -> str:
    """SHA-256 hex digest of a file, read in chunks (memory bounded whatever the file size)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(tag_dir: str | os.PathLike, known: dict[str, tuple[int, str]] | None = None) -> Path:
    """Hash every file under ``tag_dir`` (except the manifest) and write ``growlm_manifest.json`` atomically.

    ``known``: relative path -> (bytes, sha256) of files hashed while they were written (growth.offline.universal.save);
    such a file is not read again when its size still matches."""
    tag_dir, known = Path(tag_dir), known or {}
    files = {}
    for p in sorted(tag_dir.rglob("*")):
        if p.is_file() and p.name != MANIFEST_FILE and not p.name.startswith(TMP_PREFIX):
            rel, size = p.relative_to(tag_dir).as_posix(), p.stat().st_size
            digest = known[rel][1] if rel in known and known[rel][0] == size else file_sha256(p)
            files[rel] = {"bytes": size, "sha256": digest}
    out = tag_dir / MANIFEST_FILE
    return write_text(out, json.dumps({"format": MANIFEST_FORMAT, "files": files}, indent=1), overwrite=True)


def hash_files(tag_dir: str | os.PathLike, rels: list[str]) -> dict[str, tuple[int, str]]:
    """Size in bytes and sha256 of each file ``rels`` (paths relative to ``tag_dir``), reading each once: the share
    of a save's files one rank hashes (``write_manifest(known=...)`` takes the result)."""
    tag_dir = Path(tag_dir)
    return {rel: ((tag_dir / rel).stat().st_size, file_sha256(tag_dir / rel)) for rel in rels}


def read_manifest(tag_dir: str | os.PathLike) -> dict[str, dict] | None:
    """The files a tag folder's manifest lists (relative path -> {"bytes": int, "sha256": str}), reading nothing
    else; None when the folder has no manifest (written before manifests existed).

    Raises:
        ManifestError: the manifest is not valid JSON, lacks its file list, or has another format.
    """
    path = Path(tag_dir) / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
        files = doc["files"]
        if not isinstance(files, dict):
            raise TypeError("'files' is not an object")
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise ManifestError(f"{path} is damaged ({e}); the checkpoint cannot be verified") from e
    if doc.get("format") != MANIFEST_FORMAT:
        raise ManifestError(f"{path}: format {doc.get('format')!r}, expected {MANIFEST_FORMAT!r}")
    return files


def check_sizes(tag_dir: str | os.PathLike, files: dict[str, dict], rels: list[str] | None = None) -> None:
    """Every listed file (or those of ``rels``) present at its listed size; reads no file's content (a stat each).

    Raises:
        ManifestError: a listed file is missing or of another size (truncated or replaced).
    """
    tag_dir = Path(tag_dir)
    for rel in files if rels is None else rels:
        want, p = files[rel], tag_dir / rel
        if not p.is_file():
            raise ManifestError(f"{p} is missing; the checkpoint {tag_dir} is incomplete (its manifest lists it)")
        size = p.stat().st_size
        if size != want["bytes"]:
            raise ManifestError(
                f"{p} has {size} bytes, the manifest says {want['bytes']}: the file is truncated or was replaced"
            )


def verify_files(
    tag_dir: str | os.PathLike, files: dict[str, dict], rels: list[str] | None = None, *, workers: int = 1
) -> None:
    """Check the listed files ``rels`` (default: all of ``files``, the manifest's list) by size and sha256, reading
    each once: one rank's share of a resume's check. ``workers`` threads hash files side by side, largest first
    (hashlib releases the GIL): one per core the caller may use.

    Raises:
        ManifestError: a file is missing, of another size, or of another content (damaged, or copied in from
            another checkpoint); the message names it.
    """
    tag_dir = Path(tag_dir)
    rels = list(files) if rels is None else rels
    check_sizes(tag_dir, files, rels)
    largest_first = sorted(rels, key=lambda rel: -files[rel]["bytes"])
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(rels))), thread_name_prefix="growlm-hash") as pool:
        digests = dict(zip(largest_first, pool.map(lambda rel: file_sha256(tag_dir / rel), largest_first), strict=True))
    for rel in rels:
        if digests[rel] != files[rel]["sha256"]:
            raise ManifestError(
                f"{tag_dir / rel} does not match its sha256 in {tag_dir / MANIFEST_FILE}: the file is damaged or comes "
                "from another checkpoint"
            )


def verify_manifest(tag_dir: str | os.PathLike) -> bool:
    """Check the files of ``tag_dir`` against its manifest in this one process (growlm-grow, growlm-eval; a resume
    splits the work between its ranks: ``runtime.checkpoint.verify_shares``), hashing on every core this process may
    use. Returns False when there is no manifest (nothing to check: a checkpoint written before manifests existed),
    True when every listed file matches.

    Raises:
        ManifestError: the manifest is unreadable, or a listed file is missing, of another size (truncated) or of
            another content (damaged, or copied in from another checkpoint).
    """
    files = read_manifest(tag_dir)
    if files is None:
        return False
    verify_files(tag_dir, files, workers=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    return True


class Verification:
    """``verify_manifest(tag_dir)`` started on a background thread, so that the hashing (hashlib and file reads
    release the GIL) overlaps the caller's own start: growlm-grow starts it before it imports torch (about two
    seconds of one core), and ``runtime.checkpoint.open_checkpoint`` takes its verdict (``result``) instead of
    hashing the folder again. Nothing is loaded from the folder before ``result`` has returned.

    Args:
        tag_dir: the tag folder whose manifest is checked.
    """

    def __init__(self, tag_dir: str | os.PathLike) -> None:
        self.tag_dir = Path(tag_dir)
        self._verdict: bool | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="growlm-verify", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._verdict = verify_manifest(self.tag_dir)
        except BaseException as e:  # noqa: BLE001 (raised again, in the caller's thread, by result())
            self._error = e

    def covers(self, tag_dir: str | os.PathLike) -> bool:
        """Whether this check is of ``tag_dir`` (the same folder, however named)."""
        try:
            return os.path.samefile(self.tag_dir, tag_dir)
        except OSError:
            return False

    def result(self) -> bool:
        """Wait for the check; ``verify_manifest``'s return value (False: no manifest).

        Raises:
            ManifestError: see ``verify_manifest``; OSError: a file could not be read.
        """
        self._thread.join()
        if self._error is not None:
            raise self._error
        return bool(self._verdict)
