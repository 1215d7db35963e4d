"""Tokenize text into the flat token files training reads: out_dir/{train.bin, val.bin, meta.json}.

    growlm-prepare                                   # the built-in corpus -> ~/.cache/growlm/builtin (if not there yet)
    growlm-prepare --train a.txt b.jsonl --val c.txt.xz --out runs/data/mine [--text_field body] [--overwrite]
    growlm-prepare --tokenizer MODEL_DIR --out runs/data/smollm      # a model folder's own tokenizer.json
    python -m growlm.data.prepare ...                       # the same

Each .bin is the concatenation of every document's token ids, each document followed by the end-of-text token (GPT-2
BPE by default: <|endoftext|> = 50256), as a flat little-endian array of uint16 ids where the tokenizer has at most
65,536 ids and of uint32 ids above that (``data.tokens.token_dtype``; meta.json names the dtype), written by the one
token-folder writer (data/tokens.py, which also documents meta.json). One .txt /
.txt.xz / .txt.gz / .txt.bz2 file = one document; one row of a .jsonl / .json / .parquet file = one document (its
`text_field`); empty texts are skipped. Local .txt and JSON files are read by data/text.py, the one reader of user
text (UTF-8, a leading BOM removed, line endings normalised to "\n", a bad row named FILE:LINE); .parquet files and
Hub datasets ("hf:NAME[:CONFIG][@SPLIT]", only where the Hub is reachable) go through HF `datasets`.

``--tokenizer`` takes another tokenizer: a model folder's ``tokenizer.json`` (a transformers GPT-2 or Llama folder,
e.g. SmolLM's or TinyLlama's; its end-of-text token is tokenizer_config.json's ``eos_token``; refused when it has more
ids than its config.json's ``vocab_size``), a token folder (the tokenizer and end-of-text token its meta.json names,
as every growlm command reads a token folder given as ``--tokenizer``) or a ``tokenizers`` JSON file, through the
``tokenizers`` library. The file is copied into the token folder, and meta.json records it
(``tokenizer_file``), its end-of-text token (``eot_token``) and its sha256 (``tokenizer_sha256``, checked whenever the
folder's tokenizer is read back), so that train.py --init_from can check that the data fits the model. The folder's
special tokens (bos, eos, unk, pad: tokenizer_config.json / special_tokens_map.json, else config.json's ids) are
recorded too (``special_tokens``, ``add_bos_token``), and when its tokenizer puts a bos token before a text (a
post-processor template in tokenizer.json such as TinyLlama's ``<s> $A``; tokenizer_config.json's ``add_bos_token``
only for a tokenizer.json without a post-processor) every document starts with that token, as the model saw it in
pretraining (docs/models.md). A tokenizer of more than 65,536 ids (Llama 3's 128,256, Qwen's 151,669) gets uint32
token files: twice the bytes a token.

Each source record in meta.json is {"path", "sha256", "n_documents", "n_tokens"}. A source's sha256 is that of
its decompressed bytes, so it equals the corpus MANIFEST.json value.
"""

import argparse
import errno
import functools
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from growlm.data import tokenizer as tok
from growlm.data.build_corpus import CORPUS_DIR, load_manifest, verify_corpus
from growlm.data.sources import (
    HUB_PREFIX,
    ROW_FIX,
    Source,
    builder_of,
    content_sha256,
    load_source,
    quiet_datasets,
    resolve_source,
)
from growlm.data.text import InputError, read_json_rows
from growlm.data.tokens import DTYPE, FORMAT, SPLITS, TokenFolderWriter, cache_dir, load_meta, open_tokens, token_dtype
from growlm.runtime.atomic import failure_reason, write_error, write_failed_message
from growlm.runtime.commands import HelpFormatter, add_version, interruptible
from growlm.runtime.lock import queue_lock

__all__ = ["FORMAT", "DTYPE", "SPLITS", "prepare_dataset", "ensure_builtin_prepared", "load_meta", "open_tokens"]


def default_data_dir() -> Path:
    """Where the built-in corpus is prepared: ``builtin`` in growlm's cache folder (data.tokens.cache_dir)."""
    return cache_dir() / "builtin"


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
                "with `git checkout -- data/corpus` or `python -m growlm.data.build_corpus`"
            )
        files[entry["split"]].append(path)
    return files["train"], files["val"]


