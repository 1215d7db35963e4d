"""The tokenizer an evaluation uses: GPT-2 BPE (tiktoken, data/gpt2_bpe/) or a ``tokenizers`` JSON file.

Which one a model was trained with is read from where it came from: a growlm checkpoint names its token folder
(``growlm_state.json`` -> ``data.dir``), whose ``meta.json`` says ``"tokenizer": "gpt2"`` or names a
``tokenizer_file`` (written by ``eval.small_vocab``); an exported ``transformers`` folder may hold a
``tokenizer.json``. ``--tokenizer`` on the command line overrides both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class EvalInputError(ValueError):
    """Bad input to an evaluation (model, tokenizer, eval file or window sizes); the message names the fix."""


@dataclass(frozen=True)
class Tokenizer:
    """``encode(text) -> ids`` (no special tokens added), the end-of-text id and the vocabulary size."""

    name: str
    eot_token_id: int
    vocab_size: int
    _impl: Any

    def encode(self, text: str) -> list[int]:
        if self.name == "gpt2":
            return self._impl.encode_ordinary(text)
        return self._impl.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._impl.decode(list(ids))


def gpt2() -> Tokenizer:
    """OpenAI's GPT-2 BPE (V = 50257, <|endoftext|> = 50256) from the committed files."""
    from data.tokenizer import EOT_TOKEN_ID, GPT2_VOCAB_SIZE, gpt2_tokenizer

    return Tokenizer("gpt2", EOT_TOKEN_ID, GPT2_VOCAB_SIZE, gpt2_tokenizer())


def from_file(path: str | Path, eot: str = "<|endoftext|>") -> Tokenizer:
    """A ``tokenizers`` JSON file (e.g. a ByteLevel BPE trained by ``eval.small_vocab``).

    Raises:
        EvalInputError: the file is missing, unreadable, or has no ``eot`` token.
    """
    from tokenizers import Tokenizer as HFTokenizer

    path = Path(path)
    if not path.is_file():
        raise EvalInputError(f"tokenizer file {path} does not exist; pass --tokenizer gpt2 or a tokenizer.json")
    try:
        tok = HFTokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises plain Exception subclasses from Rust
        raise EvalInputError(f"{path} is not a `tokenizers` JSON file ({e})") from e
    eot_id = tok.token_to_id(eot)
    if eot_id is None:
        raise EvalInputError(f"{path} has no {eot!r} token; documents are separated by it in growlm token files")
    return Tokenizer(str(path), eot_id, tok.get_vocab_size(), tok)


def from_data_dir(data_dir: str | Path) -> Tokenizer:
    """The tokenizer a prepared token folder was made with (its meta.json)."""
    meta_path = Path(data_dir) / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
    except (FileNotFoundError, json.JSONDecodeError) as e:
        raise EvalInputError(f"cannot read {meta_path} ({e}); pass --tokenizer gpt2 or a tokenizer.json") from e
    if meta.get("tokenizer_file"):
        return from_file(Path(data_dir) / meta["tokenizer_file"])
    if meta.get("tokenizer") == "gpt2":
        return gpt2()
    raise EvalInputError(f"{meta_path}: unknown tokenizer {meta.get('tokenizer')!r}; pass --tokenizer")


def resolve(spec: str | None, default: Tokenizer | None = None) -> Tokenizer:
    """``--tokenizer``: 'gpt2', a tokenizer.json, or a token folder; None means ``default`` (else GPT-2)."""
    if spec is None:
        return default if default is not None else gpt2()
    if spec == "gpt2":
        return gpt2()
    p = Path(spec)
    return from_data_dir(p) if p.is_dir() else from_file(p)
