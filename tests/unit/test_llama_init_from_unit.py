"""train.py --init_from with a transformers Llama folder (LlamaForCausalLM written by transformers itself): the
folder is read whole (GQA, tied or untied head, one safetensors file or shards under model.safetensors.index.json,
its own tokenizer with ``</s>`` as end-of-text), and what growlm cannot run exactly is refused before anything is
built, in one line naming the file and the fix (exit status 2)."""

from __future__ import annotations

import hashlib
import json
import shutil
from argparse import Namespace
from pathlib import Path

import pytest
from cli_utils import one_error_line
from llama_folder_helpers import make_llama_folder
from safetensors.torch import load_file, save_file

from growlm import train
from growlm.growth.stages.plan import load_stages
from growlm.model.config import LlamaConfig
from growlm.trainer.errors import UsageError
from growlm.trainer.init_from import check_plan_start, open_init_from

FLAGS = ["--seq_len", "32", "--no_final_eval", "--max_steps", "1", "--ds_config", "ds_configs/zero2_fp32.json"]
NAMES = ("resume", "preset", "n_layer", "n_embd", "n_head", "n_inner", "n_positions", "vocab_size", "dropout")


def opened(path: Path, **flags):
    """open_init_from of ``path`` with no other flag than ``flags``."""
    return open_init_from(Namespace(**(dict.fromkeys(NAMES) | flags), init_from=str(path)))


def fails(capsys, folder: Path, *needles: str) -> str:
    """train.py --init_from FOLDER exits 2 with exactly one stderr line (no transformers warning, no traceback)
    holding every needle; returns the line after ``growlm-train: error: ``."""
    capsys.readouterr()  # what writing the folder printed (save_pretrained's progress bar)
    assert train.main([*FLAGS, "--init_from", str(folder), "--out_dir", str(folder.parent / "run")]) == 2
    line = one_error_line(capsys.readouterr().err, "growlm-train")
    assert line.startswith(f"--init_from {folder}: ")
    for n in needles:
        assert n in line, line
    assert not (folder.parent / "run").exists()
    return line


@pytest.fixture(scope="module")
def untied(tmp_path_factory) -> Path:
    return make_llama_folder(tmp_path_factory.mktemp("llama") / "untied")


def copy(src: Path, dst: Path, *drop: str) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*drop))
    return dst


def edit_config(folder: Path, **changes) -> None:
    d = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(d | changes))


def test_untied_gqa_folder_is_read_whole(untied):
    src = opened(untied, dropout=0.1)
    assert src.config == LlamaConfig(n_layer=2, n_embd=64, n_head=4, n_kv_head=2, n_inner=96, head_dim=16,
                                     n_positions=64, vocab_size=300, rms_norm_eps=1e-6, dropout=0.1)  # fmt: skip
    assert len(src.keys) == 2 + 2 * 9 + 1  # embed_tokens, norm, lm_head; 9 per layer
    assert src.keys["lm_head.weight"] == "lm_head.weight" and set(src.files.values()) == {untied / "model.safetensors"}
    assert src.sha256 == hashlib.sha256((untied / "model.safetensors").read_bytes()).hexdigest()
    t = src.tokenizer
    assert (t.eot_token, t.eot_token_id, t.vocab_size) == ("</s>", 1, 300)
    assert src.identity.tokenizer == str(untied / "tokenizer.json")


def test_tied_folder_lists_the_head_once(tmp_path):
    src = opened(make_llama_folder(tmp_path / "tied", tied=True))
    assert src.config.tie_word_embeddings and "lm_head.weight" not in src.keys and len(src.keys) == 20


def test_sharded_folder_maps_each_tensor_to_its_shard(tmp_path, untied):
    d = make_llama_folder(tmp_path / "sharded", max_shard_size="40KB")
    shards = sorted(d.glob("model-*.safetensors"))
    assert len(shards) > 3 and not (d / "model.safetensors").exists()
    src = opened(d)
    assert src.weights == d / "model.safetensors.index.json" and set(src.files.values()) == set(shards)
    index = json.loads(src.weights.read_text())["weight_map"]
    assert all(src.files[k].name == index[k] for k in src.keys.values())
    assert src.sha256 == hashlib.sha256(b"".join(p.read_bytes() for p in shards)).hexdigest()
    assert src.config == opened(untied).config


