"""Bad input to train.py: exit status 2, one clear message that names the problem, nothing overwritten."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
from cli_utils import train_fails as fails
from dist_utils import REPO, base_env, fp16_supported, read_metrics, run_ranks, write_ds_config


@pytest.fixture(scope="module")
def one_rank_checkpoint(tmp_path_factory):
    """A real 1-rank ZeRO-2 checkpoint of the tiny model after 2 steps."""
    out = tmp_path_factory.mktemp("ck") / "run"
    r = subprocess.run(
        [
            sys.executable,
            "train.py",
            "--preset",
            "tiny",
            "--seq_len",
            "32",
            "--no_final_eval",
            "--max_steps",
            "2",
            "--ds_config",
            "ds_configs/zero2_fp32.json",
            "--out_dir",
            str(out),
        ],
        cwd=REPO,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return out


def test_fp16_is_refused_or_trained_as_the_cpu_allows(capsys, tmp_path, builtin_data):
    if not fp16_supported():  # no AVX512-FP16 / AMX-FP16: refused before anything is built, naming the choices
        fails(
            capsys, ["--ds_config", "ds_configs/zero2_fp16.json"], "asks for fp16", "available precisions: fp32, bf16"
        )
        return
    # this CPU trains fp16: a short real ZeRO-2 fp16 run with the dynamic loss scaler (no check lifted)
    cfg = write_ds_config(
        tmp_path / "fp16.json", "zero2_fp16", train_micro_batch_size_per_gpu=4, lr=3e-3, scheduler_warmup_num_steps=2
    )
    out = tmp_path / "run"
    args = ["--preset", "tiny", "--seq_len", "32", "--no_final_eval", "--max_steps", "6", "--log_interval", "1"]
    r = run_ranks([*args, "--ds_config", str(cfg), "--out_dir", str(out)], nproc=1)
    assert r.returncode == 0, r.stdout[-3000:]
    steps = read_metrics(out)
    assert [s["step"] for s in steps] == list(range(1, 7))
    # the scaler starts at 2**16 (initial_scale_power) and halves once per overflow step, which is skipped
    skipped = steps[-1]["skipped_steps"]
    assert steps[-1]["loss_scale"] == 2.0**16 / 2**skipped, (skipped, steps[-1]["loss_scale"])
    assert skipped < 6 and all(s["loss"] == s["loss"] for s in steps)


@pytest.mark.bad_input
def test_resume_with_another_model_shape(capsys, one_rank_checkpoint):
    fails(
        capsys,
        [
            "--resume",
            str(one_rank_checkpoint / "checkpoints"),
            "--n_layer",
            "3",
            "--max_steps",
            "4",
            "--ds_config",
            "ds_configs/zero2_fp32.json",
        ],
        "another shape",
        "'n_layer': (2, 3)",
    )


@pytest.mark.bad_input
def test_resume_at_another_world_size_or_stage(capsys, one_rank_checkpoint, monkeypatch):
    ck = str(one_rank_checkpoint / "checkpoints")
    fails(
        capsys,
        ["--resume", ck, "--max_steps", "4", "--ds_config", "ds_configs/zero3_fp32.json"],
        "ZeRO stage 2",
        "stage 3",
    )
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    fails(
        capsys,
        ["--resume", ck, "--max_steps", "4", "--ds_config", "ds_configs/zero2_fp32.json"],
        "saved by 1 ranks",
        "ds_to_universal",
    )


@pytest.mark.bad_input
def test_damaged_checkpoint_state(capsys, one_rank_checkpoint, tmp_path):
    import shutil

    copy = tmp_path / "ck"
    shutil.copytree(one_rank_checkpoint / "checkpoints", copy)
    (copy / "global_step2" / "growlm_state.json").write_text('{"format": "growlm-checkpoint-v1", "glob')
    fails(capsys, ["--resume", str(copy), "--max_steps", "4"], "not valid JSON", "damaged")
    (copy / "latest").write_text("global_step9")
    fails(capsys, ["--resume", str(copy), "--max_steps", "4"], "names tag 'global_step9'")


@pytest.mark.bad_input
def test_a_damaged_or_truncated_shard_is_refused_before_anything_loads(capsys, one_rank_checkpoint, tmp_path):
    import shutil

    copy = tmp_path / "ck"
    shutil.copytree(one_rank_checkpoint / "checkpoints", copy)
    shard = copy / "global_step2" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    argv = ["--resume", str(copy), "--max_steps", "4", "--seq_len", "32", "--no_final_eval",
            "--ds_config", "ds_configs/zero2_fp32.json", "--out_dir", str(tmp_path / "run")]  # fmt: skip
    # after the ranks joined: the rank that loads the shard hashes it (runtime.checkpoint.verify_shares)
    line = fails(capsys, argv, f"--resume {shard} does not match its sha256", "damaged or comes from another")
    assert "found by rank" not in line  # one rank: it found it itself
    shard.write_bytes(bytes(data[:-10]))  # before the ranks join: a stat against the manifest's size
    fails(capsys, argv, f"--resume {shard} has {len(data) - 10} bytes, the manifest says {len(data)}")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # nothing trained or written


@pytest.mark.bad_input
def test_existing_checkpoints_are_never_overwritten(capsys, one_rank_checkpoint):
    ck = one_rank_checkpoint / "checkpoints" / "global_step2"
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in ck.iterdir()}
    fails(
        capsys,
        [
            "--preset",
            "tiny",
            "--seq_len",
            "32",
            "--max_steps",
            "2",
            "--out_dir",
            str(one_rank_checkpoint),
            "--ds_config",
            "ds_configs/zero2_fp32.json",
        ],
        "already holds global_step2",
        "never overwritten",
    )
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in ck.iterdir()}
    assert before == after
    state = json.loads((ck / "growlm_state.json").read_text())
    assert state["global_step"] == 2


@pytest.mark.bad_input
def test_max_steps_below_the_checkpoint(capsys, one_rank_checkpoint):
    fails(
        capsys,
        [
            "--resume",
            str(one_rank_checkpoint / "checkpoints"),
            "--max_steps",
            "1",
            "--ds_config",
            "ds_configs/zero2_fp32.json",
        ],
        "below the checkpoint's global step 2",
    )


def test_help_describes_every_flag():
    r = subprocess.run([sys.executable, "train.py", "--help"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0
    for flag in (
        "--preset",
        "--ds_config",
        "--data",
        "--resume",
        "--max_steps",
        "--seq_len",
        "--out_dir",
        "--eval_interval",
        "--save_interval",
    ):
        assert flag in r.stdout


@pytest.mark.bad_input
def test_resume_with_another_data_order_is_refused(capsys, one_rank_checkpoint):
    ck = str(one_rank_checkpoint / "checkpoints")
    common = ["--resume", ck, "--max_steps", "4", "--ds_config", "ds_configs/zero2_fp32.json"]
    fails(capsys, [*common, "--seq_len", "64"], "--seq_len 64 differs from the checkpoint's 32", "drop --seq_len")
    fails(capsys, [*common, "--seed", "7"], "--seed 7 differs from the checkpoint's 1234", "drop --seed")
