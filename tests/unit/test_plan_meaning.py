"""Growth plans checked for meaning: trigger values of the right kind (growth.stages.plan.check_trigger_value, in
the one plan loader, so train.py, growlm-run --dry_run and growlm-grow refuse alike), and a stage that the run
never reaches refused by train.py (trainer.plan_checks). Each refusal is one ``PROG: error:`` line, exit status 2,
nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_utils import one_error_line

from growlm import train
from growlm.growth.errors import GrowthError
from growlm.growth.offline import cli as grow
from growlm.growth.stages.plan import load_stages
from growlm.trainer.driver import cli as run_cli

PLAN = """seed: 0
start: {preset: tiny, n_layer: 1}
stages:
  - name: deeper
    target: {n_layer: 2}
    family: masked
    when: WHEN
"""
TINY = ["--seq_len", "32", "--no_final_eval", "--ds_config", "ds_configs/zero2_fp32.json"]

# the trigger as written -> the refusal (after "stage 'deeper': ")
BAD_TRIGGERS = {
    "{step: true}": "when: {step: true} must be an integer >= 1 (the optimizer step after which it grows)",
    "{step: 2.5}": "when: {step: 2.5} must be an integer >= 1 (the optimizer step after which it grows)",
    "{step: -3}": "when: {step: -3} must be an integer >= 1 (the optimizer step after which it grows)",
    "{step: '30'}": "when: {step: '30'} must be an integer >= 1 (the optimizer step after which it grows) (YAML "
    "reads this as text: write a number without quotes, and an exponent with a dot, 4.0e+7)",
    "{step: 0}": "when: {step: 0} grows before training: DeepSpeed has no Adam state before the first optimizer "
    "step; grow at step >= 1, or start the plan at the grown shape",
    "{tokens: 0}": "when: {tokens: 0} must be a positive number of training tokens",
    "{tokens: false}": "when: {tokens: false} must be a positive number of training tokens",
    "{tokens: 4e7}": "when: {tokens: '4e7'} must be a positive number of training tokens (YAML reads this as text: "
    "write a number without quotes, and an exponent with a dot, 4.0e+7)",
    "{tokens: .inf}": "when: {tokens: inf} must be a positive number of training tokens",
    "{slope: true}": "when: {slope: true} must be a number (d log10 L / d log10 C, e.g. -0.05) or auto",
    "{slope: .nan}": "when: {slope: nan} must be a number (d log10 L / d log10 C, e.g. -0.05) or auto",
}


def plan_file(tmp_path: Path, when: str) -> Path:
    f = tmp_path / "plan.yaml"
    f.write_text(PLAN.replace("WHEN", when))
    return f


@pytest.mark.bad_input
@pytest.mark.parametrize("when", sorted(BAD_TRIGGERS))
def test_the_plan_loader_refuses_a_trigger_value_of_the_wrong_kind(tmp_path, when):
    with pytest.raises(GrowthError) as e:
        load_stages(plan_file(tmp_path, when))
    assert str(e.value) == f"stage 'deeper': {BAD_TRIGGERS[when]}"


def test_trigger_values_of_the_right_kind_load():
    for when, value in (("{step: 30}", 30.0), ("{tokens: 4.0e+7}", 4e7), ("{tokens: 1500}", 1500.0),
                        ("{slope: -0.05}", -0.05)):  # fmt: skip
        assert load_stages_text(when).stages[0].when.value == value


def load_stages_text(when: str):
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return load_stages(plan_file(Path(d), when))


@pytest.mark.bad_input
@pytest.mark.parametrize("when", ["{step: true}", "{step: 2.5}"])
def test_train_and_growlm_run_refuse_a_step_that_is_not_an_integer(capsys, tmp_path, when):
    plan, out = plan_file(tmp_path, when), tmp_path / "run"
    expected = f"--growth_plan {plan}: stage 'deeper': {BAD_TRIGGERS[when]}"
    assert train.main([*TINY, "--growth_plan", str(plan), "--max_steps", "40", "--out_dir", str(out)]) == 2
    assert one_error_line(capsys.readouterr().err, "growlm-train") == expected
    argv = [str(plan), "--dry_run", "--", *TINY, "--max_steps", "40", "--out_dir", str(out)]
    assert run_cli.main(argv) == 2
    assert one_error_line(capsys.readouterr().err, "growlm-run") == expected
    assert grow.main([str(tmp_path / "ckpt"), str(tmp_path / "grown"), "--growth_plan", str(plan)]) == 2
    assert one_error_line(capsys.readouterr().err, "growlm-grow") == expected
    assert not out.exists() and not (tmp_path / "grown").exists()
    assert plan.read_text() == PLAN.replace("WHEN", when)


@pytest.mark.bad_input
@pytest.mark.parametrize("step", [40, 41, 900])
def test_train_and_growlm_run_refuse_a_stage_the_run_never_reaches(capsys, tmp_path, step):
    plan, out = plan_file(tmp_path, f"{{step: {step}}}"), tmp_path / "run"
    assert train.main([*TINY, "--growth_plan", str(plan), "--max_steps", "40", "--out_dir", str(out)]) == 2
    assert one_error_line(capsys.readouterr().err, "growlm-train") == (
        f"stage 'deeper' grows after step {step} (before step {step + 1}), which this run never reaches: it ends "
        f"at --max_steps 40; raise --max_steps above {step}, or move the stage earlier (to train in parts, give "
        "this run a plan without it)"
    )
    assert not out.exists()
    assert run_cli.main([str(plan), "--dry_run", "--", *TINY, "--max_steps", "40", "--out_dir", str(out)]) == 2
    assert one_error_line(capsys.readouterr().err, "growlm-run").startswith(f"stage 'deeper' grows after step {step}")
    assert not out.exists()


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "flags, key",
    [
        (["--total_num_steps", "400"], "schedule: {total_num_steps: N}"),
        (["--warmup_num", "10"], "schedule: {warmup_num_steps: N}"),  # an abbreviation counts too
        (["--schedule", "continue"], "schedule: {kind: ...}"),  # the default value, given: still not used
        (["--ramp_steps", "50"], "ramp_steps: N"),
        (["--family", "duplicate"], "family: masked"),
    ],
)
def test_growlm_grow_refuses_stage_flags_that_a_plan_would_override(capsys, tmp_path, flags, key):
    plan = plan_file(tmp_path, "{step: 2}")
    argv = [str(tmp_path / "ckpt"), str(tmp_path / "grown"), "--growth_plan", str(plan), *flags]
    assert grow.main(argv) == 2
    given = "--warmup_num_steps" if flags[0] == "--warmup_num" else flags[0]
    assert one_error_line(capsys.readouterr().err, "growlm-grow") == (
        f"{given} sets a stage given by flags, and --growth_plan gives the stage; set it in the plan's stage ({key}) "
        "or drop --growth_plan"
    )
    assert not (tmp_path / "grown").exists()


RESHARD_ONLY = "--n_layer / --n_embd / --n_head / --n_inner / --n_kv_head"


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "flags",
    [
        ["--option", "foo=1"],
        ["--ramp_steps", "5"],
        ["--family", "masked"],
        ["--moments", "reset"],
        ["--fresh_exp_avg_sq", "mean"],
        ["--schedule", "target"],
        ["--constant_op", "2"],
        ["--rewarm_steps", "10"],
        ["--total_num_steps", "100"],
        ["--warmup_num_steps", "5"],
    ],
)
def test_growlm_grow_refuses_a_growth_flag_without_a_target(capsys, tmp_path, flags):
    """Without a target shape growlm-grow only reshards: a flag that says how to grow would be ignored, so it is
    refused, before the checkpoint is read (it does not exist here)."""
    argv = [str(tmp_path / "ckpt"), str(tmp_path / "resharded"), *flags]
    assert grow.main(argv) == 2
    assert one_error_line(capsys.readouterr().err, "growlm-grow") == (
        f"{flags[0]} sets how a growth is done, and no target shape is given ({RESHARD_ONLY}), so this would only "
        f"reshard and ignore it; add a target such as --n_layer, or drop {flags[0]}"
    )
    assert not (tmp_path / "resharded").exists()


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            ["--export_hf", "HF", "--ramp_steps", "5"],
            "--ramp_steps sets how a growth is done, and --export_hf exports the checkpoint as it is; drop "
            "--ramp_steps (to export a grown model, grow first with a target such as --n_layer, then export the "
            "result)",
        ),
        (
            ["--export_hf", "HF", "--zero_stage", "3"],
            "--zero_stage 3 sets the ZeRO stage a resume of OUT will use, and --export_hf writes a transformers "
            "folder, which is not resumed; drop --zero_stage",
        ),
        (
            ["--export_hf", "HF", "--stage", "deeper"],
            "--stage deeper names a stage of a plan file; add --growth_plan FILE, or drop --stage",
        ),
        (
            ["OUT", "--stage", "deeper"],
            "--stage deeper names a stage of a plan file; add --growth_plan FILE, or drop --stage",
        ),
    ],
)
def test_growlm_grow_refuses_every_flag_its_command_would_ignore(capsys, tmp_path, flags, expected):
    argv = [str(tmp_path / "ckpt"), *[str(tmp_path / f) if f in ("HF", "OUT") else f for f in flags]]
    assert grow.main(argv) == 2
    assert one_error_line(capsys.readouterr().err, "growlm-grow") == expected
    assert not (tmp_path / "HF").exists() and not (tmp_path / "OUT").exists()


@pytest.mark.bad_input
@pytest.mark.parametrize("tokens", [9985, 10**6])
def test_train_refuses_a_token_trigger_the_run_never_reaches(capsys, tmp_path, tokens):
    # zero2_fp32: micro batch 8 x 1 x 1 rank, --seq_len 32: 256 tokens a step, 39 x 256 = 9,984 before step 40
    plan, out = plan_file(tmp_path, f"{{tokens: {tokens}}}"), tmp_path / "run"
    assert train.main([*TINY, "--growth_plan", str(plan), "--max_steps", "40", "--out_dir", str(out)]) == 2
    assert one_error_line(capsys.readouterr().err, "growlm-train") == (
        f"stage 'deeper' grows at {tokens:,} tokens, which this run never reaches: it consumes 9,984 tokens before "
        "its last step (--max_steps 40 x 8 sequences x --seq_len 32); raise --max_steps, or grow at fewer tokens"
    )
    assert not out.exists()
