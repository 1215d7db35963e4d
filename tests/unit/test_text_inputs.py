"""One reader of user text files (data/text.py) behind growlm-prepare, growlm-eval and growth plan files.

Regression tests: a row without the text field (was KeyError 'text' in growlm-eval), a null
text (was AttributeError), a leading UTF-8 BOM (refused by growlm-eval, accepted by growlm-prepare), a non-UTF-8
file (not named by growlm-eval, a traceback in growlm-prepare). Every command now accepts and removes a BOM, and
answers a bad file with exit status 2 and one line ``PROG: error: FILE:LINE: problem; fix``, writing nothing.
"""

import json
import lzma
from pathlib import Path

import numpy as np
import pytest
from cli_utils import one_error_line

from growlm.data import prepare
from growlm.data.text import BOM, InputError, read_json_rows, read_lines, read_text
from growlm.data.tokenizer import EOT_TOKEN_ID, gpt2_tokenizer

REPO = Path(__file__).resolve().parents[2]
LATIN1 = "caf\u00e9 au lait\n".encode("latin-1")  # 0xe9 alone is not UTF-8


# ---------------------------------------------------------------------------------------------------------------
# data/text.py


def test_read_text_removes_a_bom_and_normalises_line_ends(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes(BOM + b"one\r\ntwo\rthree\n")
    assert read_text(f) == "one\ntwo\nthree\n"
    xz = tmp_path / "a.txt.xz"
    xz.write_bytes(lzma.compress(BOM + "\u00fcml\n".encode()))
    assert read_text(xz) == "\u00fcml\n"
    assert list(read_lines(f)) == [(1, "one"), (2, "two"), (3, "three"), (4, "")]
    mid = tmp_path / "mid.txt"
    mid.write_bytes(b"x" + BOM)  # only a *leading* BOM is removed
    assert read_text(mid) == "x\ufeff"


@pytest.mark.bad_input
def test_undecodable_bytes_name_the_file_and_line(tmp_path):
    f = tmp_path / "latin.txt"
    f.write_bytes(b"fine\nstill fine\n" + LATIN1)
    with pytest.raises(InputError) as e:
        read_text(f)
    assert (e.value.path, e.value.line) == (str(f), 3)
    assert str(e.value).startswith(f"{f}:3: byte 0xe9 is not valid UTF-8")
    assert "convert it to UTF-8" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(FileNotFoundError):
        read_text(tmp_path / "missing.txt")


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "row, problem",
    [
        ('["a", "b"]', "the row is a JSON list, not an object"),
        ('{"body": "x"}', "the row has no field 'text' (fields: ['body'])"),
        ('{"text": null}', "field 'text' is null, not a string"),
        ('{"text": 7}', "field 'text' is a JSON int, not a string"),
        ('{"text": "unterminated', "invalid JSON (Unterminated string starting at, column 10)"),
    ],
)
def test_bad_json_rows_name_the_line(tmp_path, row, problem):
    f = tmp_path / "rows.jsonl"
    f.write_text('{"text": "good row"}\n\n' + row + "\n", encoding="utf-8")
    rows = read_json_rows(f, "text", "FIX")
    assert next(rows) == (1, "good row")
    with pytest.raises(InputError) as e:
        next(rows)
    assert e.value.line == 3 and e.value.problem == problem


def test_json_rows_bom_and_array_form(tmp_path):
    f = tmp_path / "rows.jsonl"
    f.write_bytes(BOM + b'{"text": "a b"}\n{"text": "c d"}\n')
    assert list(read_json_rows(f, "text", "FIX")) == [(1, "a b"), (2, "c d")]
    arr = tmp_path / "rows.json"
    arr.write_text('[\n  {"text": "x"},\n  {"text": "y"},\n  {"body": "z"}\n]\n', encoding="utf-8")
    rows = read_json_rows(arr, "text", "FIX")
    assert [next(rows), next(rows)] == [(2, "x"), (3, "y")]
    with pytest.raises(InputError, match=r"rows\.json:4: the row has no field 'text'"):
        next(rows)


# ---------------------------------------------------------------------------------------------------------------
# growlm-prepare


