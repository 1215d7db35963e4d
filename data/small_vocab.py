"""A smaller BPE vocabulary for CPU-scale experiments: a ByteLevel BPE trained with HF ``tokenizers`` on the built-in
corpus's *training* split only, and the corpus tokenized with it into the token-folder format train.py reads.

    python -m growlm.data.small_vocab --vocab_size 4096 --out ~/.cache/growlm/bpe4096
    python -m growlm.data.small_vocab --vocab_size 320 --extra wikipedia,kernel_docs --out ~/.cache/growlm/bpe320-extra

``--extra`` adds the *training* articles and files of extra sources that ``growlm-build-corpus --extra`` wrote into
growlm's cache (never their held-out parts; the built-in validation split stays the only validation text), and
the tokenizer is trained on all of that training text.

With GPT-2's 50,257-token vocabulary, a 4 x 128 model spends most of its parameters and FLOPs on the tied
embedding / LM head (6.4M of 7.2M parameters); at V = 4096 the transformer blocks dominate, which is where growth
acts. Numbers measured with this tokenizer are **not** comparable to GPT-2-tokenized ones.

Output (the token-folder format of ``data/tokens.py``, written by its one writer; ``meta.json`` also names the
tokenizer file, which growlm-eval reads):
``train.bin``: every training document's ids followed by ``<|endoftext|>``, in MANIFEST.json order.
``val.bin``: the validation documents (each + ``<|endoftext|>``) cut into ``val_chunk`` -token chunks and
interleaved round-robin (doc 0 chunk 0, doc 1 chunk 0, ...), so that any prefix, such as train.py's periodic
``--eval_tokens``, samples every held-out document.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from growlm.data.prepare import builtin_corpus_files
from growlm.data.text import read_text
from growlm.data.tokens import TokenFolderWriter, cache_dir, load_meta, token_dtype
from growlm.runtime.lock import queue_lock

EOT = "<|endoftext|>"


def train_tokenizer(texts: list[str], vocab_size: int, min_frequency: int = 2):
    """A ByteLevel BPE (GPT-2's pre-tokenizer and byte alphabet) with ``EOT`` as its only special token."""
    from tokenizers import ByteLevelBPETokenizer  # lazy: only for a trained BPE

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[EOT])
    return tok


def _ids(tok, texts: list[str]) -> list[np.ndarray]:
    eot = tok.token_to_id(EOT)
    dtype = token_dtype(tok.get_vocab_size())
    return [np.asarray([*e.ids, eot], dtype=dtype) for e in tok.encode_batch(texts)]


def interleave(docs: list[np.ndarray], chunk: int) -> np.ndarray:
    """Round-robin concatenation of ``chunk``-token pieces of each document (every token kept once)."""
    pieces = [[d[i : i + chunk] for i in range(0, len(d), chunk)] for d in docs]
    out = [p[k] for k in range(max(len(p) for p in pieces)) for p in pieces if k < len(p)]
    return np.concatenate(out)


def extra_train_files(names: list[str] | tuple[str, ...], root: Path | None = None) -> list[Path]:
    """The training files of the extra sources ``names`` (``growlm-build-corpus --extra``): every
    ``<root>/<name>/train/*.txt`` in name order then file-name order (``root``: data.build_corpus.extra_dir()).
    Held-out parts (``val/``, ``test/``) are never read.

    Raises:
        ValueError: an unknown source name.
        FileNotFoundError: a source that has not been built, naming the command that builds it.
    """
    from growlm.data.build_corpus import EXTRAS, extra_dir  # lazy: the corpus builder's registry of sources

    root = extra_dir() if root is None else root
    unknown = [n for n in names if n not in EXTRAS]
    if unknown:
        raise ValueError(f"unknown extra source(s) {unknown}; choose from {sorted(EXTRAS)}")
    out: list[Path] = []
    for name in names:
        files = sorted((root / name / "train").glob("*.txt"))
        if not files:
            raise FileNotFoundError(
                f"no training files under {root / name / 'train'}; build them with "
                f"`growlm-build-corpus --extra {name}` (downloads from the package registries)"
            )
        out += files
    return out


