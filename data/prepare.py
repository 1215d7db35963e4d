"""Tokenize text into the flat token files training reads: out_dir/{train.bin, val.bin, meta.json}.

    growlm-prepare                                   # the built-in corpus -> data/cache/builtin (if not there yet)
    growlm-prepare --train a.txt b.jsonl --val c.txt.xz --out data/cache/mine [--text_field body] [--overwrite]
    python -m data.prepare ...                       # the same

Each .bin is the concatenation of every document's GPT-2 token ids, each document followed by <|endoftext|>
(50256), as a flat little-endian uint16 array (np.memmap(path, dtype=np.uint16, mode="r")). Documents are
read through HF `datasets`: one .txt / .txt.xz / .txt.gz / .txt.bz2 file = one document (line endings
normalised to "\n"); one row of a .jsonl / .json / .parquet file = one document (its `text_field`); empty rows
are skipped. A Hub dataset is written "hf:NAME[:CONFIG][@SPLIT]" (only where the Hub is reachable).

meta.json:
    {"format": "growlm-tokens-v1", "dtype": "uint16", "tokenizer": "gpt2", "vocab_size": 50257,
     "eot_token_id": 50256, "splits": {"train": {"file": "train.bin", "n_tokens": N, "n_documents": D,
     "sources": [{"path", "sha256", "n_documents", "n_tokens"}], "sha256": <of train.bin>}, "val": {...}}}
A source's sha256 is that of its decompressed bytes, so it equals the corpus MANIFEST.json value.
"""

import argparse
import bz2
import contextlib
import fcntl
import gzip
import hashlib
import json
import lzma
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from data.build_corpus import CORPUS_DIR, load_manifest, verify_corpus
from data.tokenizer import EOT_TOKEN_ID, gpt2_tokenizer

FORMAT = "growlm-tokens-v1"
DTYPE = np.uint16
SPLITS = ("train", "val")
HUB_PREFIX = "hf:"
_TEXT_SUFFIXES = (".txt", ".txt.xz", ".txt.gz", ".txt.bz2")
_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"} | dict.fromkeys(_TEXT_SUFFIXES, "text")
_OPENERS = {".xz": lzma.open, ".gz": gzip.open, ".bz2": bz2.open}

Source = str | os.PathLike


def default_data_dir() -> Path:
    """Where the built-in corpus is prepared: data/cache/builtin inside the repo (gitignored)."""
    return Path(__file__).resolve().parent / "cache" / "builtin"


def builtin_corpus_files() -> tuple[list[Path], list[Path]]:
    """(train files, val files) of the committed corpus data/corpus/, in MANIFEST.json order.

    Raises FileNotFoundError naming the fix if the manifest or a listed file is missing.
    """
    manifest = load_manifest(CORPUS_DIR)
    files: dict[str, list[Path]] = {split: [] for split in SPLITS}
    for entry in manifest["files"]:
        path = CORPUS_DIR / entry["path"]
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is listed in {CORPUS_DIR / 'MANIFEST.json'} but missing; restore it "
                "with `git checkout -- data/corpus` or `python -m data.build_corpus`"
            )
        files[entry["split"]].append(path)
    return files["train"], files["val"]


# ---------------------------------------------------------------------------------------------------------------
# reading sources


def _builder(path: Path) -> str:
    """The datasets builder for a local file, from its suffix; ValueError naming the supported ones otherwise."""
    name = path.name.lower()
    for suffix, builder in sorted(_BUILDERS.items(), key=lambda kv: -len(kv[0])):
        if name.endswith(suffix):
            return builder
    raise ValueError(
        f"{path}: unknown file type; use one of {', '.join(_BUILDERS)} (text: one file = one "
        "document; json/parquet: one row = one document, field --text_field)"
    )


def _resolve_source(src: Source) -> Path | str:
    """A local file as an absolute Path, or a Hub spec string "hf:..."; FileNotFoundError for a missing file."""
    if isinstance(src, str) and src.startswith(HUB_PREFIX):
        return src
    path = Path(src).expanduser()
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise FileNotFoundError(
            f"source {path} {what}; pass existing files to --train/--val (a Hub dataset is "
            f"written {HUB_PREFIX}NAME[:CONFIG][@SPLIT])"
        )
    _builder(path)  # unknown suffixes fail before any work is done
    return path.resolve()


