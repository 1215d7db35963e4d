"""Bad input to train.py: exit status 2, one clear message that names the problem, nothing overwritten."""

from __future__ import annotations

import train


def fails(capsys, argv: list[str], *needles: str) -> str:
    rc = train.main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = [line for line in err.splitlines() if line.startswith("growlm-train: error:")]
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def test_unknown_preset(capsys):
    fails(capsys, ["--preset", "gpt5"], "unknown model preset 'gpt5'", "cpu-small")


def test_missing_and_unparsable_ds_config(capsys, tmp_path):
    fails(capsys, ["--ds_config", str(tmp_path / "nope.json")], "no such file", "zero2_bf16.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"zero_optimization": {"stage": 2,}')
    fails(capsys, ["--ds_config", str(bad)], "is not valid JSON")


def test_n_embd_not_divisible_by_n_head(capsys):
    fails(capsys, ["--preset", "tiny", "--n_embd", "100", "--n_head", "3"], "n_embd=100 is not divisible by n_head=3")


def test_seq_len_above_n_positions(capsys):
    fails(capsys, ["--preset", "tiny", "--seq_len", "129"], "--seq_len 129", "n_positions=128")


def test_corpus_path_missing_empty_or_a_text_file(capsys, tmp_path):
    fails(capsys, ["--data", str(tmp_path / "nothing")], "no such folder", "growlm-prepare")
    (tmp_path / "empty").mkdir()
    fails(capsys, ["--data", str(tmp_path / "empty")], str(tmp_path / "empty"))
    text = tmp_path / "book.txt"
    text.write_text("Some text.")
    fails(capsys, ["--data", str(text)], "is a file", "growlm-prepare")


def test_resume_pointing_at_nothing(capsys, tmp_path):
    fails(capsys, ["--resume", str(tmp_path / "missing")], "no such file or folder")
    (tmp_path / "empty").mkdir()
    fails(capsys, ["--resume", str(tmp_path / "empty")], "nothing to load")
