"""train.py --init_from: bad folders and flags are refused before anything is built (exit status 2, one line naming
the problem and the fix), nothing foreign is unpickled, and RunState records the source."""

from __future__ import annotations

import json
import pickle
import shutil
from argparse import Namespace
from pathlib import Path

import pytest
from cli_utils import train_fails
from init_from_helpers import TINY, make_hf_folder

from growlm.runtime.run_state import InitSource, RunState
from growlm.trainer.init_from import check_flags, open_init_from

FLAGS = ["--seq_len", "32", "--no_final_eval", "--max_steps", "1", "--ds_config", "ds_configs/zero2_fp32.json"]


def fails(capsys, argv: list[str], *needles: str) -> str:
    return train_fails(capsys, [*FLAGS, *argv], *needles)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    return make_hf_folder(tmp_path_factory.mktemp("hf") / "tiny")


def copy_without(src: Path, dst: Path, *drop: str) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*drop))
    return dst


def test_missing_folder(capsys, tmp_path):
    fails(capsys, ["--init_from", str(tmp_path / "nope")], f"--init_from {tmp_path / 'nope'}: no such folder")


def test_folder_without_config(capsys, tmp_path, hf_dir):
    d = copy_without(hf_dir, tmp_path / "noconfig", "config.json")
    fails(capsys, ["--init_from", str(d)], "has no config.json", "--export_hf")


def test_pickle_weights_are_refused_never_loaded(capsys, tmp_path, hf_dir):
    d = copy_without(hf_dir, tmp_path / "bin", "model.safetensors")
    marker = tmp_path / "unpickled"

    class Evil:  # unpickling it would create ``marker``
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (d / "pytorch_model.bin").write_bytes(pickle.dumps(Evil()))
    line = fails(capsys, ["--init_from", str(d)], "only as pytorch_model.bin, a pickle", "safe_serialization=True")
    assert "model.safetensors" in line
    assert not marker.exists()
    (d / "pytorch_model.bin").unlink()  # no weights at all
    fails(capsys, ["--init_from", str(d)], "has no model.safetensors")


def test_non_gpt2_config(capsys, tmp_path, hf_dir):
    d = copy_without(hf_dir, tmp_path / "llama")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(
        json.dumps({**cfg, "model_type": "mistral", "architectures": ["MistralForCausalLM"]})
    )
    line = fails(capsys, ["--init_from", str(d)])
    assert line == (
        f"growlm-train: error: --init_from {d}: config.json says model_type 'mistral'; growlm reads GPT-2, Llama and "
        "Qwen 2 folders (model_type 'gpt2', GPT2LMHeadModel; 'llama', LlamaForCausalLM; 'qwen2', Qwen2ForCausalLM)"
    )
    (d / "config.json").write_text(json.dumps({**cfg, "activation_function": "relu"}))  # a GPT-2 growlm cannot run
    fails(capsys, ["--init_from", str(d)], "activation_function='relu'")
    (d / "config.json").write_text("{not json")
    fails(capsys, ["--init_from", str(d)], "config.json is not valid JSON")


def test_weights_that_do_not_match_the_config(capsys, tmp_path, hf_dir):
    d = copy_without(hf_dir, tmp_path / "deeper")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "n_layer": 3}))
    fails(capsys, ["--init_from", str(d)], "does not hold the GPT-2 of its config.json", "transformer.h.2.ln_1.weight")
    (d / "config.json").write_text(json.dumps({**cfg, "n_embd": 128}))
    fails(capsys, ["--init_from", str(d)], "wrong shapes", "(50257, 64)")


def test_together_with_resume(capsys, tmp_path, hf_dir):
    fails(capsys, ["--init_from", str(hf_dir), "--resume", str(tmp_path)], "--init_from and --resume are mutually")


def test_conflicting_shape_flags(capsys, hf_dir):
    line = fails(
        capsys, ["--init_from", str(hf_dir), "--n_layer", "3"], "comes from its config.json", "drop --n_layer 3"
    )
    assert TINY.shape_str() in line
    fails(capsys, ["--init_from", str(hf_dir), "--preset", "cpu-small"], "drop --preset cpu-small")
    fails(capsys, ["--init_from", str(hf_dir), "--preset", "gpt5"], "unknown model preset 'gpt5'")


