"""The uint32-against-uint16 benchmark (eval/bench/token_files.py) on a few thousand tokens: the two folders hold
the same text split the same way, uint32's files are exactly twice the bytes, and every figure is recorded."""

from __future__ import annotations

import json

import pytest

from growlm.eval.bench import token_files


def test_the_benchmark_compares_the_same_tokens_in_both_dtypes(tmp_path, capsys):
    out = tmp_path / "tf.json"
    argv = ["--chars", "3000", "--steps", "2", "--repeats", "1", "--n_layer", "1", "--n_embd", "32", "--out", str(out)]
    assert token_files.main(argv) == 0
    rec = json.loads(out.read_text())
    a, b = rec["dtypes"]["uint16"], rec["dtypes"]["uint32"]
    assert (a["dtype"], b["dtype"]) == ("uint16", "uint32") and a["tokens"] == b["tokens"] > 1000
    assert b["bytes"] == 2 * a["bytes"] == 4 * a["tokens"] and rec["uint32_over_uint16"]["bytes"] == 2.0
    assert len(a["prepare_s"]) == len(b["train_tokens_per_s_runs"]) == 1 and min(a["prepare_s"] + b["prepare_s"]) > 0
    assert rec["uint32_over_uint16"]["train_tokens_per_s"] == pytest.approx(
        b["train_tokens_per_s"] / a["train_tokens_per_s"]
    )
    assert "uint32 / uint16: bytes x2.00" in capsys.readouterr().out


@pytest.mark.bad_input
def test_a_count_below_one_is_refused(tmp_path, capsys):
    assert token_files.main(["--steps", "0", "--out", str(tmp_path / "x.json")]) == 2
    assert capsys.readouterr().err.strip() == "token_files: error: --steps must be >= 1"
    assert not (tmp_path / "x.json").exists()
