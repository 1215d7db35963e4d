"""An exported model is self-sufficient: ``growlm-grow CKPT --export_hf DIR`` carries the model's own tokenizer (GPT-2
BPE, or the trained tokenizer.json of a small-vocabulary run), ``transformers.AutoTokenizer`` loads it offline,
``growlm-eval DIR`` scores exactly as on the checkpoint, every scorer refuses token ids outside the model's
vocabulary with EvalInputError, and every written file follows the umask."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from dist_utils import run_ranks, write_ds_config

from growlm.data import tokenizer as tok
from growlm.data.prepare import builtin_corpus_files
from growlm.data.small_vocab import EOT, train_tokenizer
from growlm.data.text import read_text
from growlm.data.tokens import TokenFolderWriter
from growlm.eval.metrics import cli
from growlm.eval.metrics.cloze import build_cloze
from growlm.eval.metrics.load import load
from growlm.growth.offline.cli import main as grow_main
from growlm.trainer.scoring import EvalInputError

SMALL_V = 320
MISMATCH = "tokenizer/model mismatch"


def grow(*argv) -> int:
    return grow_main([str(a) for a in argv])


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def heldout_text(chars: int = 6000) -> str:
    _, val = builtin_corpus_files()
    return read_text(val[0])[20000 : 20000 + chars]


# ----- the tokenizer files ------------------------------------------------------------------------------------------


def small_vocab_folder(out: Path) -> Path:
    """A token folder in data.small_vocab's format with a real ByteLevel BPE of SMALL_V tokens, trained on a slice
    of the built-in train split (fast), meta.json naming its tokenizer.json."""
    train, val = builtin_corpus_files()
    train_texts = [read_text(p)[:60000] for p in train[:3]]
    bpe = train_tokenizer(train_texts, SMALL_V)
    eot = bpe.token_to_id(EOT)
    with TokenFolderWriter(out) as w:
        bpe.save(str(w.staging / "tokenizer.json"))
        splits = {}
        for split, texts in (("train", train_texts), ("val", [read_text(val[0])[:20000]])):
            sw = w.split(split)
            sw.write(np.concatenate([np.asarray([*e.ids, eot]) for e in bpe.encode_batch(texts)]))
            splits[split] = sw.record(len(texts), [])
        return w.finish(
            tokenizer=f"bytelevel-bpe-{SMALL_V}",
            tokenizer_file="tokenizer.json",
            vocab_size=bpe.get_vocab_size(),
            eot_token_id=eot,
            splits=splits,
        )


def train_tiny(tmp: Path, *extra: str) -> Path:
    """A 1-rank ZeRO-2 tiny run of 3 steps; returns its checkpoints folder."""
    ds = write_ds_config(tmp / "ds.json", "zero2_fp32", train_micro_batch_size_per_gpu=2)
    args = ["--preset", "tiny", "--seq_len", "32", "--no_final_eval", "--ds_config", str(ds), "--max_steps", "3"]
    r = run_ranks([*args, *extra, "--out_dir", str(tmp / "run")], nproc=1)
    assert r.returncode == 0, r.stdout[-3000:]
    return tmp / "run" / "checkpoints"


def eval_files(tmp: Path) -> cli.EvalFiles:
    text = heldout_text()
    (tmp / "wiki.raw").write_text(text)
    items = build_cloze(text, min_context_words=10)[:12]
    (tmp / "lambada.jsonl").write_text("".join(json.dumps({"text": f"{i.context} {i.target}"}) + "\n" for i in items))
    return cli.read_eval_files(str(tmp / "wiki.raw"), str(tmp / "lambada.jsonl"))


def scores(path: Path, files: cli.EvalFiles) -> dict:
    m = load(path)
    res = cli.evaluate(m, [], context=64, stride=32, files=files, progress=False)["results"]
    return {"tokenizer_vocab": m.tokenizer.vocab_size, **res["wikitext_file"], **res["lambada_file"]}


def assert_same_scores(a: dict, b: dict) -> None:
    for k in ("tokenizer_vocab", "tokens", "words", "n_items", "n_correct", "n_target_tokens"):
        assert a[k] == b[k], k
    for k in ("total_nll", "token_perplexity", "target_nll_per_word"):
        assert a[k] == pytest.approx(b[k], rel=1e-5), k


def check_modes(folder: Path) -> None:
    """Every file is 0644 under umask 022 (DeepSpeed's recovery scripts zero_to_*.py, executable: 0755), every
    folder 0755."""
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert files
    for p in files:
        assert p.stat().st_mode & 0o777 == (0o755 if p.name.startswith("zero_to_") else 0o644), p
    for d in [folder, *(p for p in folder.rglob("*") if p.is_dir())]:
        assert d.stat().st_mode & 0o777 == 0o755, d


def test_gpt2_model_export_carries_gpt2_bpe_and_scores_as_the_checkpoint(tmp_path, builtin_data, umask_022):
    from transformers import AutoTokenizer

    ckpts = train_tiny(tmp_path)
    check_modes(ckpts)  # train.py's checkpoint: 0644 under umask 022
    hf_dir = tmp_path / "hf"
    assert grow(ckpts, "--export_hf", hf_dir) == 0
    names = {p.name for p in hf_dir.iterdir()}
    assert {"config.json", "model.safetensors", *tok.HF_TOKENIZER_FILES} <= names, names  # + generation_config.json
    check_modes(hf_dir)
    assert json.loads((hf_dir / "config.json").read_text())["eos_token_id"] == 50256
    assert AutoTokenizer.from_pretrained(str(hf_dir))("Hello world")["input_ids"] == [15496, 995]
    files = eval_files(tmp_path)
    a, b = scores(ckpts, files), scores(hf_dir, files)
    assert a["tokenizer_vocab"] == 50257 and a["tokens"] > 1000
    assert_same_scores(a, b)
    grown = tmp_path / "resharded"
    assert grow(ckpts, grown) == 0  # growlm-grow's checkpoint: the umask's modes too
    check_modes(grown)


def test_small_vocab_model_export_carries_its_trained_tokenizer(tmp_path, capsys, umask_022):
    from transformers import AutoTokenizer

    data = small_vocab_folder(tmp_path / "bpe")
    ckpts = train_tiny(tmp_path, "--data", str(data), "--vocab_size", str(SMALL_V))
    hf_dir = tmp_path / "hf"
    assert grow(ckpts, "--export_hf", hf_dir) == 0
    check_modes(hf_dir)
    trained = tok.from_file(data / "tokenizer.json")
    text = heldout_text(3000)
    assert AutoTokenizer.from_pretrained(str(hf_dir))(text)["input_ids"] == trained.encode(text)
    assert json.loads((hf_dir / "config.json").read_text())["eos_token_id"] == trained.eot_token_id
    files = eval_files(tmp_path)
    a, b = scores(ckpts, files), scores(hf_dir, files)
    assert a["tokenizer_vocab"] == SMALL_V and a["n_items"] == len(files.lambada_items) >= 5
    assert_same_scores(a, b)
    assert cli.main([str(hf_dir), "--sets", "", "--lambada", files.lambada, "--context", "64", "--no_progress"]) == 0
    capsys.readouterr()

    # GPT-2 BPE on this model: refused with the mismatch named, never an IndexError
    assert cli.main([str(hf_dir), "--sets", "", "--lambada", files.lambada, "--tokenizer", "gpt2"]) == 2
    assert "it is not the model's tokenizer" in capsys.readouterr().err  # 50257 tokens > vocab_size 320
    # an export without tokenizer files (as before): refused, naming --tokenizer
    bare = tmp_path / "bare"
    shutil.copytree(hf_dir, bare)
    for name in tok.HF_TOKENIZER_FILES:
        (bare / name).unlink()
    assert cli.main([str(bare), "--sets", "", "--lambada", files.lambada]) == 2
    assert "--tokenizer" in capsys.readouterr().err

    # the token folder is gone: the checkpoint cannot say which tokenizer it used
    data.rename(tmp_path / "moved")
    assert grow(ckpts, "--export_hf", tmp_path / "hf2") == 2
    err = capsys.readouterr().err
    assert "cannot tell which tokenizer" in err and "--tokenizer" in err and not (tmp_path / "hf2").exists()
    with pytest.raises(EvalInputError, match="--tokenizer"):
        load(ckpts)
    assert grow(ckpts, "--export_hf", tmp_path / "hf2", "--tokenizer", "gpt2") == 2  # 50257 tokens > 320
    assert "vocab_size is 320" in capsys.readouterr().err
    assert grow(ckpts, "--export_hf", tmp_path / "hf2", "--tokenizer", tmp_path / "moved" / "tokenizer.json") == 0
    assert_same_scores(scores(tmp_path / "hf2", files), b)
    assert grow(ckpts, tmp_path / "x", "--tokenizer", "gpt2") == 2  # --tokenizer without --export_hf
    assert "needs --export_hf" in capsys.readouterr().err