def prepare_small_vocab(
    out: str | Path,
    vocab_size: int = 4096,
    val_chunk: int = 2048,
    overwrite: bool = False,
    extra: tuple[str, ...] = (),
) -> Path:
    """Train the tokenizer on the built-in train split (plus the training files of the ``extra`` sources,
    ``extra_train_files``) and write out/{tokenizer.json, train.bin, val.bin, meta.json}; the validation split is
    the built-in one. meta.json's ``extra`` names the extra sources.

    Written by the one token-folder writer (data/tokens.py): into a temporary sibling, renamed into place when
    complete. Returns out.

    Raises:
        FileExistsError: out exists and overwrite is False.
        ValueError: vocab_size outside [256 + 1, 2**32], or an unknown extra source.
        FileNotFoundError: an extra source that has not been built (see ``extra_train_files``).
    """

    if not 257 <= vocab_size <= 2**32:
        raise ValueError(f"vocab_size={vocab_size} must be in [257, {2**32:,}] (byte alphabet + EOT)")
    extra_files = extra_train_files(tuple(extra)) if extra else []
    writer = TokenFolderWriter(out, overwrite, dtype=token_dtype(vocab_size))
    train_files, val_files = builtin_corpus_files()
    train_files = [*train_files, *extra_files]
    read = {p: read_text(p) for p in [*train_files, *val_files]}
    tok = train_tokenizer([read[p] for p in train_files], vocab_size)
    with writer as w:
        tok.save(str(w.staging / "tokenizer.json"))
        splits = {}
        for split, files, layout in (("train", train_files, None), ("val", val_files, val_chunk)):
            docs = _ids(tok, [read[p] for p in files])
            srcs = [
                {"path": str(p), "n_documents": 1, "n_tokens": int(len(d))} for p, d in zip(files, docs, strict=True)
            ]
            sw = w.split(split)
            sw.write(interleave(docs, layout) if layout else np.concatenate(docs))
            splits[split] = sw.record(len(docs), srcs)
        splits["val"]["layout"] = f"documents cut into {val_chunk}-token chunks, interleaved round-robin"
        trained_on = "the built-in train split" + (f" and the training files of {', '.join(extra)}" if extra else "")
        return w.finish(
            tokenizer=f"bytelevel-bpe-{vocab_size} (HF tokenizers, trained on {trained_on})",
            **({"extra": list(extra)} if extra else {}),
            tokenizer_file="tokenizer.json",
            vocab_size=tok.get_vocab_size(),
            eot_token_id=tok.token_to_id(EOT),
            splits=splits,
        )


def ensure_small_vocab(out: str | Path, vocab_size: int, extra: tuple[str, ...] = ()) -> Path:
    """The small-vocabulary token folder ``out``, prepared by ``prepare_small_vocab`` unless it is already there.
    Safe to call from several processes at once (pytest workers, two experiments sharing growlm's cache): they
    wait their turn on out's queue lock (runtime.lock.queue_lock); the first prepares, the others find it done.
    Returns out.

    Raises:
        ValueError: a folder already at ``out`` has another vocabulary size or other extra sources (it is never
            replaced: remove it or choose another folder); vocab_size or extra invalid (``prepare_small_vocab``).
        FileExistsError: ``out`` exists but is not a complete token folder, or a process that does not queue (a
            user's ``python -m growlm.data.small_vocab``) is writing it right now.
        FileNotFoundError: an extra source that has not been built.
    """
    out = Path(out)
    with queue_lock(out):
        if not (out / "meta.json").is_file():
            return prepare_small_vocab(out, vocab_size, extra=extra)
    meta = load_meta(out)
    if meta["vocab_size"] != vocab_size or tuple(meta.get("extra", ())) != tuple(extra):
        have = f"{meta['vocab_size']} tokens, extra sources {meta.get('extra', [])}"
        raise ValueError(f"{out} holds another small-vocabulary corpus ({have}; wanted {vocab_size} tokens, extra "
                         f"sources {list(extra)}); remove it or choose another folder")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m growlm.data.small_vocab", description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab_size", type=int, default=4096)
    p.add_argument("--out", default=str(cache_dir() / "bpe4096"))
    p.add_argument("--val_chunk", type=int, default=2048, help="tokens per interleaved validation chunk")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--extra", default="",
                   help="comma-separated extra sources whose training files join the train split (built by "
                        "growlm-build-corpus --extra): wikipedia, kernel_docs")  # fmt: skip
    a = p.parse_args(argv)
    extra = tuple(n for n in a.extra.split(",") if n)
    try:
        out = prepare_small_vocab(a.out, a.vocab_size, a.val_chunk, a.overwrite, extra)
    except (FileExistsError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    meta = json.loads((out / "meta.json").read_text())
    for s in ("train", "val"):
        print(f"{s}: {meta['splits'][s]['n_tokens']:,} tokens -> {out / meta['splits'][s]['file']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
