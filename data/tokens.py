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
     "sources": [...], "sha256": <of train.bin>, "max_id": <its largest id>}, "val": {...}}}
``special_tokens`` (a model folder's declared special tokens) and ``add_bos_token`` (every document starts with
the bos token) are written by growlm-prepare --tokenizer for a tokenizer that declares them; a folder without them
has no bos before its documents.

``load_meta`` and ``open_tokens`` are the one reader every command uses (train.py, growlm-eval's token folders,
growlm-experiment, growlm-prepare): meta.json's fields and their types, the token files' sizes, and every id inside
the vocabulary (each split's ``max_id`` against ``vocab_size``), refused as ``TokenFolderError`` (a ValueError:
every command's one-line handler of bad input reports it). ``max_id`` is recorded by the writer; a folder written
before it was, or whose .bin is newer than its meta.json, is scanned once (numpy's max over the memmap) and the
result kept in ``max_ids.json`` inside the folder, keyed by the file's size and mtime, so that no start rescans it.

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
from growlm.runtime.atomic import TMP_PREFIX, commit_dir, fresh_dir, write_json
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
MAX_IDS_FILE = "max_ids.json"  # the largest id of each split of a folder that does not record it (``split_max_id``)


class TokenFolderError(ValueError):
    """A token folder that cannot be read as one: meta.json's fields and their types, a token file whose size is not
    its token count, ids outside the vocabulary. The message names the folder, the field and the fix; a ValueError,
    so that every command's one-line handler of bad input reports it."""


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
        self.max_id = -1  # the largest id written (recorded as the split's ``max_id``)
        self._sha = hashlib.sha256()
        self._file: BinaryIO = open(path, "wb")  # noqa: SIM115  closed by close()

    def write(self, ids: np.ndarray) -> None:
        """Append ``ids`` (any integer array, shape (n,)). Raises ValueError if an id does not fit the dtype."""
        ids = np.asarray(ids)
        if ids.size:
            if ids.min() < 0 or ids.max() > np.iinfo(self.dtype).max:
                raise ValueError(f"token id {ids.max()} does not fit {self.dtype.name} token files")
            self.max_id = max(self.max_id, int(ids.max()))
        data = ids.astype(self.dtype).tobytes()
        self._sha.update(data)
        self._file.write(data)
        self.n_tokens += int(ids.size)

    def close(self) -> None:
        """Close the file (idempotent)."""
        self._file.close()

    def record(self, n_documents: int, sources: list[dict], **extra) -> dict:
        """The split's meta.json record (closes the file): file, n_tokens, n_documents, sources, sha256, max_id (the
        largest id; none for an empty split), extra."""
        self.close()
        rec = {"file": self.path.name, "n_tokens": self.n_tokens, "n_documents": n_documents, "sources": sources}
        return rec | {"sha256": self._sha.hexdigest()} | ({"max_id": self.max_id} if self.n_tokens else {}) | extra


TOKEN_FOLDER_FILES = frozenset({"meta.json", "tokenizer.json", MAX_IDS_FILE, *(f"{split}.bin" for split in SPLITS)})


def _owned(entry: Path) -> bool:
    """Whether a token-folder writer or reader made ``entry``: its files, or the temporary file of a reader killed
    while it wrote ``max_ids.json``."""
    return entry.name in TOKEN_FOLDER_FILES or entry.name.startswith(f"{TMP_PREFIX}{MAX_IDS_FILE}.")


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
        owned=_owned,
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
        for name, rec in splits.items():  # never a folder its readers refuse
            if rec.get("max_id", -1) >= vocab_size or not 0 <= eot_token_id < vocab_size:
                raise ValueError(
                    f"the tokenizer gives ids outside its vocabulary of {vocab_size:,} ids ({name} max_id "
                    f"{rec.get('max_id')}, eot_token_id {eot_token_id}): it is damaged; use another tokenizer"
                )
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


def _kind(value: object) -> str:
    """What a JSON value is, in a message: 'a string', 'a float', 'a list', 'a mapping', 'a boolean', 'null'."""
    names = {str: "a string", float: "a float", list: "a list", dict: "a mapping", bool: "a boolean", int: "an integer"}
    return "null" if value is None else names.get(type(value), f"a {type(value).__name__}")


def _int_problem(field: str, value: object, low: int, meaning: str) -> str | None:
    """The problem with meta.json's ``field`` when ``value`` is not an integer >= ``low``, else None."""
    if not isinstance(value, int) or isinstance(value, bool):
        return f"{field} {value!r} is {_kind(value)}, expected an integer >= {low} ({meaning})"
    return f"{field} {value} is below {low}, expected an integer >= {low} ({meaning})" if value < low else None


def _fields_problem(meta: dict) -> str | None:
    """The first problem with meta.json's fields and their types (vocab_size, eot_token_id, splits and each split's
    file, n_tokens and max_id), or None."""
    for field in ("vocab_size", "eot_token_id", "splits"):
        if field not in meta:
            return f"{field} is missing"
    problem = _int_problem("vocab_size", meta["vocab_size"], 1, "the ids of its tokenizer")
    if problem:
        return problem
    vocab = meta["vocab_size"]
    eot = meta["eot_token_id"]
    problem = _int_problem("eot_token_id", eot, 0, "the end-of-text id after each document")
    if problem or eot >= vocab:
        return problem or f"eot_token_id {eot} is outside its vocabulary [0, {vocab}) (vocab_size)"
    splits = meta["splits"]
    if not isinstance(splits, dict):
        return f'splits is {_kind(splits)}, expected a mapping of split name to its record ({{"train": {{...}}}})'
    missing = [s for s in SPLITS if s not in splits]
    if missing:
        return f"splits {missing} are missing"
    for name, rec in splits.items():
        if not isinstance(rec, dict):
            return f"splits.{name} is {_kind(rec)}, expected a mapping with file and n_tokens"
        for field in ("file", "n_tokens"):
            if field not in rec:
                return f"splits.{name}.{field} is missing"
        file = rec["file"]
        if not isinstance(file, str) or not file or Path(file).name != file:
            return f"splits.{name}.file {file!r} is not the name of a file in the folder"
        problem = _int_problem(f"splits.{name}.n_tokens", rec["n_tokens"], 0, f"the tokens in {file}")
        if problem:
            return problem
        if "max_id" in rec:
            problem = _int_problem(f"splits.{name}.max_id", rec["max_id"], 0, f"the largest id in {file}")
            if problem:
                return problem
    return None


def load_meta(data_dir: str | os.PathLike) -> dict:
    """Read and validate data_dir/meta.json: the one reader of a token folder's meta.json (``open_tokens`` checks its
    token files).

    Raises:
        FileNotFoundError: data_dir or its meta.json is missing (the message says which growlm-prepare to run).
        TokenFolderError (a ValueError): meta.json is not UTF-8, not valid JSON (truncated, damaged), not format
            growlm-tokens-v1 (uint16) or growlm-tokens-v2 (uint16 or uint32); or a field is missing or of the wrong
            type (``vocab_size`` a positive integer, ``eot_token_id`` an id inside it, ``splits`` a mapping holding
            train and val, each with ``file`` a file name, ``n_tokens`` an integer >= 0, ``max_id`` when recorded an
            integer >= 0).
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
        raise TokenFolderError(f"{damaged}; re-run with --overwrite: {fix}") from None
    except json.JSONDecodeError as err:
        raise TokenFolderError(f"{path} is not valid JSON ({err}); re-run with --overwrite: {fix}") from None
    if not isinstance(meta, dict) or meta.get("format") not in (FORMAT, FORMAT_V2):
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise TokenFolderError(
            f"{path}: format {got!r}, expected {FORMAT!r} or {FORMAT_V2!r}; re-run with --overwrite: {fix}"
        )
    allowed = ("uint16",) if meta["format"] == FORMAT else tuple(DTYPES)
    if meta.get("dtype") not in allowed:
        raise TokenFolderError(
            f"{path}: dtype {meta.get('dtype')!r}, expected {' or '.join(map(repr, allowed))} in a {meta['format']} "
            f"folder; re-run with --overwrite: {fix}"
        )
    problem = _fields_problem(meta)
    if problem:
        raise TokenFolderError(f"{path}: {problem}; re-run with --overwrite: {fix}")
    return meta


def dtype_of(meta: dict) -> np.dtype:
    """The dtype of a token folder's ids from its (checked, ``load_meta``) meta.json: uint16 or uint32."""
    return DTYPES[meta.get("dtype", "uint16")]


def scan_max_id(tokens: np.ndarray) -> int:
    """The largest id of a split's tokens (shape (n_tokens,), n_tokens >= 1): one pass over the file."""
    return int(tokens.max())


def _first_outside(tokens: np.ndarray, vocab_size: int, block: int = 1 << 24) -> int | None:
    """The position of the first id >= ``vocab_size`` in ``tokens`` (read ``block`` ids at a time), or None."""
    for start in range(0, len(tokens), block):
        outside = np.flatnonzero(tokens[start : start + block] >= vocab_size)
        if outside.size:
            return start + int(outside[0])
    return None


def _read_max_ids(data_dir: Path) -> dict:
    """``max_ids.json``'s records, {split: {file, size, mtime_ns, max_id}}; {} when it is missing or damaged (then
    the splits are scanned again)."""
    try:
        got = json.loads((data_dir / MAX_IDS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


def split_max_id(data_dir: Path, meta: dict, split: str, tokens: np.ndarray) -> tuple[int, bool]:
    """The largest id of a split (``tokens``: its memmap) and whether it was scanned now: meta.json's ``max_id`` when
    it records one and the .bin is not newer than meta.json; else ``max_ids.json``'s record of the file at its
    current size and mtime; else one scan (``scan_max_id``), which the caller keeps with ``keep_max_id``."""
    record = meta["splits"][split]
    stat = (data_dir / record["file"]).stat()
    if "max_id" in record and stat.st_mtime_ns <= (data_dir / "meta.json").stat().st_mtime_ns:
        return record["max_id"], False
    key = {"file": record["file"], "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    kept = _read_max_ids(data_dir).get(split)
    if isinstance(kept, dict) and all(kept.get(k) == v for k, v in key.items()):
        found = kept.get("max_id")
        if isinstance(found, int) and not isinstance(found, bool):
            return found, False
    return scan_max_id(tokens), True


def keep_max_ids(data_dir: Path, meta: dict, found: dict[str, int]) -> None:
    """Record the scanned largest ids (``found``: split -> id) in ``max_ids.json`` (atomically: a reader sees the old
    file or the new one), each keyed by its file's size and mtime; a folder that cannot be written is scanned again
    next time."""
    kept = _read_max_ids(data_dir)
    for split, max_id in found.items():
        record = meta["splits"][split]
        stat = (data_dir / record["file"]).stat()
        kept[split] = {"file": record["file"], "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "max_id": max_id}
    try:
        write_json(data_dir / MAX_IDS_FILE, kept, overwrite=True)
    except OSError:
        pass  # a read-only folder (a shared dataset): it is scanned again at the next start


def _split_tokens(data_dir: Path, meta: dict, split: str) -> np.memmap:
    """One split's tokens (a read-only memmap, shape (n_tokens,)) after checking the file's size.

    Raises:
        FileNotFoundError: the .bin is missing.
        TokenFolderError: its size is not n_tokens x the dtype's bytes (truncated or from another run), or it is
            empty.
    """
    record = meta["splits"][split]
    path = data_dir / record["file"]
    fix = f"re-run growlm-prepare with --overwrite --out {data_dir}"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; {fix}")
    dtype = dtype_of(meta)
    expected = record["n_tokens"] * dtype.itemsize
    if path.stat().st_size != expected or record["n_tokens"] == 0:
        raise TokenFolderError(
            f"{path} is {path.stat().st_size} bytes, meta.json says {record['n_tokens']} tokens "
            f"= {expected} bytes; {fix}"
        )
    return np.memmap(path, dtype=dtype, mode="r", shape=(record["n_tokens"],))


def open_tokens(data_dir: str | os.PathLike, split: str) -> np.memmap:
    """The split's tokens as a read-only flat memmap of the folder's dtype (uint16 or uint32: ``dtype_of``), shape
    (n_tokens,), after checking the folder: the size of train.bin, val.bin and ``split``'s file, and that every id
    of each is inside the vocabulary (``split_max_id``: recorded, or scanned once and kept in ``max_ids.json``, which
    is written only when every split is in range: a refused folder is left as it was).

    Raises:
        FileNotFoundError: as load_meta; also a missing .bin.
        TokenFolderError (a ValueError): as load_meta; also an unknown split, a .bin whose size is not n_tokens x
            the dtype's bytes (truncated or from another run), an empty split, or an id >= vocab_size (the file and
            the first such position named).
    """
    data_dir = Path(data_dir)
    meta = load_meta(data_dir)
    if split not in meta["splits"]:
        raise TokenFolderError(f"unknown split {split!r}; {data_dir} has {sorted(meta['splits'])}")
    vocab, scanned, opened = meta["vocab_size"], {}, {}
    for name in dict.fromkeys((*SPLITS, split)):  # train first: its problem is named before val's
        tokens = opened[name] = _split_tokens(data_dir, meta, name)
        max_id, fresh = split_max_id(data_dir, meta, name, tokens)
        if max_id >= vocab:
            first = _first_outside(tokens, vocab)  # None: a recorded max_id the file no longer holds
            at = f"max_id {max_id}" if first is None else f"token {first:,} of {len(tokens):,} is {int(tokens[first])}"
            raise TokenFolderError(
                f"{data_dir / meta['splits'][name]['file']}: {at}, outside the folder's vocabulary [0, {vocab}) "
                f"(meta.json's vocab_size): the ids are not its tokenizer's, or the file is damaged; re-run "
                f"growlm-prepare with --overwrite --out {data_dir}"
            )
        if fresh:
            scanned[name] = max_id
    if scanned:
        keep_max_ids(data_dir, meta, scanned)
    return opened[split]