@functools.lru_cache(maxsize=2)
def _encoder(spec: str, eot: str) -> tok.Tokenizer:
    """The tokenizer ``spec`` names ('gpt2' or a tokenizers JSON file, end-of-text ``eot``), once per process
    (datasets.map workers rebuild it from these strings)."""
    return tok.gpt2() if spec == "gpt2" else tok.from_file(spec, eot)


def _tokenize_batch(
    batch: dict,
    indices: list[int],
    sources: list[str],
    offsets: list[int],
    tokenizer: str = "gpt2",
    eot: str = tok.EOT,
    bos: int | None = None,
) -> dict:
    """datasets.map function: text -> [bos id] + ids + end-of-text id (``tokenizer``: 'gpt2' or a tokenizers JSON
    file whose end-of-text token is ``eot``; ``bos``: the id put first, None for none); empty text -> no tokens (the
    row is skipped).

    Raises:
        InputError: a null or non-string text (parquet / Hub rows; local files are checked when read), naming
            the source and its row.
    """
    enc = _encoder(tokenizer, eot)
    texts = batch["text"]
    for row, src, t in zip(indices, batch["source"], texts, strict=True):
        if not isinstance(t, str):
            what = "null" if t is None else f"a {type(t).__name__}"
            raise InputError(
                sources[src], None, f"row {row - offsets[src] + 1}: the text is {what}, not a string",
                "point --text_field at a string field, or drop the row",
            )  # fmt: skip
    ids = enc.encode_batch(texts)
    head = [] if bos is None else [bos]
    return {"ids": [(head + x + [enc.eot_token_id]) if t else [] for x, t in zip(ids, texts, strict=True)]}


def _tokenized(
    sources: list[Path | str], split: str, cache_dir: Path, text_field: str, num_proc: int | None, t: tok.Tokenizer
):
    """All sources of a split, tokenized: a datasets.Dataset with columns "source" (index) and "ids"."""
    from datasets import concatenate_datasets  # lazy: heavy (about 2 s), only to read sources

    parts, offsets = [], []
    with quiet_datasets():
        for i, src in enumerate(sources):
            ds = load_source(src, text_field, cache_dir)
            offsets.append(sum(len(p) for p in parts))
            parts.append(ds.add_column("source", [i] * len(ds)))
    ds = concatenate_datasets(parts)
    n_proc = min(num_proc or 1, len(ds)) if len(ds) else 1
    return ds.map(
        _tokenize_batch,
        batched=True,
        batch_size=64,
        with_indices=True,
        fn_kwargs={
            "sources": [str(s) for s in sources],
            "offsets": offsets,
            "tokenizer": t.name,
            "eot": t.eot_token,
            "bos": t.bos_token_id,
        },
        remove_columns=["text"],
        num_proc=n_proc if n_proc > 1 else None,
        desc=f"tokenizing {split}",
    )