@pytest.mark.bad_input
def test_llama_variants_growlm_does_not_run_are_refused(capsys, tmp_path, untied):
    d = copy(untied, tmp_path / "v")
    scaling = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8}
    edit_config(d, rope_scaling=scaling)  # a scaling growlm does not compute (Llama 3.1's "llama3" it does)
    fails(capsys, d, "rope type 'yarn'", "growlm computes default, linear, llama3")
    edit_config(d, rope_scaling=None, rope_parameters={"rope_type": "yarn", "rope_theta": 5e5, **scaling})
    fails(capsys, d, "rope type 'yarn'")
    edit_config(d, rope_parameters={"rope_type": "default", "rope_theta": 1e4}, attention_bias=True)
    fails(capsys, d, "attention_bias / mlp_bias (growlm's Llama has no biases)")
    edit_config(d, attention_bias=False, hidden_act="gelu")
    fails(capsys, d, "hidden_act='gelu' (need 'silu')")
    edit_config(d, hidden_act="silu", architectures=["LlamaForSequenceClassification"])
    fails(capsys, d, "architectures LlamaForSequenceClassification, not LlamaForCausalLM")
    edit_config(d, architectures=["LlamaForCausalLM"], model_type="mistral")
    fails(capsys, d, "config.json says model_type 'mistral'; growlm reads GPT-2, Llama and Qwen 2 folders")


@pytest.mark.bad_input
def test_missing_or_damaged_safetensors_are_refused(capsys, tmp_path, untied):
    d = copy(untied, tmp_path / "none", "model.safetensors")
    fails(capsys, d, "has no model.safetensors (nor model.safetensors.index.json)")
    (d / "pytorch_model.bin").write_bytes(b"a pickle, never opened")
    fails(capsys, d, "only as pytorch_model.bin, a pickle", "LlamaForCausalLM.from_pretrained(DIR)")
    d = copy(untied, tmp_path / "cut")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    fails(capsys, d, "model.safetensors is truncated", "copy the whole file again")
    (d / "model.safetensors").write_bytes(b"\xff" * 64)
    fails(capsys, d, "model.safetensors is 64 bytes, shorter than its own")


@pytest.mark.bad_input
def test_damaged_shards_are_refused(capsys, tmp_path):
    d = make_llama_folder(tmp_path / "sharded", max_shard_size="40KB", tokenizer=False)
    shards = sorted(d.glob("model-*.safetensors"))
    data = shards[1].read_bytes()
    shards[1].write_bytes(data[:-10])
    fails(capsys, d, f"{shards[1].name} is truncated")
    shards[1].write_bytes(data)
    shards[2].unlink()
    fails(capsys, d, f"model.safetensors.index.json lists {shards[2].name}, which is not in the folder")
    (d / "model.safetensors.index.json").write_text('{"metadata": {}}')
    fails(capsys, d, "model.safetensors.index.json is not a safetensors index")


@pytest.mark.bad_input
def test_weights_that_do_not_fit_the_config_are_refused(capsys, tmp_path, untied):
    d = copy(untied, tmp_path / "t")
    edit_config(d, tie_word_embeddings=True)  # the file's lm_head.weight is then a head of its own, not the tie
    own_head = (
        "config.json sets tie_word_embeddings: true, but lm_head.weight differs from model.embed_tokens.weight: the "
        "folder holds an LM head of its own; set tie_word_embeddings: false"
    )
    fails(capsys, d, own_head)
    weights = load_file(str(d / "model.safetensors"))
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
    save_file(weights, str(d / "model.safetensors"), metadata={"format": "pt"})
    assert opened(d).config.tie_word_embeddings  # a tied folder may carry the head when it equals the embedding
    edit_config(d, tie_word_embeddings=False, num_key_value_heads=4)
    fails(capsys, d, "does not hold the Llama of its config.json", "model.layers.0.self_attn.k_proj.weight (32, 64)")
    t = make_llama_folder(tmp_path / "tied", tied=True, tokenizer=False)
    edit_config(t, tie_word_embeddings=False)
    fails(capsys, t, "missing ['lm_head.weight']")


