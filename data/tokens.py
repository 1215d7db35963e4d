"""The token-folder format training reads, its one writer and its readers: out_dir/{train.bin, val.bin, meta.json}.

Each .bin is a flat little-endian array of token ids, of the dtype meta.json names (``open_tokens``): uint16 where
the vocabulary has at most 65,536 ids (format growlm-tokens-v1, as every folder before uint32 existed), uint32 above
that (format growlm-tokens-v2: Llama 3's 128,256 ids, Qwen's 151,669), chosen by ``token_dtype``.
meta.json:
    {"format": "growlm-tokens-v1" | "growlm-tokens-v2", "dtype": "uint16" | "uint32" (v2 only),
     "tokenizer": "gpt2" | a description, "vocab_size": V,
     "eot_token_id": id, ["tokenizer_file": "tokenizer.json", "tokenizer_sha256": hex, "eot_token": str,]
     ["special_tokens": {"bos_token": {"token": "<s>", "id": 1}, "eos_token": ..., "unk_token": ..., "pad_token": ...},
     "add_bos_token": bool,] "splits": {"train": {"file": "train.bin", "n_tokens": N, "n_documents": D,
     "sources": [...], "sha256": <of train.bin>}, "val": {...}}}
``special_tokens`` (a model folder's declared special tokens) and ``add_bos_token`` (every document starts with
the bos token) are written by growlm-prepare --tokenizer for a tokenizer that declares them; a folder without them
has no bos before its documents.

``TokenFolderWriter`` is used by growlm-prepare (data/prepare.py) and the small-vocabulary builder
(data/small_vocab.py): everything goes into a temporary sibling of out_dir that is renamed into place only when
complete, so out_dir is either the old folder or the new one, never half of each, and a failure leaves nothing. The
temporary sibling is ``.tmp-<name>``: a writer killed with SIGKILL leaves it (and its lock file), and the next writer
of out_dir, once it holds the writer lock, empties it and builds there.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from contextlib import ExitStack
from pathlib import Path
from typing import BinaryIO

import numpy as np

from growlm.runtime import atomic
from growlm.runtime.atomic import commit_dir, fresh_dir
from growlm.runtime.crash_points import hold_point
from growlm.runtime.lock import LockHeldError, output_held_message, output_lock

CACHE_ENV = "GROWLM_CACHE"


def cache_dir() -> Path:
    """Where growlm keeps folders it prepares itself (the built-in corpus as tokens, the small-vocabulary corpus,
    extra sources): ``$GROWLM_CACHE``, else ``$XDG_CACHE_HOME/growlm``, else ``~/.cache/growlm``. Never inside the
    installed package."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "growlm"


FORMAT = "growlm-tokens-v1"  # uint16 ids: every folder written before uint32 existed, and every small vocabulary
FORMAT_V2 = "growlm-tokens-v2"  # the dtype named in meta.json: uint16 or uint32
DTYPE = np.uint16  # the dtype of a v1 folder
DTYPES = {"uint16": np.dtype(np.uint16), "uint32": np.dtype(np.uint32)}
SPLITS = ("train", "val")


def token_dtype(vocab_size: int) -> np.dtype:
    """The dtype of a token folder's ids for a vocabulary of ``vocab_size`` ids: uint16 up to 65,536 ids (2 bytes a
    token), else uint32 (4 bytes, up to 4,294,967,296 ids).

    Raises:
        ValueError: ``vocab_size`` below 1 or past uint32.
    """
    for dtype in DTYPES.values():
        if 1 <= vocab_size <= np.iinfo(dtype).max + 1:
            return dtype
    raise ValueError(f"vocab_size {vocab_size:,} does not fit growlm's token files (1 to {2**32:,} ids)")


def format_of(dtype: np.dtype) -> str:
    """The meta.json format a folder of ``dtype`` ids is written as: v1 for uint16 (readable by every growlm), v2
    for uint32."""
    return FORMAT if np.dtype(dtype) == np.dtype(DTYPE) else FORMAT_V2


