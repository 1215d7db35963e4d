"""growlm-prepare --tokenizer: a token folder made with a model folder's own tokenizer.json (here a Llama folder's
byte-level BPE whose end-of-text token is ``</s>``): the ids are that tokenizer's, the file is copied into the token
folder and meta.json records it with its end-of-text token and sha256, which every reader checks; train.py
--init_from accepts such data for that model and refuses GPT-2 data; what cannot be tokenized this way is refused in
one line."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
from cli_utils import one_error_line
from llama_folder_helpers import make_llama_folder
from tokenizer_helpers import big_tokenizer

from growlm.data import tokenizer as tok
from growlm.data.prepare import main as prepare_main
from growlm.data.tokens import load_meta
from growlm.trainer.errors import UsageError
from growlm.trainer.init_from import check_data_tokenizer, open_init_from

DOCS = ["The tempest rose over the island; the sailors cried.\n", "Ünïcödé — “quotes” and <|endoftext|> as text. 12345"]
NAMES = ("resume", "preset", "n_layer", "n_embd", "n_head", "n_inner", "n_positions", "vocab_size", "dropout")


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return make_llama_folder(tmp_path_factory.mktemp("llama") / "model")


def sources(tmp_path: Path) -> list[str]:
    paths = []
    for i, text in enumerate(DOCS):
        (tmp_path / f"doc{i}.txt").write_text(text)
        paths.append(str(tmp_path / f"doc{i}.txt"))
    return paths


def test_a_model_folders_tokenizer_makes_the_token_folder(tmp_path, llama):
    docs, out = sources(tmp_path), tmp_path / "tokens"
    assert prepare_main(["--train", *docs, "--val", docs[0], "--out", str(out), "--tokenizer", str(llama)]) == 0
    meta = load_meta(out)
    assert (meta["tokenizer_file"], meta["eot_token"], meta["eot_token_id"], meta["vocab_size"]) == (
        "tokenizer.json",
        "</s>",
        1,
        300,
    )
    assert (out / "tokenizer.json").read_bytes() == (llama / "tokenizer.json").read_bytes()
    assert meta["tokenizer_sha256"] == tok.file_sha256(llama / "tokenizer.json")
    model_tok = tok.from_hf_dir(llama)
    want = [i for text in DOCS for i in [*model_tok.encode(text), 1]]
    assert np.fromfile(out / "train.bin", dtype="<u2").tolist() == want
    assert max(want) < 300 and "<|endoftext|>" not in model_tok.decode(want[: len(model_tok.encode(DOCS[0]))])
    back = tok.from_data_dir(out)
    assert back.encode(DOCS[1]) == model_tok.encode(DOCS[1]) and back.eot_token_id == 1
    src = open_init_from(Namespace(**dict.fromkeys(NAMES), init_from=str(llama)))
    check_data_tokenizer(src, out)  # the model's own data: accepted
    (out / "tokenizer.json").write_text((out / "tokenizer.json").read_text().replace('"</s>"', '"</S>"', 1))
    with pytest.raises(tok.TokenizerError, match="it was changed since; prepare the folder again"):
        tok.from_data_dir(out)


def test_gpt2_data_is_refused_for_a_llama_folder(builtin_data, llama):
    src = open_init_from(Namespace(**dict.fromkeys(NAMES), init_from=str(llama)))
    with pytest.raises(UsageError, match="encodes text differently from the tokenizer of --init_from"):
        check_data_tokenizer(src, builtin_data)


def refused(capsys, argv: list[str], *needles: str) -> str:
    capsys.readouterr()
    assert prepare_main(argv) == 2
    line = one_error_line(capsys.readouterr().err, "growlm-prepare")
    for n in needles:
        assert n in line, line
    return line


@pytest.mark.bad_input
def test_tokenizers_that_cannot_make_a_token_folder_are_refused(capsys, tmp_path, llama):

    docs = sources(tmp_path)
    refused(capsys, ["--tokenizer", str(llama)], f"--tokenizer {llama} needs --out")
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "tokens"
    base = ["--train", *docs, "--val", docs[0], "--out", str(out)]
    refused(capsys, [*base, "--tokenizer", str(empty)], f"{empty} has no tokenizer.json")
    (tmp_path / "bad.json").write_text("{not a tokenizer")
    refused(capsys, [*base, "--tokenizer", str(tmp_path / "bad.json")], "is not a `tokenizers` JSON file")
    assert not out.exists()


def test_a_vocabulary_past_65536_ids_gets_uint32_token_files(tmp_path, builtin_data):
    """uint32 token files (format v2) for a tokenizer of more than 65,536 ids, every id as the tokenizer gives it;
    a uint16 folder (the built-in corpus) stays format v1, as every folder written before uint32 existed."""
    from tokenizers import Tokenizer

    from growlm.data.tokens import FORMAT, FORMAT_V2, open_tokens

    docs, out = sources(tmp_path), tmp_path / "tokens"
    big = big_tokenizer(tmp_path / "big.json", DOCS)
    assert prepare_main(["--train", docs[0], "--val", docs[1], "--out", str(out), "--tokenizer", str(big)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["format"], meta["dtype"], meta["vocab_size"], meta["eot_token_id"]) == (FORMAT_V2, "uint32", 70_001,
                                                                                        70_000)  # fmt: skip
    train = open_tokens(out, "train")
    want = [*Tokenizer.from_file(str(big)).encode(DOCS[0]).ids, 70_000]
    assert train.dtype == np.uint32 and train.tolist() == want and min(want) > 65_535
    assert (out / "train.bin").stat().st_size == 4 * len(want)
    old = json.loads((builtin_data / "meta.json").read_text())
    assert (old["format"], old["dtype"]) == (FORMAT, "uint16") and open_tokens(builtin_data, "val").dtype == np.uint16


@pytest.mark.bad_input
def test_a_token_folder_is_taken_as_the_tokenizer(capsys, tmp_path, llama):
    """growlm-prepare --tokenizer TOKEN_FOLDER, as growlm-eval and growlm-grow take one: its meta.json names the
    tokenizer and its end-of-text token (here ``</s>``, not ``<|endoftext|>``), and the new folder is tokenized
    exactly as the first."""
    docs, first, second = sources(tmp_path), tmp_path / "first", tmp_path / "second"
    assert prepare_main(["--train", *docs, "--val", docs[0], "--out", str(first), "--tokenizer", str(llama)]) == 0
    assert prepare_main(["--train", *docs, "--val", docs[0], "--out", str(second), "--tokenizer", str(first)]) == 0
    a, b = load_meta(first), load_meta(second)
    assert (b["eot_token"], b["eot_token_id"], b["vocab_size"]) == ("</s>", 1, 300)
    assert b["tokenizer_sha256"] == a["tokenizer_sha256"] and b["splits"]["train"]["max_id"] < 300
    assert (second / "train.bin").read_bytes() == (first / "train.bin").read_bytes()
