"""The text-reading rules of data/text.py seen through whole commands that need a model: growlm-eval on an
exported tiny model (--lambada rows, --wikitext bytes, a BOM) and train.py given a non-UTF-8 --growth_plan. Each bad
file gives exit status 2 and one line naming FILE:LINE; a BOM gives the same numbers as without it. (The reader
itself and growlm-prepare: tests/unit/test_text_inputs.py.)
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_utils import one_error_line

from growlm.data.text import BOM
from growlm.data.tokenizer import gpt2_tokenizer

REPO = Path(__file__).resolve().parents[2]
LATIN1 = "caf\u00e9 au lait\n".encode("latin-1")  # 0xe9 alone is not UTF-8


# ---------------------------------------------------------------------------------------------------------------
# data/text.py


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory) -> Path:
    """A tiny transformers GPT-2 folder (random weights, GPT-2 vocabulary) that growlm-eval can load."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=1, n_embd=8, n_head=2, n_inner=16, n_positions=32, vocab_size=50257)
    out = tmp_path_factory.mktemp("export")
    GPT2LMHeadModel(cfg).save_pretrained(out)
    return out


def _eval(model: Path, capsys, *args: str) -> tuple[int, str, str]:
    from growlm.eval.metrics import cli

    rc = cli.main([str(model), "--sets", "", "--tokenizer", "gpt2", "--no_progress", *args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "content, expected",
    [
        (b'{"text": "a b c"}\n{"passage": "x y"}\n', ":2: the row has no field 'text' (fields: ['passage'])"),
        (b'{"text": "a b c"}\n{"text": null}\n', ":2: field 'text' is null, not a string"),
        (b'{"text": "a b c"}\n{"text": "caf\xe9 y"}\n', ":2: byte 0xe9 is not valid UTF-8 (invalid continuation byte)"),
    ],
)
def test_eval_lambada_bad_rows_give_one_line(tiny_export, tmp_path, capsys, content, expected):
    f = tmp_path / "lambada.jsonl"
    f.write_bytes(content)
    out = tmp_path / "res.json"
    rc, _, err = _eval(tiny_export, capsys, "--lambada", str(f), "--out", str(out))
    assert rc == 2
    msg = one_error_line(err, "growlm-eval")
    assert msg.startswith(f"{f}{expected}; ")
    assert not out.exists()


@pytest.mark.bad_input
def test_eval_wikitext_non_utf8_names_the_file(tiny_export, tmp_path, capsys):
    f = tmp_path / "wiki.test.raw"
    f.write_bytes(b" = Title = \n\n" + LATIN1)
    rc, _, err = _eval(tiny_export, capsys, "--wikitext", str(f))
    assert rc == 2
    assert one_error_line(err, "growlm-eval").startswith(f"{f}:3: byte 0xe9 is not valid UTF-8 (")


def test_eval_accepts_a_bom_with_the_same_numbers(tiny_export, tmp_path, capsys):
    text = " = Title = \n\nThe cat sat on the mat and the dog sat on the log .\n"
    lam = '{"text": "the cat sat on the mat"}\n{"text": "the dog sat on the log"}\n'
    results = []
    for prefix in (b"", BOM):
        (tmp_path / "w.raw").write_bytes(prefix + text.encode())
        (tmp_path / "l.jsonl").write_bytes(prefix + lam.encode())
        rc, out, err = _eval(tiny_export, capsys, "--wikitext", str(tmp_path / "w.raw"), "--lambada",
                             str(tmp_path / "l.jsonl"))  # fmt: skip
        assert rc == 0, err
        results.append(json.loads(out)["results"])
    assert results[0]["wikitext_file"]["tokens"] == len(gpt2_tokenizer().encode_ordinary(text))
    assert results[0]["lambada_file"]["n_items"] == 2
    for key in ("wikitext_file", "lambada_file"):
        a, b = (dict(r[key]) for r in results)
        a.pop("seconds", None), b.pop("seconds", None)
        assert a == b


# ---------------------------------------------------------------------------------------------------------------
# growth plan files


PLAN = (REPO / "growth" / "plans" / "tiny_msg.yaml").read_bytes()


@pytest.mark.bad_input
def test_train_py_refuses_a_non_utf8_plan_with_one_line(tmp_path):
    f = tmp_path / "plan.yaml"
    f.write_bytes(PLAN + b"# caf\xe9\n")
    line = PLAN.count(b"\n") + 1
    r = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "--growth_plan", str(f), "--out_dir", str(tmp_path / "run")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    msg = one_error_line(r.stderr, "growlm-train")
    assert f"{f}:{line}: byte 0xe9 is not valid UTF-8" in msg
    assert not (tmp_path / "run").exists()