class SplitWriter:
    """Appends token ids of one dtype (``token_dtype``) to one split's .bin file, hashing and counting as it goes."""

    def __init__(self, path: Path, dtype: np.dtype = DTYPE):
        self.path = path
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.n_tokens = 0
        self._sha = hashlib.sha256()
        self._file: BinaryIO = open(path, "wb")  # noqa: SIM115  closed by close()

    def write(self, ids: np.ndarray) -> None:
        """Append ``ids`` (any integer array, shape (n,)). Raises ValueError if an id does not fit the dtype."""
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() > np.iinfo(self.dtype).max):
            raise ValueError(f"token id {ids.max()} does not fit {self.dtype.name} token files")
        data = ids.astype(self.dtype).tobytes()
        self._sha.update(data)
        self._file.write(data)
        self.n_tokens += int(ids.size)

    def close(self) -> None:
        """Close the file (idempotent)."""
        self._file.close()

    def record(self, n_documents: int, sources: list[dict], **extra) -> dict:
        """The split's meta.json record (closes the file): file, n_tokens, n_documents, sources, sha256, extra."""
        self.close()
        rec = {"file": self.path.name, "n_tokens": self.n_tokens, "n_documents": n_documents, "sources": sources}
        return rec | {"sha256": self._sha.hexdigest()} | extra


TOKEN_FOLDER_FILES = frozenset({"meta.json", "tokenizer.json", *(f"{split}.bin" for split in SPLITS)})


def check_replaceable(out_dir: Path) -> None:
    """Refuse to replace ``out_dir`` unless a token-folder writer made it: missing, an empty folder, or a folder
    with its ``meta.json`` (the marker, even a damaged one) and nothing but the files a token folder holds
    (``TOKEN_FOLDER_FILES``). A user's folder, or a token folder a user has added files to, is never deleted
    (the rule: runtime.atomic.check_replaceable).

    Raises:
        FileExistsError: ``out_dir`` is a file or a link, or a folder that is not (only) a token folder.
    """
    atomic.check_replaceable(
        out_dir,
        what="a prepared token folder",
        marker="meta.json",
        owned=lambda entry: entry.name in TOKEN_FOLDER_FILES,
        foreign="files growlm-prepare did not write",
        fix="choose another --out, or move it away yourself",
        error=FileExistsError,
    )


