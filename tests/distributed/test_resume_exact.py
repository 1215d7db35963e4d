"""Exactness of the optimizer across loads and of the first steps (real train.py runs, CPU, gloo).

* The LR schedule starts at its first non-zero warm-up value: step 1 changes the weights (runtime.schedule,
  ``start_schedule``).
* A checkpoint resharded by growlm-grow (a DeepSpeed universal checkpoint) resumes exactly like the uninterrupted run
  at ZeRO 1, 2 and 3, and every parameter group's Adam step is the global step (runtime.engine.repair_adam_steps:
  DeepSpeed's ZeRO-3 universal loader shares one step tensor between groups).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from dist_utils import read_metrics, run_ranks, tiny_ds_config

from growlm.growth.offline.cli import main as grow_main
from growlm.model.config import GPTConfig
from growlm.model.gpt import GPT
from growlm.runtime.schedule import FIRST_ITERATION, warmup_cosine_ratio

# the reproduction of the shared-Adam-step report: 2 layers, n_embd 64, micro batch 4, lr 3e-3, 2 warm-up steps
SMALL = ["--preset", "cpu-small", "--n_layer", "2", "--n_embd", "64", "--n_head", "2", "--seq_len", "64"]
QUIET = ["--no_final_eval", "--log_interval", "1"]


def saved_adam_steps(tag_dir: Path) -> list[float]:
    """Every Adam ``step`` value saved in a native DeepSpeed tag folder (all groups, all ranks; the optimizer is in
    ``*optim_states.pt`` at ZeRO 1-3 and in ``mp_rank_00_model_states.pt`` at stage 0)."""
    steps: list[float] = []

    def walk(obj: object) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                if k == "step" and (torch.is_tensor(v) or isinstance(v, int | float)):
                    steps.append(float(v))
                else:
                    walk(v)
        elif isinstance(obj, list | tuple):
            for v in obj:
                walk(v)

    for f in sorted(tag_dir.glob("*_states.pt")):
        walk(torch.load(f, map_location="cpu", weights_only=False))  # our own test files
    return steps


def test_step_1_trains_at_the_first_nonzero_warmup_lr(tmp_path):
    ds = json.loads(tiny_ds_config(tmp_path, "zero0_fp32").read_text())
    out = tmp_path / "run"
    args = [*SMALL, *QUIET, "--ds_config", str(tmp_path / "zero0_fp32.json"), "--max_steps", "2"]
    r = run_ranks([*args, "--save_interval", "1", "--out_dir", str(out)], nproc=1)
    assert r.returncode == 0, r.stdout[-3000:]
    m = read_metrics(out)
    sp = ds["scheduler"]["params"]
    peak, warmup = ds["optimizer"]["params"]["lr"], sp["warmup_num_steps"]
    first = peak * warmup_cosine_ratio(
        FIRST_ITERATION, 2, warmup, sp["warmup_min_ratio"], sp["cos_min_ratio"], sp["warmup_type"]
    )
    assert (warmup, sp["warmup_type"], sp["warmup_min_ratio"], FIRST_ITERATION) == (2, "linear", 0.0, 1)
    assert first == pytest.approx(peak * 1 / 2)  # linear warm-up, ratio lbi / W at lbi 1: the first non-zero value
    assert m[0]["step"] == 1 and m[0]["lr"] == pytest.approx(first, rel=1e-12)
    assert m[1]["lr"] > 0

    # the weights after step 1 differ from the initial ones (train.py seeds the init with 1234 on every rank)
    state = json.loads((out / "checkpoints" / "global_step1" / "growlm_state.json").read_text())
    torch.manual_seed(state["seed"])
    init = GPT(GPTConfig.from_dict(state["model_config"])).state_dict()
    saved = torch.load(
        out / "checkpoints" / "global_step1" / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False
    )["module"]
    diffs = {k: float((saved[k].float() - v.float()).abs().max()) for k, v in init.items() if k in saved}
    assert len(diffs) >= 10
    assert diffs["transformer.h.0.attn.c_attn.weight"] > 0 and diffs["transformer.wte.weight"] > 0
    steps = saved_adam_steps(out / "checkpoints" / "global_step1")
    assert len(steps) >= 2 and set(steps) == {1.0}, steps


@pytest.mark.parametrize("template", ["zero1_fp32", "zero2_fp32", "zero3_fp32"])
def test_resharded_resume_matches_uninterrupted_and_keeps_one_adam_step(tmp_path, template):
    cfg = tiny_ds_config(tmp_path, template)
    full = tmp_path / "full"
    r = run_ranks([*SMALL, *QUIET, "--ds_config", str(cfg), "--max_steps", "6", "--save_interval", "3",
                   "--no_final_save", "--out_dir", str(full)])  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:]
    ref = {m["step"]: m for m in read_metrics(full)}
    assert set(saved_adam_steps(full / "checkpoints" / "global_step3")) == {3.0}

    assert grow_main([str(full / "checkpoints" / "global_step3"), str(tmp_path / "universal")]) == 0  # reshard only
    resumed = tmp_path / "resumed"
    r = run_ranks([*QUIET, "--ds_config", str(cfg), "--max_steps", "6", "--resume", str(tmp_path / "universal"),
                   "--out_dir", str(resumed)])  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:]
    got = read_metrics(resumed)
    assert [m["step"] for m in got] == [4, 5, 6]
    for m in got:  # the weights alone fix step 4; steps 5 and 6 need every group's Adam step right
        assert abs(m["loss"] - ref[m["step"]]["loss"]) <= 1e-6, (template, m, ref[m["step"]])
        assert m["lr"] == pytest.approx(ref[m["step"]]["lr"], rel=1e-12)
    steps = saved_adam_steps(resumed / "checkpoints" / "global_step6")
    assert len(steps) >= 2 and set(steps) == {6.0}, steps  # every group, every rank: the global step