def _prepare(tmp_path, train: Path, capsys) -> tuple[int, str]:
    val = tmp_path / "val.txt"
    val.write_text("held out text\n", encoding="utf-8")
    rc = prepare.main(["--train", str(train), "--val", str(val), "--out", str(tmp_path / "tok")])
    return rc, capsys.readouterr().err


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("rows.jsonl", b'{"text": "a"}\n{"body": "b"}\n', ":2: the row has no field 'text' (fields: ['body'])"),
        ("rows.jsonl", b'{"text": "a"}\n{"text": null}\n', ":2: field 'text' is null, not a string"),
        ("rows.jsonl", b'{"text": "a"}\n"just a string"\n', ":2: the row is a JSON str, not an object"),
        ("latin.txt", b"first line\n" + LATIN1, ":2: byte 0xe9 is not valid UTF-8 (invalid continuation byte)"),
    ],
)
def test_prepare_refuses_a_bad_file_with_one_line(tmp_path, capsys, name, content, expected):
    bad = tmp_path / name
    bad.write_bytes(content)
    rc, err = _prepare(tmp_path, bad, capsys)
    assert rc == 2
    assert one_error_line(err, "growlm-prepare").startswith(f"{bad.resolve()}{expected}; ")
    assert not (tmp_path / "tok").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tok")] == []  # no staging left


@pytest.mark.bad_input
def test_prepare_null_text_in_parquet_names_file_and_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": ["a b", None]}), f)
    with pytest.raises(InputError, match=r"d\.parquet: row 2: the text is null, not a string; point --text_field"):
        prepare.prepare_dataset([f], [f], tmp_path / "tok")
    assert not (tmp_path / "tok").exists()


def test_prepare_accepts_a_bom_and_drops_it(tmp_path):
    text = "Hello world\r\nsecond line\n"
    plain, bom = tmp_path / "plain.txt", tmp_path / "bom.txt"
    plain.write_bytes(text.encode())
    bom.write_bytes(BOM + text.encode())
    rows = tmp_path / "rows.jsonl"
    rows.write_bytes(BOM + json.dumps({"text": text}).encode() + b"\n")
    out = prepare.prepare_dataset([plain, bom, rows], [plain], tmp_path / "tok")
    one = gpt2_tokenizer().encode_ordinary("Hello world\nsecond line\n") + [EOT_TOKEN_ID]
    assert np.fromfile(out / "train.bin", dtype=np.uint16).tolist() == one * 2 + (
        gpt2_tokenizer().encode_ordinary(text) + [EOT_TOKEN_ID]  # a JSON string keeps its own \r\n
    )


# ---------------------------------------------------------------------------------------------------------------
# growlm-eval


PLAN = (REPO / "growth" / "plans" / "tiny_msg.yaml").read_bytes()


def test_plan_file_with_a_bom_loads_like_without(tmp_path):
    from growlm.growth.stages.plan import load_stages

    f = tmp_path / "plan.yaml"
    f.write_bytes(BOM + PLAN)
    assert load_stages(f) == load_stages(REPO / "growth" / "plans" / "tiny_msg.yaml")


@pytest.mark.bad_input
def test_plan_file_not_utf8_is_named_with_its_line(tmp_path):
    from growlm.growth.errors import GrowthError
    from growlm.growth.stages.plan import load_stages

    f = tmp_path / "plan.yaml"
    f.write_bytes(b"# caf\xe9\n" + PLAN)
    with pytest.raises(GrowthError, match=rf"^{f}:1: byte 0xe9 is not valid UTF-8 \(.*\); convert it to UTF-8"):
        load_stages(f)


@pytest.mark.bad_input
def test_prepare_notes_held_out_text_that_is_also_training_text(tmp_path, capsys):
    """The same file given to --train and to --val (however spelled): prepared, with one note naming it."""
    (tmp_path / "a.txt").write_text("Some words for the two splits. " * 50)
    (tmp_path / "b.txt").write_text("Other words only for training. " * 50)
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    argv = ["--train", str(a), str(b), "--val", f"{tmp_path}/./a.txt", "--out", str(tmp_path / "tokens")]
    assert prepare.main(argv) == 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("growlm-prepare:")]  # not the bars
    assert err == [
        f"growlm-prepare: note: {tmp_path}/./a.txt is given to --train and to --val: its held-out loss measures "
        "training text, not generalisation; give --val text that is not in --train"
    ]
    assert prepare.held_out_in_training([str(a)], [str(b)]) == []
