"""train.py --init_from DIR, real runs: a transformers GPT-2 folder goes into a fresh engine exactly (export ->
init_from -> export round-trips every weight bit for bit, at ZeRO-2 on 1 rank and ZeRO-3 on 2 ranks), the fp32
masters of a bf16 run equal the loaded weights before the first step, the first loss is transformers' loss, a
resume no longer needs the folder, and a growth plan can start from the loaded model."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from dist_utils import read_metrics, run_ranks, write_ds_config
from init_from_helpers import make_hf_folder, read_weights

from growlm.growth.offline.cli import main as grow_main

RUN = ["--seq_len", "32", "--no_final_eval", "--log_interval", "1"]
# bf16 rounds weights and activations to an 8-bit mantissa (relative 2^-9 per value); on this ~10.8-nat loss the
# bf16 forward differs from transformers' fp32 one by ~2e-4 (measured): 1e-2 leaves room, a wrong weight does not
BF16_LOSS_TOL = 1e-2


def state_of(tag: Path) -> dict:
    return json.loads((tag / "growlm_state.json").read_text())


def round_trip(tmp_path: Path, template: str, nproc: int) -> tuple[Path, Path]:
    """export -> train.py --init_from (one step at LR 0: the weights must stay the folder's) -> export; asserts
    the two exports hold the same tensors to 0.0 and returns (folder, run dir)."""
    src = make_hf_folder(tmp_path / "hf")
    cfg = write_ds_config(tmp_path / "lr0.json", template, train_micro_batch_size_per_gpu=4, lr=0.0)
    out = tmp_path / "run"
    r = run_ranks([*RUN, "--init_from", str(src), "--ds_config", str(cfg), "--max_steps", "1", "--out_dir", str(out)],
                  nproc=nproc)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:]
    assert grow_main([str(out / "checkpoints"), "--export_hf", str(tmp_path / "hf2")]) == 0
    a, b = read_weights(src), read_weights(tmp_path / "hf2")
    assert sorted(a) == sorted(b)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) == 0.0
    state = state_of(out / "checkpoints" / "global_step1")
    sha = hashlib.sha256((src / "model.safetensors").read_bytes()).hexdigest()
    assert state["init_from"] == {"path": str(src), "weights_sha256": sha, "tokenizer": str(src / "tokenizer.json")}
    assert state["zero_stage"] == int(template[4]) and state["world_size"] == nproc
    return src, out


def test_round_trip_zero2_one_rank_and_resume_without_the_folder(tmp_path):
    src, out = round_trip(tmp_path, "zero2_fp32", 1)
    recorded = state_of(out / "checkpoints" / "global_step1")["init_from"]
    shutil.rmtree(src)  # a resume needs only the checkpoint
    r = run_ranks([*RUN, "--resume", str(out / "checkpoints"), "--ds_config", str(tmp_path / "lr0.json"),
                   "--max_steps", "2", "--out_dir", str(out)], nproc=1)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:]
    assert state_of(out / "checkpoints" / "global_step2")["init_from"] == recorded


def test_round_trip_zero3_two_ranks(tmp_path):
    round_trip(tmp_path, "zero3_fp32", 2)


@pytest.mark.parametrize(("template", "nproc"), [("zero0_bf16", 1), ("zero2_bf16", 1), ("zero3_bf16", 2)])
def test_bf16_masters_equal_the_loaded_weights_and_first_loss_is_transformers(tmp_path, template, nproc):
    src = make_hf_folder(tmp_path / "hf")
    cfg = write_ds_config(
        tmp_path / "c.json", template, train_micro_batch_size_per_gpu=4, lr=3e-3, scheduler_warmup_num_steps=2
    )
    out = tmp_path / "probe.json"
    args = [str(out), *RUN, "--init_from", str(src), "--ds_config", str(cfg), "--max_steps", "1",
            "--out_dir", str(tmp_path / "run")]  # fmt: skip
    r = run_ranks(args, nproc=nproc, script="tests/init_from_probe.py")
    assert r.returncode == 0, r.stdout[-3000:]
    d = json.loads(out.read_text())
    assert d["dtype"] == "torch.bfloat16" and d["zero_stage"] == int(template[4])
    assert len(d["master_diff"]) == 28  # every parameter: wte, wpe, 12 per block x 2, ln_f (tied head once)
    assert max(d["master_diff"].values()) == 0.0  # the fp32 masters ARE the loaded weights, not bf16-rounded
    assert max(d["working_diff"].values()) == 0.0  # the bf16 working copies are the masters rounded
    # fresh optimizer, as in a run without --init_from: no Adam state yet, except at ZeRO-0 in bf16, whose wrapper
    # makes it at build with one zero-gradient step (zero moments, step 1: DeepSpeed's own count)
    adam, zero0 = d["adam_before"], template == "zero0_bf16"
    assert adam == {"entries": 28 if zero0 else 0, "max_abs_moment": 0.0, "max_step": 1.0 if zero0 else 0.0}
    assert d["first_step_lr"] == pytest.approx(1.5e-3)  # step 1 of a 2-step linear warm-up to 3e-3
    assert d["first_loss"] == pytest.approx(d["hf_loss"], abs=BF16_LOSS_TOL)
    assert d["first_loss"] != pytest.approx(10.8249, abs=1e-3)  # not the ln(V) of an untrained model's first loss


def test_growth_plan_starts_from_the_loaded_model(tmp_path):
    src = make_hf_folder(tmp_path / "hf")
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "seed: 0\nstart: {preset: tiny, n_positions: 64}\nstages:\n  - name: deeper\n    target: {n_layer: 3}\n"
        "    family: masked\n    when: {step: 1}\n    ramp_steps: 2\n"
    )
    cfg = write_ds_config(tmp_path / "c.json", "zero2_fp32", train_micro_batch_size_per_gpu=4, lr=3e-3,
                          scheduler_warmup_num_steps=2)  # fmt: skip
    out = tmp_path / "run"
    r = run_ranks([*RUN, "--init_from", str(src), "--growth_plan", str(plan), "--ds_config", str(cfg),
                   "--max_steps", "3", "--out_dir", str(out)], nproc=1)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:]
    (growth,) = read_metrics(out, "growth")
    assert growth["step"] == 1 and growth["from"]["n_layer"] == 2 and growth["to"]["n_layer"] == 3
    assert growth["loss_after"] == pytest.approx(growth["loss_before"], abs=1e-5)  # masked growth preserves the loss
    state = state_of(out / "checkpoints" / "global_step3")
    assert state["model_config"]["n_layer"] == 3 and state["init_from"]["path"] == str(src)