class TokenFolderWriter:
    """Writes a token folder atomically; use as a context manager.

        with TokenFolderWriter(out_dir, overwrite) as w:
            sw = w.split("train"); sw.write(ids); ...
            w.finish(tokenizer="gpt2", vocab_size=50257, eot_token_id=50256, splits={"train": rec, "val": rec})

    ``staging`` is the temporary folder (extra files, e.g. tokenizer.json or a scratch cache, may go there;
    ``scratch`` names folders removed before the rename). On an exception the staging folder is removed and
    out_dir is untouched.

    Raises:
        FileExistsError: out_dir exists and overwrite is False, or it is not a folder a token-folder writer made
            (``check_replaceable``; raised by the constructor, before any work); another process is writing out_dir
            (its writer lock, runtime.lock.output_lock, taken on entering the block and held until it ends; the
            message names the holder, and nothing of out_dir is touched).
    """

    def __init__(
        self,
        out_dir: str | os.PathLike,
        overwrite: bool = False,
        scratch: tuple[str, ...] = (),
        dtype: np.dtype = DTYPE,
    ):
        self.out_dir = Path(out_dir).expanduser().resolve()
        self.overwrite = overwrite
        self.dtype = np.dtype(dtype)  # the ids' dtype (``token_dtype`` of the vocabulary)
        self._check()
        self.scratch = scratch
        self.staging: Path | None = None
        self._done = False
        self._splits: list[SplitWriter] = []
        self._lock: ExitStack | None = None

    def _check(self) -> None:
        if os.path.lexists(self.out_dir) and not self.overwrite:
            raise FileExistsError(
                f"{self.out_dir} already exists; pass overwrite=True (CLI: --overwrite) to replace it, "
                "or choose another --out"
            )
        check_replaceable(self.out_dir)

    def __enter__(self) -> TokenFolderWriter:
        """Take out_dir's writer lock (runtime.lock.output_lock), check out_dir again under it, make the staging
        folder.

        Raises:
            FileExistsError: another process is writing out_dir (its holder named; nothing touched), or out_dir
                appeared meanwhile and may not be replaced.
        """
        self._lock = ExitStack()
        try:
            self._lock.enter_context(output_lock(self.out_dir))
        except LockHeldError as e:
            self._lock = None
            raise FileExistsError(output_held_message("--out", self.out_dir, e)) from None
        try:
            self._check()  # under the lock: no other writer changes out_dir until this one is done
            # .tmp-<name>, the umask's mode: one writer at a time holds the lock, so what a killed writer left there
            # is its alone, emptied and taken over here
            self.staging = fresh_dir(self.out_dir)
        except BaseException:
            self._lock.close()
            raise
        return self

    def split(self, name: str) -> SplitWriter:
        """A writer for staging/<name>.bin."""
        sw = SplitWriter(self.staging / f"{name}.bin", self.dtype)
        self._splits.append(sw)
        return sw

    def finish(self, *, tokenizer: str, vocab_size: int, eot_token_id: int, splits: dict, **extra) -> Path:
        """Write meta.json and rename the folder into place (an old out_dir is removed only after). Returns out_dir."""
        for sw in self._splits:
            sw.close()
        if vocab_size > np.iinfo(self.dtype).max + 1:
            raise ValueError(f"vocab_size {vocab_size:,} does not fit {self.dtype.name} token files")
        meta = {"format": format_of(self.dtype), "dtype": self.dtype.name, "tokenizer": tokenizer} | extra
        meta |= {"vocab_size": vocab_size, "eot_token_id": eot_token_id, "splits": splits}
        (self.staging / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        for name in self.scratch:
            shutil.rmtree(self.staging / name, ignore_errors=True)
        hold_point("tokens.finish")  # test-only (runtime.crash_points): a writer killed before the rename
        commit_dir(self.staging, self.out_dir, overwrite=True)  # an old out_dir is moved aside, then removed
        self._done = True
        return self.out_dir

    def __exit__(self, exc_type, exc, tb) -> None:
        for sw in self._splits:
            sw.close()
        if not self._done and self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def _fix(data_dir: Path) -> str:
    return (
        f"run `growlm-prepare --train ... --val ... --out {data_dir}` (or plain `growlm-prepare` for the built-in "
        "corpus)"
    )


def load_meta(data_dir: str | os.PathLike) -> dict:
    """Read and validate data_dir/meta.json.

    Raises:
        FileNotFoundError: data_dir or its meta.json is missing (the message says which growlm-prepare to run).
        ValueError: meta.json is not UTF-8, not valid JSON (truncated, damaged), not format growlm-tokens-v1 (uint16)
            or growlm-tokens-v2 (uint16 or uint32), or lacks a train/val split.
    """
    data_dir = Path(data_dir)
    fix = _fix(data_dir)
    path = data_dir / "meta.json"
    if not data_dir.is_dir():
        raise FileNotFoundError(f"token directory {data_dir} does not exist; {fix}")
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing, so {data_dir} is not a prepared dataset; {fix}")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        damaged = f"{path} is not UTF-8 text (byte {err.start}: damaged)"
        raise ValueError(f"{damaged}; re-run with --overwrite: {fix}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); re-run with --overwrite: {fix}") from err
    if not isinstance(meta, dict) or meta.get("format") not in (FORMAT, FORMAT_V2):
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ValueError(
            f"{path}: format {got!r}, expected {FORMAT!r} or {FORMAT_V2!r}; re-run with --overwrite: {fix}"
        )
    allowed = ("uint16",) if meta["format"] == FORMAT else tuple(DTYPES)
    if meta.get("dtype") not in allowed:
        raise ValueError(
            f"{path}: dtype {meta.get('dtype')!r}, expected {' or '.join(map(repr, allowed))} in a {meta['format']} "
            f"folder; re-run with --overwrite: {fix}"
        )
    missing = [s for s in SPLITS if s not in meta.get("splits", {})]
    if missing:
        raise ValueError(f"{path}: splits {missing} are missing; re-run with --overwrite: {fix}")
    return meta


def dtype_of(meta: dict) -> np.dtype:
    """The dtype of a token folder's ids from its (checked, ``load_meta``) meta.json: uint16 or uint32."""
    return DTYPES[meta.get("dtype", "uint16")]


def open_tokens(data_dir: str | os.PathLike, split: str) -> np.memmap:
    """The split's tokens as a read-only flat memmap of the folder's dtype (uint16 or uint32: ``dtype_of``), shape
    (n_tokens,), after checking its size.

    Raises:
        FileNotFoundError / ValueError: as load_meta; also an unknown split, a missing .bin, or a .bin whose size
        is not n_tokens * 2 bytes (truncated or from another run).
    """
    data_dir = Path(data_dir)
    meta = load_meta(data_dir)
    if split not in meta["splits"]:
        raise ValueError(f"unknown split {split!r}; {data_dir} has {sorted(meta['splits'])}")
    record = meta["splits"][split]
    path = data_dir / record["file"]
    fix = f"re-run growlm-prepare with --overwrite --out {data_dir}"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; {fix}")
    dtype = dtype_of(meta)
    expected = record["n_tokens"] * dtype.itemsize
    if path.stat().st_size != expected or record["n_tokens"] == 0:
        raise ValueError(
            f"{path} is {path.stat().st_size} bytes, meta.json says {record['n_tokens']} tokens "
            f"= {expected} bytes; {fix}"
        )
    return np.memmap(path, dtype=dtype, mode="r", shape=(record["n_tokens"],))