def _write_split(
    sources: list[Path | str], split: str, w: TokenFolderWriter, text_field: str, num_proc, t: tok.Tokenizer
) -> dict:
    """Tokenize sources with ``t`` into the split's .bin; return the split's meta record. Raises ValueError on no
    text."""
    tokenized = _tokenized(sources, split, w.staging / ".hf_cache", text_field, num_proc, t)
    out = w.split(split)
    n_tokens = np.zeros(len(sources), dtype=np.int64)
    n_docs = np.zeros(len(sources), dtype=np.int64)
    for table in tokenized.with_format("arrow").iter(batch_size=256):
        lengths = table.column("ids").combine_chunks().value_lengths().to_numpy(zero_copy_only=False)
        src_idx = table.column("source").to_numpy()
        out.write(table.column("ids").combine_chunks().flatten().to_numpy(zero_copy_only=False))
        np.add.at(n_tokens, src_idx, lengths)
        np.add.at(n_docs, src_idx, lengths > 0)
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
    return out.record(int(n_docs.sum()), records)


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
    tokenizer: str | None = None,
) -> Path:
    """Tokenize train_files and val_files into out_dir/{train.bin, val.bin, meta.json} with GPT-2 BPE, or with the
    ``tokenizer`` given (data.tokenizer.for_prepare: a model folder's tokenizer.json or a tokenizers JSON file; then
    also out_dir/tokenizer.json, a copy, recorded in meta.json with its end-of-text token and sha256, and the
    folder's special tokens and ``add_bos_token`` where it declares any; when the tokenizer adds a bos token, each
    document starts with it).

    Written by the one token-folder writer (data/tokens.py): into a temporary sibling of out_dir, renamed into
    place when complete, so out_dir is either the old dataset or the new one, never half of each. num_proc:
    worker processes for the tokenizing map (None or 1: this process; tiktoken also uses threads inside each).
    Units: n_tokens counts tokens including one EOT per document (and one bos, when added). Returns out_dir.

    Raises:
        FileExistsError: out_dir exists and overwrite is False.
        FileNotFoundError: a source is missing.
        InputError: a local text/JSON source with undecodable bytes or a bad row (FILE:LINE: problem; fix).
        TokenizerError (a ValueError): ``tokenizer`` cannot be loaded.
        ValueError: no train or val source, an unknown file type, a missing text_field, or a source with no text
            (InputError: a .jsonl/.json source with no rows, naming it and its split).
        OSError: the disk filled up (``no space left on device while writing OUT``; nothing is kept).
    """
    writer = TokenFolderWriter(out_dir, overwrite, scratch=(".hf_cache",))
    for split, files in (("train", train_files), ("val", val_files)):
        if isinstance(files, str | os.PathLike):
            raise TypeError(f"{split}_files must be a list of paths, got the single path {files!r}; wrap it in [ ]")
        if not files:
            raise ValueError(f"the {split} set is empty; pass at least one file with --{split} FILE [FILE ...]")
    t = tok.for_prepare(tokenizer)
    writer.dtype = token_dtype(t.vocab_size)  # uint16 up to 65,536 ids, else uint32 (data.tokens)
    resolved = {"train": [resolve_source(s) for s in train_files], "val": [resolve_source(s) for s in val_files]}
    for split in SPLITS:
        for src in resolved[split]:
            check_has_rows(src, split, text_field)
    try:
        with writer as w:  # on any failure the temporary folder is removed and out_dir stays as it was
            splits = {split: _write_split(resolved[split], split, w, text_field, num_proc, t) for split in SPLITS}
            if t.name == "gpt2":
                return w.finish(tokenizer="gpt2", vocab_size=t.vocab_size, eot_token_id=t.eot_token_id, splits=splits)
            copy = w.staging / "tokenizer.json"
            shutil.copyfile(t.name, copy)
            special = {}
            if t.special_tokens:  # a model folder's declared tokens; a plain tokenizer.json (small vocab) has none
                special = {"special_tokens": t.special_record(), "add_bos_token": t.add_bos_token}
            return w.finish(
                tokenizer=f"tokenizers JSON from {t.name}", tokenizer_file=copy.name,
                tokenizer_sha256=tok.file_sha256(copy), eot_token=t.eot_token, **special, vocab_size=t.vocab_size,
                eot_token_id=t.eot_token_id, splits=splits,
            )  # fmt: skip
    except Exception as err:
        full = write_error(err, writer.out_dir.parent)  # the staging folder is gone already: read the chain
        if full is None or full.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = f" ({full.filename})" if full.filename else ""
        raise OSError(
            f"{failure_reason(full)} while writing {writer.out_dir}{where}; nothing was kept"
            f"{' and the old folder is unchanged' if overwrite and writer.out_dir.exists() else ''}: free space, "
            "or choose an --out on a disk with room, and run again"
        ) from None


def check_has_rows(src: Path | str, split: str, text_field: str) -> None:
    """Refuse a local .jsonl/.json source without a single row (an empty file, or ``[]``), naming it and its split
    (``datasets`` would otherwise say 'Instruction "train" corresponds to no data!' whatever the split).

    Raises:
        InputError: the file holds no rows.
        (InputError from the first row: undecodable bytes or invalid JSON, FILE:LINE.)
    """
    if not isinstance(src, Path) or builder_of(src) != "json":
        return
    if next(read_json_rows(src, text_field, ROW_FIX), None) is None:
        raise InputError(
            src, None, f"the {split} source holds no rows (an empty file or an empty JSON array)",
            f"add rows ({{\"{text_field}\": \"...\"}} per line), or remove it from --{split}",
        )  # fmt: skip


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
    to call from several processes at once: they queue on data_dir's queue lock (runtime.lock.queue_lock), and the
    ones that wait find the work done. Returns data_dir.

    Raises:
        ValueError: the committed corpus does not match its MANIFEST.json (the message says how to restore it).
    """
    data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
    with queue_lock(data_dir):  # callers wait their turn; the one that prepares then takes the writer lock too
        if _builtin_is_current(data_dir):
            return data_dir
        problems = verify_corpus(CORPUS_DIR)
        if problems:
            raise ValueError(
                f"the committed corpus does not match {CORPUS_DIR / 'MANIFEST.json'}: {problems[:3]}; "
                "restore it with `git checkout -- data/corpus` or `python -m growlm.data.build_corpus`"
            )
        train, val = builtin_corpus_files()
        return prepare_dataset(train, val, data_dir, overwrite=True, num_proc=num_proc)


# ---------------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The growlm-prepare argument parser."""
    parser = argparse.ArgumentParser(
        prog="growlm-prepare", description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter
    )
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
    parser.add_argument(
        "--tokenizer",
        default=None,
        metavar="SPEC",
        help="gpt2 (default: OpenAI's GPT-2 BPE), a model folder holding tokenizer.json (a transformers GPT-2 or Llama "
        "folder; end-of-text: its eos_token), a token folder (its meta.json's tokenizer), or a tokenizers JSON file; "
        "copied into --out and recorded in meta.json with its sha256; needs --out unless gpt2",
    )
    return add_version(parser)


