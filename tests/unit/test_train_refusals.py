"""Bad input to train.py: exit status 2, one clear message that names the problem, nothing overwritten."""

from __future__ import annotations

import os

import pytest
from cli_utils import train_fails as fails

from growlm import train
from growlm.trainer.config import resolve


@pytest.mark.bad_input
def test_unknown_preset(capsys):
    fails(capsys, ["--preset", "gpt5"], "unknown model preset 'gpt5'", "cpu-small")


@pytest.mark.bad_input
def test_missing_and_unparsable_ds_config(capsys, tmp_path):
    fails(capsys, ["--ds_config", str(tmp_path / "nope.json")], "no such file", "zero2_bf16.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"zero_optimization": {"stage": 2,}')
    fails(capsys, ["--ds_config", str(bad)], "is not valid JSON")


@pytest.mark.bad_input
def test_n_embd_not_divisible_by_n_head(capsys):
    fails(capsys, ["--preset", "tiny", "--n_embd", "100", "--n_head", "3"], "n_embd=100 is not divisible by n_head=3")


@pytest.mark.bad_input
def test_seq_len_above_n_positions(capsys):
    fails(capsys, ["--preset", "tiny", "--seq_len", "129"], "--seq_len 129", "n_positions=128")


@pytest.mark.bad_input
def test_corpus_path_missing_empty_or_a_text_file(capsys, tmp_path):
    fails(capsys, ["--data", str(tmp_path / "nothing")], "no such folder", "growlm-prepare")
    (tmp_path / "empty").mkdir()
    fails(capsys, ["--data", str(tmp_path / "empty")], str(tmp_path / "empty"))
    text = tmp_path / "book.txt"
    text.write_text("Some text.")
    fails(capsys, ["--data", str(text)], "is a file", "growlm-prepare")


@pytest.mark.bad_input
def test_resume_pointing_at_nothing(capsys, tmp_path):
    fails(capsys, ["--resume", str(tmp_path / "missing")], "no such file or folder")
    (tmp_path / "empty").mkdir()
    fails(capsys, ["--resume", str(tmp_path / "empty")], "nothing to load")


# ----- known before launch: refused before any rank starts or trains ------------------------------------------

PLAN_AT_STEP_2 = """
seed: 0
start: {preset: tiny, n_layer: 1, n_embd: 32, n_head: 2}
stages:
  - name: deeper
    target: {n_layer: 2}
    family: masked
    when: {step: 2}
    ramp_steps: 2
    schedule: {kind: continue}
"""


@pytest.mark.bad_input
def test_a_stage_schedule_shorter_than_its_warmup_is_refused_at_start(capsys, tmp_path):
    """--max_steps 7 with warmup_num_steps 20 (zero2_fp32.json, total "auto"): the growth at step 2 would place a
    schedule of total 7 < warm-up 20, which growth refuses; it used to train 2 steps first, now nothing runs."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN_AT_STEP_2)
    out = tmp_path / "run"
    argv = ["--growth_plan", str(plan), "--ds_config", "ds_configs/zero2_fp32.json", "--seq_len", "32",
            "--no_final_eval", "--out_dir", str(out)]  # fmt: skip
    fails(capsys, [*argv, "--max_steps", "7"], "stage 'deeper'", "total_num_steps=7 < warmup_num_steps=20")
    assert not out.exists()  # no metrics.jsonl, no checkpoint
    # a stage's own lengths count, chained: its schedule.total_num_steps replaces the config's
    plan.write_text(PLAN_AT_STEP_2.replace("{kind: continue}", "{kind: target, total_num_steps: 12}"))
    fails(capsys, [*argv, "--max_steps", "30"], "total_num_steps=12 < warmup_num_steps=20")
    # long enough: accepted (validation only, nothing launched)
    plan.write_text(PLAN_AT_STEP_2)
    run = resolve(train.parse_args([*argv, "--max_steps", "20"]))
    assert run.growth.stages[0].name == "deeper" and run.ds_config["scheduler"]["params"]["total_num_steps"] == 20


LAUNCH = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "env, message",
    [
        ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "RANK=2 must be in [0, 2)"),
        ({"RANK": "1", "WORLD_SIZE": "2"}, "WORLD_SIZE=2 but LOCAL_RANK is not set"),
        ({"RANK": "one", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "RANK='one' is not an integer"),
        ({"RANK": "0"}, "RANK=0 is set but WORLD_SIZE is not"),
        ({"RANK": "0", "WORLD_SIZE": "0", "LOCAL_RANK": "0"}, "WORLD_SIZE=0 must be >= 1"),
        (
            {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "1"},
            "LOCAL_RANK=1 must be in [0, 1)",
        ),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, "LOCAL_RANK=1 is larger than RANK=0"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_PORT": "70000"}, "MASTER_PORT=70000 must be"),
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": ""}, "MASTER_ADDR is not set"),
    ],
)
def test_an_inconsistent_launch_environment_is_refused_before_the_rendezvous(
    capsys, monkeypatch, tmp_path, env, message
):
    """What a launcher hands each rank (a hostfile's slots become WORLD_SIZE/LOCAL_WORLD_SIZE; growlm reads no
    hostfile itself): a rank that cannot be part of the world stops at once with exit 2 and the variables named,
    instead of waiting for the rendezvous until the timeout and blaming the network."""
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"):
        monkeypatch.delenv(key, raising=False)
    for key, value in {**LAUNCH, **env}.items():
        monkeypatch.setenv(key, value)
    argv = ["--preset", "tiny", "--seq_len", "32", "--no_final_eval", "--max_steps", "1", "--dist_timeout_s", "2",
            "--ds_config", "ds_configs/zero2_fp32.json", "--out_dir", str(tmp_path / "run")]  # fmt: skip
    line = fails(capsys, argv, message, "the launch environment is inconsistent")
    assert "could not join" not in line
    assert not (tmp_path / "run").exists()
    assert os.environ.get("RANK") == env["RANK"]  # the launcher's variables are left as they were