@pytest.mark.bad_input
def test_a_tokenizer_larger_than_the_vocabulary_is_refused(capsys, tmp_path):
    d = make_llama_folder(tmp_path / "small_vocab", vocab_size=256)
    fails(capsys, d, "its tokenizer has 300 tokens, more than vocab_size 256", "not this model's tokenizer")


@pytest.mark.bad_input
def test_shape_flags_that_differ_from_the_folder_are_refused(capsys, untied):
    capsys.readouterr()
    assert train.main([*FLAGS, "--init_from", str(untied), "--n_inner", "128"]) == 2
    line = one_error_line(capsys.readouterr().err, "growlm-train")
    shape = "llama L=2 d=64 H=4 K=2 Q=16 F=96 P=64 V=300 untied theta=1e4 eps=1e-6"
    assert f"the model shape comes from its config.json ({shape}); drop --n_inner 128" in line


@pytest.mark.bad_input
def test_a_head_tie_that_differs_from_the_folder_names_the_real_flag(capsys, tmp_path, untied):
    """--untie_word_embeddings on a tied folder is named as given (there is no '--tie_word_embeddings False'), and
    the folder's shape says tied or untied, rope_theta and rms_norm_eps."""
    tied = make_llama_folder(tmp_path / "tied", tied=True)
    for folder, argv, end in [
        (tied, ["--untie_word_embeddings"], "V=300 tied theta=1e4 eps=1e-6); drop --untie_word_embeddings"),
        (untied, ["--tie_word_embeddings", "--rope_theta", "5e5"],
         "V=300 untied theta=1e4 eps=1e-6); drop --rope_theta 500000.0, --tie_word_embeddings"),
    ]:  # fmt: skip
        capsys.readouterr()
        assert train.main([*FLAGS, "--init_from", str(folder), *argv, "--out_dir", str(tmp_path / "run")]) == 2
        line = one_error_line(capsys.readouterr().err, "growlm-train")
        assert line.endswith(end) and "True" not in line and "False" not in line, line


def test_a_plan_start_that_differs_only_in_tie_or_theta_names_two_different_shapes(tmp_path, untied):
    """check_plan_start's message names the folder's and the plan's shapes; they differ even where only the head's
    tie, rope_theta or rms_norm_eps does (shape_str names them)."""
    src = opened(untied)
    mine = src.config.shape_str()
    assert mine == "llama L=2 d=64 H=4 K=2 Q=16 F=96 P=64 V=300 untied theta=1e4 eps=1e-6"
    same = "preset: llama-tiny, n_inner: 96, n_positions: 64, vocab_size: 300"
    for change, theirs in [
        ("tie_word_embeddings: true, rms_norm_eps: 1.0e-6", "V=300 tied theta=1e4 eps=1e-6"),
        ("rope_theta: 500000.0, rms_norm_eps: 1.0e-6", "V=300 untied theta=5e5 eps=1e-6"),
        ("rms_norm_eps: 1.0e-5", "V=300 untied theta=1e4 eps=1e-5"),
    ]:
        plan = tmp_path / "plan.yaml"
        plan.write_text(
            f"start: {{{same}, {change}}}\n"
            "stages:\n  - {name: deeper, target: {n_layer: 3}, family: duplicate, when: {step: 2}}\n"
        )
        with pytest.raises(UsageError) as e:
            check_plan_start(src, load_stages(str(plan)), str(plan))
        shape = f"llama L=2 d=64 H=4 K=2 Q=16 F=96 P=64 {theirs}"
        assert f"holds a {mine} model but --growth_plan {plan} starts at {shape}; " in str(e.value)
