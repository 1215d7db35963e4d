"""A resume keeps the checkpoint's LR schedule (trainer.config.keep_saved_scheduler) and says so, with the LR of the
next step on both schedules (trainer.checkpointing.schedule_note); --new_schedule takes the config's and says that;
a run shorter than its warm-up is told that growlm-grow will need --total_num_steps. The real runs are in
tests/distributed/test_resume_schedule_runs.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_utils import train_fails

from growlm.runtime.schedule import ScheduleState, warmup_cosine_ratio
from growlm.trainer.checkpointing import schedule_note
from growlm.trainer.config import keep_saved_scheduler

FP32 = json.loads(Path("ds_configs/zero2_fp32.json").read_text())


def config(total: int, warmup: int = 20) -> dict:
    """zero2_fp32.json with total_num_steps and warmup_num_steps filled in, as load_ds_config leaves it."""
    cfg = json.loads(json.dumps(FP32))
    cfg["scheduler"]["params"].update(total_num_steps=total, warmup_num_steps=warmup)
    return cfg


def lr_at(cfg: dict, lbi: int) -> float:
    p = cfg["scheduler"]["params"]
    ratio = warmup_cosine_ratio(
        lbi, p["total_num_steps"], p["warmup_num_steps"], p["warmup_min_ratio"], p["cos_min_ratio"], p["warmup_type"]
    )
    return cfg["optimizer"]["params"]["lr"] * ratio


def test_a_resume_keeps_the_saved_scheduler_unless_told():
    saved, given = config(30), config(40)
    state = SimpleNamespace(schedule=None, ds_config=saved)
    cfg = json.loads(json.dumps(given))
    keep_saved_scheduler(cfg, state, new_schedule=False)
    assert cfg["scheduler"] == saved["scheduler"] and cfg["optimizer"] == given["optimizer"]
    cfg = json.loads(json.dumps(given))
    keep_saved_scheduler(cfg, state, new_schedule=True)
    assert cfg == given
    placed = SimpleNamespace(schedule=ScheduleState(30, 20), ds_config=saved)  # restore applies it itself
    keep_saved_scheduler(cfg, placed, new_schedule=False)
    assert cfg == given


def run_at(step: int, lbi: int, saved: dict, given: dict, new_schedule: bool):
    """(Progress, RunConfig) stand-ins for schedule_note: resumed at ``step``, the scheduler at ``lbi``."""
    engine = SimpleNamespace(lr_scheduler=SimpleNamespace(last_batch_iteration=lbi))
    state = SimpleNamespace(schedule=None, ds_config=saved)
    kept = given if new_schedule else {**given, "scheduler": saved["scheduler"]}
    run = SimpleNamespace(
        resume_state=state, ds_config=kept, config_scheduler=given["scheduler"], new_schedule=new_schedule, growth=None
    )
    return SimpleNamespace(engine=engine, step=step), run


@pytest.mark.bad_input
def test_the_resume_says_which_schedule_it_trains_on_with_both_lrs():
    saved, given = config(30), config(40)
    old, new = lr_at(saved, 31), lr_at(given, 31)
    assert (f"{old:.2e}", f"{new:.2e}") == ("1.00e-04", "4.11e-04")  # the end of the 30-step cosine; 40 steps
    assert schedule_note(*run_at(30, 31, saved, given, new_schedule=False)) == (
        "growlm: --resume keeps the checkpoint's LR schedule (total_num_steps 30, warmup_num_steps 20): LR 1.00e-04 "
        "at step 31; --ds_config gives total_num_steps 40, warmup_num_steps 20 (LR 4.11e-04 at step 31): pass "
        "--new_schedule to train on that one"
    )
    assert schedule_note(*run_at(30, 31, saved, given, new_schedule=True)) == (
        "growlm: --new_schedule: the LR of step 31 moves from 1.00e-04 (the checkpoint's schedule: total_num_steps "
        "30, warmup_num_steps 20) to 4.11e-04 (--ds_config's: total_num_steps 40, warmup_num_steps 20)"
    )
    assert schedule_note(*run_at(30, 31, saved, saved, new_schedule=False)) is None  # the same schedule: nothing
    warm = config(30, warmup=10)  # another warm-up, same length
    assert "--ds_config gives total_num_steps 30, warmup_num_steps 10" in schedule_note(
        *run_at(12, 13, saved, warm, new_schedule=False)
    )


def test_a_run_shorter_than_its_warmup_is_told_what_growlm_grow_will_need():
    engine = SimpleNamespace(lr_scheduler=SimpleNamespace(last_batch_iteration=1))
    run = SimpleNamespace(resume_state=None, ds_config=config(4), growth=None)
    assert schedule_note(SimpleNamespace(engine=engine, step=0), run) == (
        "growlm: note: the LR schedule ends inside its warm-up (total_num_steps 4, warmup_num_steps 20); DeepSpeed "
        "trains it, but growing a checkpoint of this run with growlm-grow needs --total_num_steps N >= 20"
    )
    run = SimpleNamespace(resume_state=None, ds_config=config(40), growth=None)
    assert schedule_note(SimpleNamespace(engine=engine, step=0), run) is None


@pytest.mark.bad_input
def test_new_schedule_without_resume_is_refused(capsys, tmp_path):
    out = tmp_path / "run"
    line = train_fails(capsys, ["--preset", "tiny", "--new_schedule", "--out_dir", str(out)])
    assert line == (
        "growlm-train: error: --new_schedule places a resumed run on this run's LR schedule; it needs --resume"
    )
    assert not out.exists()
