"""The one reader of token folders (data.tokens.load_meta / open_tokens), checked up front by every command that reads
one: meta.json's fields and their types, and every id inside the folder's vocabulary. Each folder a user reported
(ids past the vocabulary in train.bin or val.bin, even at a few positions only; a missing or mistyped vocab_size,
n_tokens or file; splits as a list; a negative vocab_size; an end-of-text id past the vocabulary) is refused by
train.py (``train.main`` in this process: before any rank joins or a model is built), by growlm-eval and
growlm-prepare taking it as ``--tokenizer``, and by ``open_tokens`` (growlm-experiment's reader), in one line naming
the folder, the field and the fix, exit status 2, nothing written. The largest id of each split is recorded by the
writer, or scanned once and kept beside meta.json."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from cli_utils import one_error_line, train_fails
from init_from_helpers import make_hf_folder
from tokenizer_helpers import big_tokenizer

from growlm.data import prepare, tokens
from growlm.data import tokenizer as tok
from growlm.data.tokens import MAX_IDS_FILE, TokenFolderError, load_meta, open_tokens

VOCAB = 70_000
N_TRAIN, N_VAL = 8002, 512
ARGV = ["--preset", "llama-tiny", "--vocab_size", str(VOCAB), "--seq_len", "32", "--no_final_eval", "--max_steps", "2"]


@pytest.fixture(autouse=True)
def one_rank(monkeypatch):
    """A plain ``python train.py`` environment: no launcher variables."""
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)


def token_folder(path: Path, train: np.ndarray | None = None, val: np.ndarray | None = None, **meta_changes) -> Path:
    """A uint32 token folder (growlm-tokens-v2, vocabulary ``VOCAB``) as a user's own tool or an older growlm wrote
    it: no ``max_id`` recorded. ``train``/``val``: its ids (default: in range); ``meta_changes``: top-level fields
    replaced."""
    path.mkdir()
    splits = {}
    for split, ids, n in (("train", train, N_TRAIN), ("val", val, N_VAL)):
        ids = (np.arange(n) % 1000) if ids is None else ids
        (path / f"{split}.bin").write_bytes(np.asarray(ids, dtype="<u4").tobytes())
        splits[split] = {"file": f"{split}.bin", "n_tokens": len(ids), "n_documents": 1}
    meta = {"format": "growlm-tokens-v2", "dtype": "uint32", "tokenizer": "gpt2", "vocab_size": VOCAB,
            "eot_token_id": VOCAB - 1, "splits": splits} | meta_changes  # fmt: skip
    (path / "meta.json").write_text(json.dumps(meta))
    return path


def edit_meta(path: Path, change: Callable[[dict], None]) -> Path:
    meta = json.loads((path / "meta.json").read_text())
    change(meta)
    (path / "meta.json").write_text(json.dumps(meta))
    return path


def _few_past(n: int) -> np.ndarray:
    ids = np.arange(n) % 1000
    ids[[1234, 5000]] = VOCAB + 5
    return ids


def _refix(d: Path) -> str:
    return (
        f"re-run with --overwrite: run `growlm-prepare --train ... --val ... --out {d}` (or plain `growlm-prepare` "
        "for the built-in corpus)"
    )


def _ids(d: Path, file: str, at: str) -> str:
    return (
        f"{d / file}: {at}, outside the folder's vocabulary [0, {VOCAB}) (meta.json's vocab_size): the ids are not "
        f"its tokenizer's, or the file is damaged; re-run growlm-prepare with --overwrite --out {d}"
    )


# case -> (make the folder at a path, the problem as load_meta / open_tokens give it)
ID_CASES: dict[str, tuple[Callable[[Path], Path], Callable[[Path], str]]] = {
    "ids past the vocabulary in train.bin": (
        lambda p: token_folder(p, train=VOCAB + np.arange(N_TRAIN) % 1000),
        lambda d: _ids(d, "train.bin", f"token 0 of {N_TRAIN:,} is {VOCAB}"),
    ),
    "ids past the vocabulary at a few positions of train.bin": (
        lambda p: token_folder(p, train=_few_past(N_TRAIN)),
        lambda d: _ids(d, "train.bin", f"token 1,234 of {N_TRAIN:,} is {VOCAB + 5}"),
    ),
    "an id past the vocabulary in val.bin": (
        lambda p: token_folder(p, val=np.where(np.arange(N_VAL) == 100, VOCAB, np.arange(N_VAL))),
        lambda d: _ids(d, "val.bin", f"token 100 of {N_VAL} is {VOCAB}"),
    ),
}
META_CASES: dict[str, tuple[Callable[[Path], Path], Callable[[Path], str]]] = {
    "meta.json without vocab_size": (
        lambda p: edit_meta(token_folder(p), lambda m: m.pop("vocab_size")),
        lambda d: "vocab_size is missing",
    ),
    "a split without n_tokens": (
        lambda p: edit_meta(token_folder(p), lambda m: m["splits"]["train"].pop("n_tokens")),
        lambda d: "splits.train.n_tokens is missing",
    ),
    "a split without file": (
        lambda p: edit_meta(token_folder(p), lambda m: m["splits"]["val"].pop("file")),
        lambda d: "splits.val.file is missing",
    ),
    "splits as a list": (
        lambda p: edit_meta(token_folder(p), lambda m: m.update(splits=list(m["splits"].values()))),
        lambda d: 'splits is a list, expected a mapping of split name to its record ({"train": {...}})',
    ),
    "vocab_size as a string": (
        lambda p: token_folder(p, vocab_size=str(VOCAB)),
        lambda d: f"vocab_size '{VOCAB}' is a string, expected an integer >= 1 (the ids of its tokenizer)",
    ),
    "n_tokens as a float": (
        lambda p: edit_meta(token_folder(p), lambda m: m["splits"]["train"].update(n_tokens=float(N_TRAIN))),
        lambda d: f"splits.train.n_tokens {N_TRAIN}.0 is a float, expected an integer >= 0 (the tokens in train.bin)",
    ),
    "n_tokens as a string": (
        lambda p: edit_meta(token_folder(p), lambda m: m["splits"]["train"].update(n_tokens=str(N_TRAIN))),
        lambda d: f"splits.train.n_tokens '{N_TRAIN}' is a string, expected an integer >= 0 (the tokens in train.bin)",
    ),
    "vocab_size -1": (
        lambda p: token_folder(p, vocab_size=-1),
        lambda d: "vocab_size -1 is below 1, expected an integer >= 1 (the ids of its tokenizer)",
    ),
    "an eot_token_id past the vocabulary": (
        lambda p: token_folder(p, eot_token_id=VOCAB),
        lambda d: f"eot_token_id {VOCAB} is outside its vocabulary [0, {VOCAB}) (vocab_size)",
    ),
}


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory) -> Path:
    return make_hf_folder(tmp_path_factory.mktemp("hf") / "tiny")


def meta_line(d: Path, problem: str) -> str:
    """load_meta's line for a meta.json problem."""
    return f"{d / 'meta.json'}: {problem}; {_refix(d)}"


def snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.mark.bad_input
@pytest.mark.parametrize("case", [*ID_CASES, *META_CASES])
def test_train_refuses_a_bad_token_folder_up_front(capsys, tmp_path, case):
    make, problem = ID_CASES.get(case) or META_CASES[case]
    d = make(tmp_path / "tok")
    before = snapshot(d)
    out = tmp_path / "run"
    line = train_fails(capsys, [*ARGV, "--data", str(d), "--out_dir", str(out)])
    want = f"--data {d}: {problem(d)}" if case in ID_CASES else meta_line(d, problem(d))
    assert line == f"growlm-train: error: {want}"
    assert not out.exists() and snapshot(d) == before  # nothing written, not even the ids' record


@pytest.mark.bad_input
@pytest.mark.parametrize("case", [*ID_CASES, *META_CASES])
def test_open_tokens_refuses_what_train_refuses(tmp_path, case):
    """growlm-experiment (eval/experiments/train_run.py) and the benchmarks read token folders with open_tokens."""
    make, problem = ID_CASES.get(case) or META_CASES[case]
    d = make(tmp_path / "tok")
    want = problem(d) if case in ID_CASES else meta_line(d, problem(d))
    with pytest.raises(TokenFolderError) as err:
        for split in ("train", "val"):
            open_tokens(d, split)
    assert str(err.value) == want and isinstance(err.value, ValueError)