def test_equal_shape_flags_and_dropout_are_accepted(hf_dir):
    names = ("resume", "preset", "n_layer", "n_embd", "n_head", "n_inner", "n_positions", "vocab_size", "dropout")
    args = Namespace(**dict.fromkeys(names), init_from=str(hf_dir))
    args.n_layer, args.n_inner, args.dropout = 2, 256, 0.1  # the folder's L and F (4 * d)
    check_flags(args, hf_dir, TINY)
    src = open_init_from(args)
    assert src.config.dropout == 0.1 and src.config.n_layer == 2 and src.config.vocab_size == 50257
    assert src.keys["transformer.h.1.mlp.c_fc.weight"] == "transformer.h.1.mlp.c_fc.weight"
    assert src.identity.tokenizer == str(hf_dir / "tokenizer.json") and len(src.identity.weights_sha256) == 64


def test_growth_plan_must_start_at_the_loaded_shape(capsys, tmp_path, hf_dir):
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "seed: 0\nstart: {preset: tiny, n_layer: 1}\nstages:\n  - name: deeper\n    target: {n_layer: 2}\n"
        "    family: masked\n    when: {step: 2}\n    ramp_steps: 2\n"
    )
    line = fails(capsys, ["--init_from", str(hf_dir), "--growth_plan", str(plan)], "holds a L=2 d=64", "starts at L=1")
    assert f"--growth_plan {plan}" in line


def test_tokenizer_must_match_the_data(capsys, tmp_path, hf_dir, builtin_data):
    from growlm.data.small_vocab import train_tokenizer

    d = copy_without(hf_dir, tmp_path / "othertok", "tokenizer.json")
    train_tokenizer(["a small text about tokenizers and models, " * 50], 300).save(str(d / "tokenizer.json"))
    fails(capsys, ["--init_from", str(d)], "encodes text differently", f"--init_from {d}")


def test_run_state_records_the_source():
    src = InitSource(path="export/hf", weights_sha256="ab" * 32, tokenizer="export/hf/tokenizer.json")
    state = RunState(model_config=TINY, global_step=3, consumed_samples=12, seq_len=32, world_size=2, zero_stage=3,
                     seed=1, init_from=src)  # fmt: skip
    back = RunState.from_json(state.dumps())
    assert back.init_from == src and back.extra == {}
    plain = RunState(
        model_config=TINY, global_step=3, consumed_samples=12, seq_len=32, world_size=2, zero_stage=3, seed=1
    )
    assert "init_from" not in plain.to_json() and RunState.from_json(plain.dumps()).init_from is None


def test_stage0_masters_map_each_parameter_to_its_fp32_master():
    """ZeRO stage 0 wrappers: FP16_Optimizer (fused Adam, GPUs) keeps one flat fp32 master per group, and
    FP16_UnfusedOptimizer one per parameter; writing a parameter's master must write exactly its slice."""
    import torch

    from growlm.trainer.init_from import stage0_masters

    groups = [[torch.ones(2, 3, dtype=torch.bfloat16), torch.ones(4, dtype=torch.bfloat16)], [torch.ones(5, 1)]]
    fused = Namespace(fp16_groups=groups, fp32_groups_flat=[torch.zeros(10), torch.zeros(5)])
    masters = stage0_masters(Namespace(optimizer=fused))
    masters[id(groups[0][1])].copy_(torch.arange(4.0))
    masters[id(groups[1][0])].fill_(7.0)
    assert fused.fp32_groups_flat[0].tolist() == [0.0] * 6 + [0.0, 1.0, 2.0, 3.0]
    assert fused.fp32_groups_flat[1].tolist() == [7.0] * 5
    assert masters[id(groups[0][0])].shape == (2, 3)
    unfused = Namespace(fp16_groups=groups, fp32_groups=[[torch.zeros(2, 3), torch.zeros(4)], [torch.zeros(5, 1)]])
    masters = stage0_masters(Namespace(optimizer=unfused))
    assert masters[id(groups[0][1])].data_ptr() == unfused.fp32_groups[0][1].data_ptr()
    assert stage0_masters(Namespace(optimizer=torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1))) == {}