def _run(args: argparse.Namespace) -> Path:
    """Prepare what the parsed command line asks for; returns the token folder."""
    if args.train is None:
        if args.out is None and not args.overwrite:
            return ensure_builtin_prepared(num_proc=args.num_proc)
        train, val = builtin_corpus_files()
        return prepare_dataset(
            train, val, args.out or default_data_dir(), overwrite=args.overwrite, num_proc=args.num_proc,
            tokenizer=args.tokenizer,
        )  # fmt: skip
    return prepare_dataset(
        args.train,
        args.val,
        args.out or default_data_dir(),
        overwrite=args.overwrite,
        num_proc=args.num_proc,
        text_field=args.text_field,
        tokenizer=args.tokenizer,
    )


def held_out_in_training(train: Sequence[str], val: Sequence[str]) -> list[str]:
    """The --val sources that are also --train sources (the same file, however spelled, or the same Hub name), in
    --val's order."""

    def key(src: str) -> str:
        return src if src.startswith(HUB_PREFIX) else os.path.realpath(os.path.expanduser(src))

    train_keys = {key(s) for s in train}
    return [s for s in val if key(s) in train_keys]


def _unwritable(e: BaseException, out: Path) -> str:
    """The one line for ``e`` when it is a failure to write beside ``out`` (a read-only file system, no
    permission: the writer lock, the staging folder), else ''."""
    if not isinstance(e, OSError) or e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM) or not e.filename:
        return ""
    target = Path(os.path.abspath(out))
    if Path(os.path.abspath(e.filename)).parent not in (target.parent, target, *target.parents):
        return ""  # an input that cannot be read: its own message
    return write_failed_message(e, "--out", out, "nothing was written")


@interruptible("growlm-prepare")
def main(argv: list[str] | None = None) -> int:
    """growlm-prepare: see the module docstring. Returns the exit status: 0, or 2 for bad input (one line on
    stderr, ``growlm-prepare: error: ...``; a bad line of a user file is named ``FILE:LINE``; nothing is written)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.num_proc is not None and args.num_proc < 1:
        parser.error(f"--num_proc must be >= 1, got {args.num_proc}")
    if args.train is None and args.val:
        parser.error("--val needs --train; omit both to prepare the built-in corpus")
    if args.train is not None and not args.val:
        parser.error("the val set is empty; pass at least one file with --val FILE [FILE ...]")
    if args.tokenizer not in (None, "gpt2") and args.out is None:
        print(
            f"growlm-prepare: error: --tokenizer {args.tokenizer} needs --out: the default folder {default_data_dir()} "
            "holds the built-in corpus in GPT-2 tokens, which other runs read",
            file=sys.stderr,
        )
        return 2
    try:
        out = _run(args)
    except (OSError, ValueError, RuntimeError) as e:  # InputError, FileExistsError, FileNotFoundError, ...
        print(f"growlm-prepare: error: {_unwritable(e, args.out or default_data_dir()) or e}", file=sys.stderr)
        return 2
    for same in held_out_in_training(args.train or [], args.val or []):  # prepared, but say it (a refusal: one line)
        print(f"growlm-prepare: note: {same} is given to --train and to --val: its held-out loss measures training "
              "text, not generalisation; give --val text that is not in --train", file=sys.stderr)  # fmt: skip
    meta = load_meta(out)
    for split in SPLITS:
        s = meta["splits"][split]
        print(f"{split}: {s['n_tokens']:,d} tokens, {s['n_documents']:,d} documents -> {out / s['file']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
