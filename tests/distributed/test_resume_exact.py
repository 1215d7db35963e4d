"""Exactness of the first steps (a real train.py run, CPU, gloo): the LR schedule starts at its first non-zero
warm-up value and step 1 changes the weights (runtime.schedule, ``start_schedule``); every saved Adam step is 1.

A checkpoint resharded by growlm-grow resuming exactly, with every group's Adam step the global step, is checked in
test_grow_checkpoint.py (``test_resharded_resume_matches_uninterrupted_and_keeps_one_adam_step``, and the 2 -> 1 -> 2
round trip), on the source runs that file trains once.
"""

from __future__ import annotations

import json

import pytest
import torch
from dist_utils import read_metrics, run_ranks, saved_adam_steps, tiny_ds_config

from growlm.model.config import GPTConfig
from growlm.model.gpt2.model import GPT
from growlm.runtime.schedule import FIRST_ITERATION, warmup_cosine_ratio

SMALL = ["--preset", "cpu-small", "--n_layer", "2", "--n_embd", "64", "--n_head", "2", "--seq_len", "64"]
QUIET = ["--no_final_eval", "--log_interval", "1"]


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