@pytest.mark.bad_input
@pytest.mark.parametrize("case", list(META_CASES))
def test_growlm_eval_and_growlm_prepare_refuse_a_bad_token_folder_as_tokenizer(capsys, tmp_path, hf_model, case):
    from growlm.eval.metrics import cli as eval_cli  # lazy: transformers, only for this test

    make, problem = META_CASES[case]
    d = make(tmp_path / "tok")
    capsys.readouterr()
    assert eval_cli.main([str(hf_model), "--tokenizer", str(d), "--sets", "heldout", "--no_progress"]) == 2
    assert one_error_line(capsys.readouterr().err, "growlm-eval") == f"--tokenizer {d}: {meta_line(d, problem(d))}"
    with pytest.raises(tok.TokenizerError) as err:  # a checkpoint's own token folder, as growlm-eval reads it
        tok.from_run_data(str(d), None)
    assert str(err.value) == f"its token folder is damaged: {meta_line(d, problem(d))}"
    text = tmp_path / "a.txt"
    text.write_text("some text\n")
    out = tmp_path / "out"
    assert prepare.main(["--train", str(text), "--val", str(text), "--out", str(out), "--tokenizer", str(d)]) == 2
    assert one_error_line(capsys.readouterr().err, "growlm-prepare") == meta_line(d, problem(d))
    assert not out.exists()


@pytest.mark.bad_input
def test_growlm_prepare_refuses_a_tokenizer_larger_than_its_folders_vocabulary(capsys, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    big_tokenizer(model / "tokenizer.json", ["some text"])  # 70,001 ids
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 65_536}))
    text = tmp_path / "a.txt"
    text.write_text("some text\n")
    out = tmp_path / "out"
    assert prepare.main(["--train", str(text), "--val", str(text), "--out", str(out), "--tokenizer", str(model)]) == 2
    assert one_error_line(capsys.readouterr().err, "growlm-prepare") == (
        f"{model}: its tokenizer has 70001 tokens, more than vocab_size 65536 in config.json: it is not this model's "
        "tokenizer; put the model's own tokenizer.json beside it"
    )
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "model"]


def test_the_largest_id_is_recorded_or_scanned_once(tmp_path, monkeypatch):
    scans: list[int] = []
    real = tokens.scan_max_id
    monkeypatch.setattr(tokens, "scan_max_id", lambda t: scans.append(len(t)) or real(t))
    # growlm-prepare records it: never scanned
    text = tmp_path / "a.txt"
    text.write_text("some text to tokenize\n")
    new = prepare.prepare_dataset([text], [text], tmp_path / "new")
    meta = load_meta(new)
    assert [meta["splits"][s]["max_id"] for s in ("train", "val")] == [int(open_tokens(new, "train").max())] * 2
    assert scans == [] and not (new / MAX_IDS_FILE).exists()
    # an older folder (no max_id): scanned on its first read, kept beside meta.json, not scanned again
    old = token_folder(tmp_path / "old")
    for _ in range(2):
        open_tokens(old, "train"), open_tokens(old, "val")
    assert scans == [N_TRAIN, N_VAL]
    kept = json.loads((old / MAX_IDS_FILE).read_text())
    assert {s: kept[s]["max_id"] for s in kept} == {"train": 999, "val": 511}
    # a .bin changed since (another mtime) is scanned again, and its ids are checked
    bad = np.arange(N_VAL) % 1000
    bad[7] = VOCAB
    (old / "val.bin").write_bytes(bad.astype("<u4").tobytes())
    os.utime(old / "val.bin", ns=(os.stat(old / "val.bin").st_atime_ns, kept["val"]["mtime_ns"] + 10**9))
    with pytest.raises(TokenFolderError, match=re.escape(f"token 7 of {N_VAL} is {VOCAB}")):
        open_tokens(old, "val")
    assert scans == [N_TRAIN, N_VAL, N_VAL] and json.loads((old / MAX_IDS_FILE).read_text()) == kept
    # a recorded max_id whose .bin is newer than meta.json is not trusted
    (new / "train.bin").write_bytes(np.full(len(open_tokens(new, "train")), 60_000, dtype="<u2").tobytes())
    later = os.stat(new / "meta.json").st_mtime_ns + 10**9
    os.utime(new / "train.bin", ns=(later, later))
    with pytest.raises(TokenFolderError, match=re.escape("is 60000, outside the folder's vocabulary [0, 50257)")):
        open_tokens(new, "train")
    # a folder holding the kept ids is still growlm-prepare's to replace
    assert prepare.main(["--train", str(text), "--val", str(text), "--out", str(old), "--overwrite"]) == 0
    assert not (old / MAX_IDS_FILE).exists()
