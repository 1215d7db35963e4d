"""Training on uint32 token files: a vocabulary of 70,001 ids (past uint16, as Llama 3's and Qwen's), the built-in
corpus's first training text prepared with it by growlm-prepare, then trained on 2 ranks (ZeRO-2, fp32): the data
holds ids past 65,535 and the model learns them."""

from __future__ import annotations

import numpy as np
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
