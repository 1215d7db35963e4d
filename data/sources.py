"""Sources growlm-prepare reads: local files (by suffix) and Hub datasets, each loaded as a datasets.Dataset.

Local .txt[.xz|.gz|.bz2] and .jsonl/.json files are read by data/text.py, the one reader of user text (strict
UTF-8, a leading BOM removed, line endings normalised, a bad row named FILE:LINE); .parquet files and Hub
datasets ("hf:NAME[:CONFIG][@SPLIT]") go through HF `datasets`.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import lzma
import os
from collections.abc import Iterator
from pathlib import Path

from growlm.data.text import InputError, read_json_rows, read_text

HUB_PREFIX = "hf:"
_TEXT_SUFFIXES = (".txt", ".txt.xz", ".txt.gz", ".txt.bz2")
_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"} | dict.fromkeys(_TEXT_SUFFIXES, "text")
_OPENERS = {".xz": lzma.open, ".gz": gzip.open, ".bz2": bz2.open}

Source = str | os.PathLike


def builder_of(path: Path) -> str:
    """The datasets builder for a local file, from its suffix; ValueError naming the supported ones otherwise."""
    name = path.name.lower()
    for suffix, builder in sorted(_BUILDERS.items(), key=lambda kv: -len(kv[0])):
        if name.endswith(suffix):
            return builder
    raise ValueError(
        f"{path}: unknown file type; use one of {', '.join(_BUILDERS)} (text: one file = one "
        "document; json/parquet: one row = one document, field --text_field)"
    )


def resolve_source(src: Source) -> Path | str:
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
    builder_of(path)  # unknown suffixes fail before any work is done
    return path.resolve()


def content_sha256(path: Path) -> str:
    """sha256 of a file's bytes after decompression (.xz / .gz / .bz2), read in 1 MiB chunks."""
    opener = _OPENERS.get(path.suffix.lower(), open)
    h = hashlib.sha256()
    with opener(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


ROW_FIX = "point --text_field at the field that holds each row's text, or fix the row"


def _local_rows(path: str, builder: str, text_field: str) -> Iterator[dict]:
    """datasets generator over a local .txt / .jsonl / .json file, read by data/text.py (one reader for every
    command: BOM removed, strict UTF-8, FILE:LINE errors); rows are {"text": str}."""
    if builder == "text":
        yield {"text": read_text(path)}
        return
    for _, text in read_json_rows(path, text_field, ROW_FIX):
        yield {"text": text}


def _unwrap_input_error(err: BaseException) -> InputError | None:
    """The InputError a datasets generator raised, if datasets wrapped one (DatasetGenerationError)."""
    while err is not None:
        if isinstance(err, InputError):
            return err
        err = err.__cause__ or err.__context__
    return None


def _load_hub(src: str, cache_dir: Path):
    """A Hub dataset hf:NAME[:CONFIG][@SPLIT] as a datasets.Dataset; RuntimeError naming the fix on failure."""
    from datasets import load_dataset  # lazy: heavy (about 2 s), only to read sources

    spec, _, split = src.removeprefix(HUB_PREFIX).partition("@")
    name, _, config = spec.partition(":")
    try:
        return load_dataset(name, config or None, split=split or "train", cache_dir=str(cache_dir))
    except Exception as err:  # any failure has the same fix
        raise RuntimeError(
            f"could not load Hub dataset {src!r} ({type(err).__name__}: {err}); the Hub may be "
            "unreachable from here: download the data and pass local files"
        ) from err


def load_source(src: Path | str, text_field: str, cache_dir: Path):
    """One source as a datasets.Dataset with a single string column "text".

    Local .txt/.jsonl/.json files are read by data/text.py; .parquet files and Hub datasets by `datasets`.

    Raises:
        InputError: a local text/JSON file with undecodable bytes or a bad row (FILE:LINE).
        ValueError: a parquet file that cannot be read, or a source without the text field.
    """
    from datasets import Dataset, Features, Value, load_dataset  # lazy: heavy (about 2 s), only to read sources

    if isinstance(src, str):
        ds = _load_hub(src, cache_dir)
    elif (builder := builder_of(src)) != "parquet":
        try:
            return Dataset.from_generator(
                _local_rows, gen_kwargs={"path": str(src), "builder": builder, "text_field": text_field},
                features=Features({"text": Value("string")}),
                cache_dir=str(cache_dir),
            )  # fmt: skip
        except Exception as err:
            inner = _unwrap_input_error(err)
            if inner is None:
                raise
            raise inner from None
    else:
        try:
            ds = load_dataset("parquet", data_files=[str(src)], split="train", cache_dir=str(cache_dir))
        except Exception as err:
            raise ValueError(
                f"{src}: could not be read as parquet ({type(err).__name__}: {err}); check the file's format"
            ) from err
    if text_field not in ds.column_names:
        raise ValueError(
            f"{src}: has no field {text_field!r} (fields: {ds.column_names}); pass the right one with --text_field"
        )
    ds = ds.select_columns([text_field])
    return ds.rename_column(text_field, "text") if text_field != "text" else ds


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """Hide datasets' per-file 'Generating train split' bars while sources load; restore the setting after."""
    import datasets  # lazy: heavy (about 2 s), only to read sources

    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            datasets.enable_progress_bars()
