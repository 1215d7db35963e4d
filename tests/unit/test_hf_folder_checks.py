"""A transformers folder is read by one reader of its config.json (model.hf_folder: every value checked before
transformers sees it) and one check of its weights against that config (trainer.init_from.read_folder), for
train.py --init_from and growlm-eval alike: both refuse the same folders with the same line (after their own
prefix), exit status 2, no traceback, nothing written and the folder untouched. The folders are the ones a user
sweep found: malformed values transformers raised its own exceptions for (or, a rope factor "8", took), and weights
that are not the model of the config.json, which growlm-eval scored after transformers had filled them in."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from cli_utils import one_error_line
from llama_folder_helpers import make_llama_folder
from safetensors.torch import load_file, save_file

from growlm import train
from growlm.eval.metrics import cli as eval_cli
from growlm.model.hf_folder import config_problem

FLAGS = ["--seq_len", "32", "--no_final_eval", "--max_steps", "1", "--ds_config", "ds_configs/zero2_fp32.json"]
FIX = "correct it in config.json"
LLAMA = "llama L={L} d=64 H=4 K=2 Q=16 F=96 P=64 V={V} untied theta=1e4 eps=1e-6"
OTHER_MODEL = "the two describe different models: put the config.json these weights were saved with beside them"


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return make_llama_folder(tmp_path_factory.mktemp("hf") / "llama")


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory) -> Path:
    return make_llama_folder(tmp_path_factory.mktemp("hf") / "qwen2", family="qwen2")


def edited(src: Path, dst: Path, **changes) -> Path:
    """A copy of ``src`` whose config.json has ``changes`` (a value None removes the field)."""
    shutil.copytree(src, dst)
    d = json.loads((dst / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    (dst / "config.json").write_text(json.dumps(d))
    return dst


def retensored(src: Path, dst: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    """A copy of ``src`` whose model.safetensors holds its tensors after ``edit`` (in place) changed them."""
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def both_refuse(capsys, folder: Path, problem: str) -> None:
    """growlm-eval FOLDER and train.py --init_from FOLDER (each ``main`` in this process) exit 2 with exactly one
    stderr line, ``DIR: problem`` and ``--init_from DIR: problem``; no run folder is made, the folder is as it was."""
    before = snapshot(folder)
    capsys.readouterr()  # what writing the folder printed
    assert eval_cli.main([str(folder), "--sets", "heldout", "--no_progress"]) == 2
    assert one_error_line(capsys.readouterr().err, "growlm-eval") == f"{folder}: {problem}"
    run = folder.parent / f"{folder.name}-run"
    assert train.main([*FLAGS, "--init_from", str(folder), "--out_dir", str(run)]) == 2
    assert one_error_line(capsys.readouterr().err, "growlm-train") == f"--init_from {folder}: {problem}"
    assert not run.exists()
    assert snapshot(folder) == before


LLAMA3 = {"rope_type": "llama3", "factor": "8", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}  # fmt: skip
MALFORMED = {
    "odd head_dim": (
        {"head_dim": 15},
        f"config.json: head_dim is 15, not an even number (rotary embeddings rotate pairs of dimensions); {FIX}",
    ),
    "no heads": ({"num_attention_heads": 0}, f"config.json: num_attention_heads is 0, not a positive integer; {FIX}"),
    "vocab_size a string": (
        {"vocab_size": "300"},
        f'config.json: vocab_size is "300", not a positive integer (a JSON number, without quotes); {FIX}',
    ),
    "5 heads of 64 without head_dim": (
        {"num_attention_heads": 5, "num_key_value_heads": 5, "head_dim": None},
        "config.json: hidden_size 64 is not divisible by num_attention_heads 5 and there is no head_dim; give "
        "head_dim (the width of one head) or correct num_attention_heads in config.json",
    ),
    "llama3 factor a string (transformers 5's rope_parameters)": (
        {"rope_parameters": {**LLAMA3, "rope_theta": 10000.0}},
        f'config.json: rope_parameters.factor is "8", not a positive number (a JSON number, without quotes); {FIX}',
    ),
    "llama3 factor a string (transformers 4's rope_scaling)": (
        {"rope_parameters": None, "rope_theta": 10000.0, "rope_scaling": LLAMA3},
        f'config.json: rope_scaling.factor is "8", not a positive number (a JSON number, without quotes); {FIX}',
    ),
}


@pytest.mark.bad_input
@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_config_value_is_one_line_in_eval_and_init_from(capsys, tmp_path, llama, case):
    changes, problem = MALFORMED[case]
    both_refuse(capsys, edited(llama, tmp_path / "bad", **changes), problem)


def _drop_q_bias(t: dict[str, torch.Tensor]) -> None:
    del t["model.layers.0.self_attn.q_proj.bias"]


def _add_o_bias(t: dict[str, torch.Tensor]) -> None:
    t["model.layers.0.self_attn.o_proj.bias"] = torch.zeros(64)


def _holds_not(what: str, shape: str, found: str) -> str:
    return f"model.safetensors does not hold the {what} of its config.json ({shape}): {found}; {OTHER_MODEL}"


NOT_ITS_MODEL = {
    # transformers fills the bias in, freshly initialised, and says so only in its load report
    "Qwen 2 without q_proj.bias": (
        "qwen2", None, _drop_q_bias,
        _holds_not("Qwen 2", LLAMA.format(L=2, V=300).replace("llama", "qwen2"),
                   "missing ['model.layers.0.self_attn.q_proj.bias']"),
    ),
    # the third layer's tensors: freshly initialised by transformers
    "3 layers over weights of 2": (
        "llama", {"num_hidden_layers": 3}, None,
        _holds_not("Llama", LLAMA.format(L=3, V=300),
                   "missing ['model.layers.2.input_layernorm.weight', 'model.layers.2.self_attn.q_proj.weight', "
                   "'model.layers.2.self_attn.k_proj.weight'] and 6 more"),
    ),
    # transformers: a RuntimeError traceback after its load report
    "a vocabulary of 400 over weights of 300": (
        "llama", {"vocab_size": 400}, None,
        _holds_not("Llama", LLAMA.format(L=2, V=400),
                   "wrong shapes ['model.embed_tokens.weight (300, 64) (config.json says (400, 64))', "
                   "'lm_head.weight (300, 64) (config.json says (400, 64))']"),
    ),
    # transformers drops the tensor it has no place for
    "an o_proj.bias": (
        "llama", None, _add_o_bias,
        _holds_not("Llama", LLAMA.format(L=2, V=300), "unexpected ['model.layers.0.self_attn.o_proj.bias']"),
    ),
    # transformers unties the head (a warning), other versions tie it: two models from one folder
    "a tied config over a head of its own": (
        "llama", {"tie_word_embeddings": True}, None,
        "config.json sets tie_word_embeddings: true, but lm_head.weight differs from model.embed_tokens.weight: the "
        "folder holds an LM head of its own; set tie_word_embeddings: false in config.json to keep it, or remove it "
        "to tie them",
    ),
}  # fmt: skip


@pytest.mark.bad_input
@pytest.mark.parametrize("case", list(NOT_ITS_MODEL))
def test_weights_that_are_not_the_configs_model_are_refused_by_eval_as_by_init_from(capsys, tmp_path, request, case):
    """growlm-eval scored these folders (transformers completed, dropped or untied their tensors, or raised); it
    now refuses each with the line train.py --init_from gives, through the same check."""
    family, changes, edit, problem = NOT_ITS_MODEL[case]
    src = request.getfixturevalue(family)
    folder = retensored(src, tmp_path / "bad", edit) if edit else edited(src, tmp_path / "bad", **changes)
    both_refuse(capsys, folder, problem)


@pytest.mark.parametrize(
    "changes, problem",
    [
        ({"tie_word_embeddings": 1}, f"config.json: tie_word_embeddings is 1, not true or false; {FIX}"),
        ({"attention_bias": "false"},
         f'config.json: attention_bias is "false", not true or false (JSON true or false, without quotes); {FIX}'),
        ({"rms_norm_eps": -1e-6}, f"config.json: rms_norm_eps is -1e-06, not a positive number; {FIX}"),
        ({"rms_norm_eps": float("nan")}, f"config.json: rms_norm_eps is NaN, not a positive number; {FIX}"),
        ({"num_hidden_layers": 2.0}, f"config.json: num_hidden_layers is 2.0, not a positive integer; {FIX}"),
        ({"num_key_value_heads": True}, f"config.json: num_key_value_heads is true, not a positive integer or null; "
         f"{FIX}"),
        ({"attention_dropout": 1.0}, f"config.json: attention_dropout is 1.0, not a number in [0, 1) or null; {FIX}"),
        ({"rope_parameters": [10000.0]}, f"config.json: rope_parameters is [10000.0], not a JSON object or null; "
         f"{FIX}"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": "1e4"}},
         f'config.json: rope_parameters.rope_theta is "1e4", not a positive number (a JSON number, without quotes); '
         f"{FIX}"),
        ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 0}},
         f"config.json: rope_parameters.original_max_position_embeddings is 0, not a positive integer; {FIX}"),
        ({"num_key_value_heads": 3},
         "config.json: num_attention_heads 4 is not a multiple of num_key_value_heads 3 (every key/value head serves "
         "as many query heads); correct one of them in config.json"),
        ({"hidden_size": 60, "num_attention_heads": 4, "head_dim": None},
         "config.json: hidden_size 60 / num_attention_heads 4 gives heads 15 wide, not an even width (rotary "
         "embeddings rotate pairs of dimensions); give an even head_dim or correct num_attention_heads in "
         "config.json"),
        ({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": 0},
         f"config.json: use_sliding_window is 0, not true or false; {FIX}"),
        ({"model_type": "gpt2", "architectures": None, "n_layer": "2"},
         f'config.json: n_layer is "2", not a positive integer (a JSON number, without quotes); {FIX}'),
        ({"model_type": "gpt2", "architectures": None, "attn_pdrop": -0.1},
         f"config.json: attn_pdrop is -0.1, not a number in [0, 1); {FIX}"),
        ({"model_type": "gpt2", "architectures": None, "n_embd": 64, "n_head": 5},
         "config.json: n_embd 64 is not divisible by n_head 5; correct n_head in config.json"),
    ],
)  # fmt: skip
def test_the_config_reader_names_each_malformed_value(changes, problem):
    d = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 300}  # fmt: skip
    d |= changes
    assert config_problem({k: v for k, v in d.items() if v is not None}) == problem


def test_the_config_reader_takes_what_transformers_writes(llama, qwen2, tmp_path):
    """The configs transformers 5 writes (rope_theta only in rope_parameters), transformers 4's (a top-level
    rope_theta, Llama 3.1's llama3 rope_scaling) and growlm's exports pass; so does a null where transformers
    derives the value."""
    from init_from_helpers import make_hf_folder

    for folder in (llama, qwen2, make_hf_folder(tmp_path / "gpt2", tokenizer=False)):
        assert config_problem(json.loads((folder / "config.json").read_text())) is None
    d = json.loads((llama / "config.json").read_text())
    v4 = {**d, "rope_theta": 500000, "rope_parameters": None, "num_key_value_heads": None, "head_dim": None,
          "rope_scaling": {**LLAMA3, "factor": 8.0}}  # fmt: skip
    assert config_problem(v4) is None


@pytest.mark.bad_input
def test_growlm_prepare_reads_a_model_folders_config_with_the_same_reader(capsys, tmp_path, llama):
    """growlm-prepare --tokenizer MODEL_DIR reads the folder's vocab_size through the same reader: a malformed
    config.json is the line train.py and growlm-eval give, and nothing is written; a config.json of a model type
    growlm does not read leaves the tokenizer usable."""
    from growlm.data import prepare

    text = tmp_path / "a.txt"
    text.write_text("The tempest rose over the island.\n")
    folder = edited(llama, tmp_path / "bad", vocab_size="300")
    out = tmp_path / "out"
    capsys.readouterr()
    assert prepare.main(["--train", str(text), "--val", str(text), "--out", str(out), "--tokenizer", str(folder)]) == 2
    assert (
        one_error_line(capsys.readouterr().err, "growlm-prepare") == f"{folder}: {MALFORMED['vocab_size a string'][1]}"
    )
    assert not out.exists()
    other = edited(llama, tmp_path / "mistral", model_type="mistral", architectures=["MistralForCausalLM"], head_dim=15)
    assert prepare.main(["--train", str(text), "--val", str(text), "--out", str(out), "--tokenizer", str(other)]) == 0
    assert (out / "meta.json").is_file()