def content_sha256(path: Path) -> str:
    """sha256 of a file's bytes after decompression (.xz / .gz / .bz2), read in 1 MiB chunks."""
    opener = _OPENERS.get(path.suffix.lower(), open)
    h = hashlib.sha256()
    with opener(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _load_one(src: Path | str, text_field: str, cache_dir: Path):
    """One source as a datasets.Dataset with a single string column "text"."""
    from datasets import load_dataset  # the only datasets import: an adapter at the edge

    if isinstance(src, str):  # hf:NAME[:CONFIG][@SPLIT]
        spec, _, split = src.removeprefix(HUB_PREFIX).partition("@")
        name, _, config = spec.partition(":")
        try:
            ds = load_dataset(name, config or None, split=split or "train", cache_dir=str(cache_dir))
        except Exception as err:  # any failure has the same fix
            raise RuntimeError(
                f"could not load Hub dataset {src!r} ({type(err).__name__}: {err}); the Hub may be "
                "unreachable from here: download the data and pass local files"
            ) from err
    else:
        builder = _builder(src)
        kwargs = {"sample_by": "document"} if builder == "text" else {}
        try:
            ds = load_dataset(builder, data_files=[str(src)], split="train", cache_dir=str(cache_dir), **kwargs)
        except Exception as err:
            raise ValueError(
                f"{src}: could not be read as {builder} ({type(err).__name__}: {err}); "
                "check the file's format and encoding (UTF-8)"
            ) from err
    field = "text" if isinstance(src, Path) and _builder(src) == "text" else text_field
    if field not in ds.column_names:
        raise ValueError(
            f"{src}: has no field {field!r} (fields: {ds.column_names}); pass the right one with --text_field"
        )
    ds = ds.select_columns([field])
    return ds.rename_column(field, "text") if field != "text" else ds


def _tokenize_batch(batch: dict, indices: list[int]) -> dict:
    """datasets.map function: text -> GPT-2 ids + EOT; empty or missing text -> no tokens (the row is skipped)."""
    enc = gpt2_tokenizer()
    texts = batch["text"]
    for row, t in zip(indices, texts, strict=True):
        if t is not None and not isinstance(t, str):
            raise ValueError(
                f"row {row} has a non-string text ({type(t).__name__}); point --text_field at a string field"
            )
    texts = [t or "" for t in texts]
    ids = enc.encode_ordinary_batch(texts)
    return {"ids": [(x + [EOT_TOKEN_ID]) if t else [] for x, t in zip(ids, texts, strict=True)]}


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """Hide datasets' per-file 'Generating train split' bars while sources load; restore the setting after."""
    import datasets

    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            datasets.enable_progress_bars()


def _write_split(sources: list[Path | str], split: str, staging: Path, text_field: str, num_proc: int | None) -> dict:
    """Tokenize sources into staging/<split>.bin; return the split's meta record. Raises ValueError on no text."""
    from datasets import concatenate_datasets

    cache_dir = staging / ".hf_cache"
    parts = []
    with _quiet_datasets():
        for i, src in enumerate(sources):
            ds = _load_one(src, text_field, cache_dir)
            parts.append(ds.add_column("source", [i] * len(ds)))
    ds = concatenate_datasets(parts)
    n_proc = min(num_proc or 1, len(ds)) if len(ds) else 1
    tokenized = ds.map(
        _tokenize_batch,
        batched=True,
        batch_size=64,
        with_indices=True,
        remove_columns=["text"],
        num_proc=n_proc if n_proc > 1 else None,
        desc=f"tokenizing {split}",
    )
    path = staging / f"{split}.bin"
    n_tokens = np.zeros(len(sources), dtype=np.int64)
    n_docs = np.zeros(len(sources), dtype=np.int64)
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for table in tokenized.with_format("arrow").iter(batch_size=256):
            lengths = table.column("ids").combine_chunks().value_lengths().to_numpy(zero_copy_only=False)
            src_idx = table.column("source").to_numpy()
            ids = table.column("ids").combine_chunks().flatten().to_numpy(zero_copy_only=False)
            if ids.size and (ids.min() < 0 or ids.max() > np.iinfo(DTYPE).max):
                raise ValueError(f"token id {ids.max()} does not fit {np.dtype(DTYPE).name}")  # internal: GPT-2 < 2**16
            np.add.at(n_tokens, src_idx, lengths)
            np.add.at(n_docs, src_idx, lengths > 0)
            data = ids.astype(DTYPE).tobytes()  # little-endian on every platform we run on
            h.update(data)
            f.write(data)
    records = []
    for i, src in enumerate(sources):
        if n_docs[i] == 0:
            raise ValueError(f"{split} source {src} contains no text (0 tokens); remove it from --{split} or fill it")
        local = isinstance(src, Path)
        records.append(
            {
                "path": str(src),
                "sha256": content_sha256(src) if local else None,
                "n_documents": int(n_docs[i]),
                "n_tokens": int(n_tokens[i]),
            }
        )
    return {
        "file": path.name,
        "n_tokens": int(n_tokens.sum()),
        "n_documents": int(n_docs.sum()),
        "sources": records,
        "sha256": h.hexdigest(),
    }


# ---------------------------------------------------------------------------------------------------------------
# the public API


def prepare_dataset(
    train_files: Sequence[Source],
    val_files: Sequence[Source],
    out_dir: Source,
    *,
    overwrite: bool = False,
    num_proc: int | None = None,
    text_field: str = "text",
) -> Path:
    """Tokenize train_files and val_files with GPT-2 BPE into out_dir/{train.bin, val.bin, meta.json}.

    Everything is written into a temporary sibling of out_dir and renamed into place when complete, so out_dir is
    either the old dataset or the new one, never half of each. num_proc: worker processes for the tokenizing
    map (None or 1: this process; tiktoken also uses threads inside each). Units: n_tokens counts tokens
    including one EOT per document. Returns out_dir.

    Raises:
        FileExistsError: out_dir exists and overwrite is False.
        FileNotFoundError: a source is missing.
        ValueError: no train or val source, an unknown file type, a missing text_field, or a source with no text.
    """
    out_dir = Path(out_dir).expanduser().resolve()
    if os.path.lexists(out_dir) and not overwrite:
        raise FileExistsError(
            f"{out_dir} already exists; pass overwrite=True (CLI: --overwrite) to replace it, or choose another --out"
        )
    for split, files in (("train", train_files), ("val", val_files)):
        if isinstance(files, str | os.PathLike):
            raise TypeError(f"{split}_files must be a list of paths, got the single path {files!r}; wrap it in [ ]")
        if not files:
            raise ValueError(f"the {split} set is empty; pass at least one file with --{split} FILE [FILE ...]")
    enc = gpt2_tokenizer()
    if enc.n_vocab > np.iinfo(DTYPE).max:
        raise ValueError(f"vocab size {enc.n_vocab} does not fit {np.dtype(DTYPE).name} token files")
    resolved = {"train": [_resolve_source(s) for s in train_files], "val": [_resolve_source(s) for s in val_files]}

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    staging.chmod(0o755)  # mkdtemp makes it 0700
    try:
        splits = {split: _write_split(resolved[split], split, staging, text_field, num_proc) for split in SPLITS}
        meta = {
            "format": FORMAT,
            "dtype": np.dtype(DTYPE).name,
            "tokenizer": "gpt2",
            "vocab_size": enc.n_vocab,
            "eot_token_id": EOT_TOKEN_ID,
            "splits": splits,
        }
        (staging / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        shutil.rmtree(staging / ".hf_cache", ignore_errors=True)
        old = None
        if os.path.lexists(out_dir):  # overwrite=True: move the old one aside only now that the new one is done
            old = out_dir.with_name(f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}")
            out_dir.rename(old)
        staging.rename(out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def load_meta(data_dir: Source) -> dict:
    """Read and validate data_dir/meta.json.

    Raises:
        FileNotFoundError: data_dir or its meta.json is missing (the message says which growlm-prepare to run).
        ValueError: meta.json is not valid JSON or not format growlm-tokens-v1 with uint16 train/val splits.
    """
    data_dir = Path(data_dir)
    fix = f"run `growlm-prepare --train ... --val ... --out {data_dir}` (or plain `growlm-prepare` for the built-in "
    fix += "corpus)"
    path = data_dir / "meta.json"
    if not data_dir.is_dir():
        raise FileNotFoundError(f"token directory {data_dir} does not exist; {fix}")
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing, so {data_dir} is not a prepared dataset; {fix}")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); re-run with --overwrite: {fix}") from err
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ValueError(f"{path}: format {got!r}, expected {FORMAT!r}; re-run with --overwrite: {fix}")
    if meta.get("dtype") != np.dtype(DTYPE).name:
        raise ValueError(f"{path}: dtype {meta.get('dtype')!r}, expected 'uint16'; re-run with --overwrite: {fix}")
    missing = [s for s in SPLITS if s not in meta.get("splits", {})]
    if missing:
        raise ValueError(f"{path}: splits {missing} are missing; re-run with --overwrite: {fix}")
    return meta


def open_tokens(data_dir: Source, split: str) -> np.memmap:
    """The split's tokens as a read-only flat uint16 memmap, shape (n_tokens,), after checking its size.

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
    expected = record["n_tokens"] * np.dtype(DTYPE).itemsize
    if path.stat().st_size != expected or record["n_tokens"] == 0:
        raise ValueError(
            f"{path} is {path.stat().st_size} bytes, meta.json says {record['n_tokens']} tokens "
            f"= {expected} bytes; {fix}"
        )
    return np.memmap(path, dtype=DTYPE, mode="r", shape=(record["n_tokens"],))


def _builtin_is_current(data_dir: Path) -> bool:
    """True if data_dir holds the built-in corpus as listed in MANIFEST.json now (same sources, same sha256)."""
    try:
        meta = load_meta(data_dir)
        for split in SPLITS:
            open_tokens(data_dir, split)
    except (FileNotFoundError, ValueError):
        return False
    manifest = load_manifest(CORPUS_DIR)
    for split in SPLITS:
        want = [e["sha256"] for e in manifest["files"] if e["split"] == split]
        if [s.get("sha256") for s in meta["splits"][split]["sources"]] != want:
            return False
    return True


def ensure_builtin_prepared(data_dir: Source | None = None, *, num_proc: int | None = None) -> Path:
    """Prepare the built-in corpus into data_dir (default default_data_dir()) unless it is already current.

    Current means meta.json is valid, the .bin sizes match, and the sources' sha256 equal MANIFEST.json. Safe
    to call from several processes at once: they serialise on an fcntl lock file next to data_dir, and the
    ones that wait find the work done. Returns data_dir.

    Raises:
        ValueError: the committed corpus does not match its MANIFEST.json (the message says how to restore it).
    """
    data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(data_dir.parent / f".{data_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if _builtin_is_current(data_dir):
            return data_dir
        problems = verify_corpus(CORPUS_DIR)
        if problems:
            raise ValueError(
                f"the committed corpus does not match {CORPUS_DIR / 'MANIFEST.json'}: {problems[:3]}; "
                "restore it with `git checkout -- data/corpus` or `python -m data.build_corpus`"
            )
        train, val = builtin_corpus_files()
        return prepare_dataset(train, val, data_dir, overwrite=True, num_proc=num_proc)


# ---------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """growlm-prepare: see the module docstring. Returns the exit status."""
    parser = argparse.ArgumentParser(prog="growlm-prepare", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--train",
        nargs="+",
        metavar="FILE",
        help="training sources: .txt[.xz|.gz|.bz2] (one document per file), .jsonl/.json/.parquet "
        f"(one per row), or {HUB_PREFIX}NAME[:CONFIG][@SPLIT]; omit to use the built-in corpus",
    )
    parser.add_argument(
        "--val", nargs="+", metavar="FILE", help="validation sources, same forms as --train; required with --train"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"output directory for train.bin, val.bin, meta.json (default {default_data_dir()})",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an existing --out (only once the new one is complete)"
    )
    parser.add_argument(
        "--num_proc", type=int, default=None, help="worker processes for tokenizing (default: this process only)"
    )
    parser.add_argument(
        "--text_field",
        default="text",
        help="field/column holding the text in .jsonl/.json/.parquet/Hub sources (default: text)",
    )
    args = parser.parse_args(argv)
    if args.num_proc is not None and args.num_proc < 1:
        parser.error(f"--num_proc must be >= 1, got {args.num_proc}")
    if args.train is None:
        if args.val:
            parser.error("--val needs --train; omit both to prepare the built-in corpus")
        if args.out is None and not args.overwrite:
            out = ensure_builtin_prepared(num_proc=args.num_proc)
        else:
            train, val = builtin_corpus_files()
            out = prepare_dataset(
                train, val, args.out or default_data_dir(), overwrite=args.overwrite, num_proc=args.num_proc
            )
    else:
        if not args.val:
            parser.error("the val set is empty; pass at least one file with --val FILE [FILE ...]")
        out = prepare_dataset(
            args.train,
            args.val,
            args.out or default_data_dir(),
            overwrite=args.overwrite,
            num_proc=args.num_proc,
            text_field=args.text_field,
        )
    meta = load_meta(out)
    for split in SPLITS:
        s = meta["splits"][split]
        print(f"{split}: {s['n_tokens']:,d} tokens, {s['n_documents']:,d} documents -> {out / s['file']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
