"""growlm-grow --export_hf of a Llama checkpoint: a transformers Llama folder -> train.py --init_from (two steps that
move the weights) -> export. The export is a LlamaForCausalLM folder that transformers loads, whose logits equal
growlm's on the checkpoint (1e-5, fp32), with the folder's tokenizer carried (AutoTokenizer encodes as the source
folder's tokenizer does, its end-of-text id the config's eos_token_id)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from dist_utils import run_ranks, write_ds_config
from llama_folder_helpers import VOCAB, llama_token_folder, make_llama_folder

from growlm.data import tokenizer as tok
from growlm.eval.metrics.load import load
from growlm.growth.offline.cli import main as grow_main

TEXT = "The tempest rose over the island, and the sailors cried out to the sea and to the sky above them."


def train_from(tmp_path: Path, folder: Path, template: str, nproc: int, lr: float = 3e-3) -> Path:
    """train.py --init_from ``folder`` for 2 steps on its own tokens; returns the checkpoints folder."""
    data = llama_token_folder(tmp_path / "tokens", folder)
    cfg = write_ds_config(
        tmp_path / "ds.json", template, train_micro_batch_size_per_gpu=2, lr=lr, scheduler_warmup_num_steps=1
    )  # fmt: skip (a warm-up within the run: growlm-grow places it)
    out = tmp_path / "run"
    r = run_ranks(["--seq_len", "32", "--no_final_eval", "--max_steps", "2", "--init_from", str(folder), "--data",
                   str(data), "--ds_config", str(cfg), "--out_dir", str(out)], nproc=nproc)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:]
    return out / "checkpoints"


ODD_SHAPE = {"rope_theta": 5e5, "head_dim": 32}  # not the defaults: head_dim != n_embd / n_head = 16, theta != 1e4


@pytest.mark.parametrize(
    ("tied", "template", "nproc", "over"), [(False, "zero2_fp32", 1, ODD_SHAPE), (True, "zero3_fp32", 2, {})]
)
def test_export_is_a_llama_folder_with_growlms_logits_and_the_tokenizer(tmp_path, tied, template, nproc, over):
    """The export loads as a LlamaForCausalLM with the checkpoint's logits and the folder's tokenizer, and its
    config.json carries the rotary base both where transformers 4 reads it (top-level rope_theta) and where
    transformers 5 does (rope_parameters), and head_dim: the export of a Llama with rope_theta 5e5 and head_dim 32
    (n_embd 64, n_head 4) loads with the checkpoint's logits from either key alone."""
    from safetensors import safe_open
    from transformers import AutoTokenizer, LlamaForCausalLM

    folder = make_llama_folder(tmp_path / "src", tied=tied, **over)
    ckpts = train_from(tmp_path, folder, template, nproc)
    hf_dir = tmp_path / "hf"
    assert grow_main([str(ckpts), "--export_hf", str(hf_dir)]) == 0
    names = {p.name for p in hf_dir.iterdir()}
    assert names == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "growlm_export.json",
        *tok.HF_TOKENIZER_FILES,
    }  # fmt: skip (as GPT-2's export)
    config = json.loads((hf_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert (config["num_key_value_heads"], config["tie_word_embeddings"], config["eos_token_id"]) == (2, tied, 1)
    with safe_open(str(hf_dir / "model.safetensors"), framework="pt") as f:
        assert ("lm_head.weight" in f.keys()) == (not tied)  # noqa: SIM118 (not a dict)

    hf = LlamaForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    source_tok = tok.from_hf_dir(folder)
    ids = torch.tensor([source_tok.encode(TEXT)[:32]])
    assert AutoTokenizer.from_pretrained(str(hf_dir))(TEXT)["input_ids"] == source_tok.encode(TEXT)
    ours = load(ckpts)  # growlm-eval's reading of the checkpoint: growlm's Llama with the fp32 masters
    assert ours.kind == "deepspeed" and ours.tokenizer.encode(TEXT) == source_tok.encode(TEXT)
    with torch.no_grad():
        theirs, mine = hf(ids).logits, ours.logits_fn(ids)
        before = LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()(ids).logits
    assert theirs.shape == (1, ids.shape[1], VOCAB)
    assert float((theirs - mine).abs().max()) < 1e-5
    assert float((theirs - before).abs().max()) > 1e-3  # the two steps moved the weights: this is the trained model

    theta, head_dim = over.get("rope_theta", 1e4), over.get("head_dim", 16)
    assert (config["rope_theta"], config["rope_parameters"], config["head_dim"]) == (
        theta, {"rope_theta": theta, "rope_type": "default"}, head_dim
    )  # fmt: skip
    assert (ours.config.rope_theta, ours.config.head_dim) == (theta, head_dim)
    # a transformers 4 reader sees only the top-level keys: the folder without rope_parameters loads the same model
    # (transformers 5 takes a lone top-level rope_theta as 4 does), and with a wrong top-level theta it would not
    for name, edit in [("v4", {"rope_theta": theta}), ("wrong", {"rope_theta": 1e4 if theta != 1e4 else 5e5})]:
        other = tmp_path / name
        other.mkdir()
        for f in ("model.safetensors", "generation_config.json"):
            (other / f).write_bytes((hf_dir / f).read_bytes())
        legacy = {k: v for k, v in config.items() if k != "rope_parameters"} | edit
        (other / "config.json").write_text(json.dumps(legacy))
        with torch.no_grad():
            logits = LlamaForCausalLM.from_pretrained(str(other), dtype=torch.float32).eval()(ids).logits
        assert (float((logits - mine).abs().max()) < 1e-5) == (name == "v4"), name


def test_folder_init_from_grown_by_width_and_depth_then_exported_scores_as_growlm_eval(tmp_path):
    """The whole path: a transformers Llama folder -> --init_from, 2 steps at LR 0 -> growlm-grow by width (d 64 ->
    128, H 4 -> 8, K 2 -> 4, F 96 -> 192) and depth (L 2 -> 4), duplicate family -> --export_hf. transformers' loss
    of the export on a fixed batch equals growlm-eval's on the grown checkpoint (1e-5, fp32), and so do growlm-eval's
    scores of a held-out text on both forms; the exact growth keeps the folder's own logits."""
    from transformers import LlamaForCausalLM

    from growlm.eval.metrics import cli

    folder = make_llama_folder(tmp_path / "src")
    ckpts = train_from(tmp_path, folder, "zero2_fp32", 1, lr=0.0)
    grown = tmp_path / "grown"
    grow = ["--family", "duplicate", "--n_layer", "4", "--n_embd", "128", "--n_head", "8", "--n_kv_head", "4",
            "--n_inner", "192"]  # fmt: skip
    assert grow_main([str(ckpts), str(grown), *grow]) == 0
    hf_dir = tmp_path / "hf"
    assert grow_main([str(grown), "--export_hf", str(hf_dir)]) == 0
    config = json.loads((hf_dir / "config.json").read_text())
    shape = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size")
    assert [config[k] for k in shape] == [4, 128, 8, 4, 192] and config["head_dim"] == 16

    ours = load(grown)  # growlm-eval's reading of the grown checkpoint
    assert ours.config.n_layer == 4 and ours.config.n_kv_head == 4
    ids = torch.tensor([ours.tokenizer.encode(TEXT)[:33]] * 2)
    hf = LlamaForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = hf(ids, labels=ids).loss  # transformers' own shifted cross entropy
        logits = ours.logits_fn(ids)
    mine = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    assert float(theirs) == pytest.approx(float(mine), abs=1e-5)
    before = load(folder)
    with torch.no_grad():
        # the duplicate family is exact (new blocks' residual outputs zero, widths duplicated and split): the grown
        # export computes what the original folder computed, on weights of another shape
        assert float((before.logits_fn(ids) - logits).abs().max()) < 1e-5

    text = tmp_path / "heldout.raw"
    text.write_text(TEXT * 20)
    files = cli.read_eval_files(str(text), None)
    a = cli.evaluate(ours, [], context=64, stride=32, files=files, progress=False)["results"]["wikitext_file"]
    b = cli.evaluate(load(hf_dir), [], context=64, stride=32, files=files, progress=False)["results"]["wikitext_file"]
    assert a["tokens"] == b["tokens"] > 300
    assert a["total_nll"] == pytest.approx(b["total_nll"], rel=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_large_vocabulary_folder_goes_through_init_from_growth_and_export(tmp_path, family):
    """Today's models end to end: a transformers-written random LlamaForCausalLM with "llama3" rotary scaling
    (original context 16 < 64 positions; Llama 3.x's kind), or a Qwen2ForCausalLM (q/k/v biases, rope_theta 1e6), each
    GQA with a tied head and a 70,001-id tokenizer (uint32 token files, ids past 65,535) -> growlm-prepare
    --tokenizer -> --init_from at 2-rank ZeRO-3 (LR 0) -> growlm-grow depth x2, width x2 and more heads (duplicate:
    exact) -> --export_hf. The export loads as the source's class, with the same rotary embedding, and its
    transformers loss equals the source folder's within 1e-4."""
    from tokenizer_helpers import big_tokenizer
    from transformers import AutoModelForCausalLM

    from growlm.data.prepare import builtin_corpus_files
    from growlm.data.text import read_text
    from growlm.data.tokens import load_meta

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}  # fmt: skip
    kind = {"llama": dict(rope_theta=5e5, rope_scaling=scaling), "qwen2": dict(rope_theta=1e6, family="qwen2")}[family]
    folder = make_llama_folder(tmp_path / "src", tied=True, tokenizer=False, vocab_size=70_001, **kind)
    cls = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[family]
    train, _ = builtin_corpus_files()
    big_tokenizer(folder / "tokenizer.json", [read_text(train[0])[:40_000]])
    ckpts = train_from(tmp_path, folder, "zero3_fp32", 2, lr=0.0)
    assert load_meta(tmp_path / "tokens")["dtype"] == "uint32"
    grown = tmp_path / "grown"
    grow = ["--family", "duplicate", "--n_layer", "4", "--n_embd", "128", "--n_head", "8"]  # K and F follow the width
    assert grow_main([str(ckpts), str(grown), *grow]) == 0
    hf_dir = tmp_path / "hf"
    assert grow_main([str(grown), "--export_hf", str(hf_dir)]) == 0
    config = json.loads((hf_dir / "config.json").read_text())
    shape = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size")
    assert [config[k] for k in shape] == [4, 128, 8, 4, 192] and config["architectures"] == [cls]
    if family == "llama":
        assert config["rope_scaling"]["rope_type"] == "llama3" and config["rope_scaling"]["factor"] == 8.0
    assert config["rope_theta"] == kind["rope_theta"]

    ids = torch.tensor([tok.from_hf_dir(folder).encode(read_text(train[0])[:2000])[:64]] * 2)
    assert int(ids.max()) > 65_535
    losses = []
    for path in (folder, hf_dir):
        hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
        assert type(hf).__name__ == cls
        assert hf.config.rope_parameters["rope_type"] == ("llama3" if family == "llama" else "default")
        if family == "qwen2":
            assert hf.model.layers[-1].self_attn.q_proj.bias.abs().max() > 0
        with torch.no_grad():
            losses.append(float(hf(ids, labels=ids).loss))
    assert losses[1] == pytest.approx(losses[0], abs=1e-4), losses
    ours, exported = load(grown), load(hf_dir)  # growlm-eval's readings of the grown checkpoint and of its export
    assert ours.config.arch == exported.config.arch == family and ours.kind == "deepspeed"
    with torch.no_grad():
        assert float((ours.logits_fn(ids) - exported.logits_fn(ids)).abs().max()) < 1e-4
