"""A resume with another --max_steps (the config's total_num_steps "auto") keeps the checkpoint's LR schedule and
says so: the resumed steps equal an uninterrupted run whose config fixes total_num_steps at the first run's length,
LR and loss. --new_schedule moves the run onto the config's schedule from the next step on, and says so. One rank,
tiny, CPU."""

from __future__ import annotations

import json

import pytest
from dist_utils import read_metrics, run_ranks, tiny_ds_config, write_ds_config

from growlm.runtime.schedule import warmup_cosine_ratio

TINY = ["--preset", "tiny", "--seq_len", "32", "--no_final_eval", "--log_interval", "1"]


@pytest.mark.bad_input
def test_resume_keeps_the_saved_schedule_and_new_schedule_takes_the_configs(tmp_path):
    auto = tiny_ds_config(tmp_path)  # total_num_steps "auto", linear warm-up over 2 steps
    cfg = json.loads(auto.read_text())
    fixed = write_ds_config(tmp_path / "fixed.json", "zero2_fp32", train_micro_batch_size_per_gpu=4, lr=3e-3,
                            scheduler_warmup_num_steps=2, scheduler_total_num_steps=6)  # fmt: skip
    first, kept, new, whole = (tmp_path / n for n in ("first", "kept", "new", "whole"))
    r = run_ranks([*TINY, "--ds_config", str(auto), "--max_steps", "6", "--out_dir", str(first)], nproc=1)
    assert r.returncode == 0, r.stdout[-3000:]
    resume = ["--ds_config", str(auto), "--max_steps", "10", "--resume", str(first / "checkpoints")]
    r = run_ranks([*TINY, *resume, "--out_dir", str(kept)], nproc=1)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "growlm: --resume keeps the checkpoint's LR schedule (total_num_steps 6, warmup_num_steps 2)" in r.stdout
    assert "pass --new_schedule to train on that one" in r.stdout
    r = run_ranks([*TINY, "--ds_config", str(fixed), "--max_steps", "10", "--out_dir", str(whole)], nproc=1)
    assert r.returncode == 0, r.stdout[-3000:]
    a, b = read_metrics(whole)[6:], read_metrics(kept)
    assert [m["step"] for m in b] == [7, 8, 9, 10]
    for x, y in zip(a, b, strict=True):
        assert y["lr"] == pytest.approx(x["lr"], rel=1e-12) and abs(x["loss"] - y["loss"]) <= 1e-6, (x, y)

    r = run_ranks([*TINY, *resume, "--new_schedule", "--out_dir", str(new)], nproc=1)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "growlm: --new_schedule: the LR of step 7 moves from" in r.stdout
    p, peak = cfg["scheduler"]["params"], cfg["optimizer"]["params"]["lr"]
    want = [peak * warmup_cosine_ratio(lbi, 10, 2, p["warmup_min_ratio"], p["cos_min_ratio"], p["warmup_type"])
            for lbi in (7, 8, 9, 10)]  # fmt: skip
    assert [m["lr"] for m in read_metrics(new)] == pytest.approx(want, rel=1e-12)
    assert [m["lr"] for m in b] != pytest.approx(want, rel=1e-3)  # the two schedules differ
