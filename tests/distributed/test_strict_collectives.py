"""Live growth at ZeRO 1, 2 and 3 and checkpoint saves on 2 gloo ranks with runtime.collectives in strict mode: every
tensor that reaches a torch.distributed collective from growlm's code was staged on the group's device by the one
module that makes collectives (on NCCL a CPU tensor there would crash the run)."""

from __future__ import annotations

import json

import pytest
from dist_utils import read_metrics, run_ranks, tiny_ds_config

STRICT = {"GROWLM_STRICT_COLLECTIVES": "1"}
PLAN = """
seed: 0
start: {preset: tiny, n_layer: 1, n_embd: 32, n_head: 2}
stages:
  - name: wide
    target: {n_layer: 2, n_embd: 64, n_head: 4}
    family: duplicate
    when: {step: 2}
    schedule: {kind: continue}
"""


def rank_records(r) -> list[dict]:
    """The JSON line each of a probe's 2 ranks printed (the run must have succeeded)."""
    assert r.returncode == 0, r.stdout[-3000:]
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith('{"rank"')]
    assert sorted(d["rank"] for d in lines) == [0, 1]
    return lines


def test_the_environment_turns_strict_mode_on_in_every_rank():
    r = run_ranks([], script="tests/strict_collectives_probe.py", env=STRICT, timeout=120)
    lines = rank_records(r)
    for d in lines:
        assert "growlm.probe_module called torch.distributed.all_reduce directly" in d["refused"], d
        assert d["sum"] == 3.0  # 1 + 2, through runtime.collectives


@pytest.mark.parametrize("template", ["zero1_fp32", "zero2_fp32", "zero3_fp32"])
def test_live_growth_and_saves_stage_every_collective(tmp_path, template):
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    ds = tiny_ds_config(tmp_path, template)
    out = tmp_path / "o"
    args = ["--seq_len", "32", "--log_interval", "1", "--no_final_eval", "--ds_config", str(ds), "--max_steps", "4"]
    args += ["--save_interval", "2", "--growth_plan", str(plan), "--out_dir", str(out)]
    r = run_ranks(args, env=STRICT, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:]
    assert "UnstagedCollectiveError" not in r.stdout
    (g,) = read_metrics(out, "growth")
    assert abs(g["loss_after"] - g["loss_before"]) <= 1e-5 and g["collectives"] >= 1, g
    # memory: host RSS under its own name, every rank's CUDA numbers null without CUDA (gathered from both ranks)
    assert g["peak_rss_bytes_all_ranks"] >= g["max_rss_bytes_before"] > 2**20, g
    assert g["cuda_peak_allocated_bytes_per_rank"] == g["cuda_reserved_bytes_after_per_rank"] == [None, None], g
    steps = read_metrics(out)
    assert all(m["cuda_max_allocated_bytes"] is None and m["max_rss_bytes"] > 2**20 for m in steps), steps[-1]
    assert sorted(p.name for p in (out / "checkpoints").glob("global_step*")) == ["global_step2", "global_step4"]
    state = json.loads((out / "checkpoints" / "global_step4" / "growlm_state.json").read_text())
    assert state["model_config"]["n_embd"] == 64 and state["global_step"] == 4


def test_a_bucket_gathered_in_slices_equals_the_whole():
    r = run_ranks([], script="tests/gather_probe.py", env=STRICT, timeout=120)
    lines = rank_records(r)
    for d in lines:
        for kind in ("zero3", "flat"):
            whole, sliced = d[f"{kind}_whole"], d[f"{kind}_sliced"]
            assert whole["max_diff"] == sliced["max_diff"] == 0.0, d  # every element of all three tensors
            assert sliced["collectives"] > whole["collectives"] >= 1, d
            # received straight into place: nothing allocated beyond the send buffer, the full tensors and (ZeRO-3)
            # the collective's output; a fresh receive buffer or a reshape copy would show here
            assert whole["extra_bytes"] == sliced["extra_bytes"] == 0, d
        # ZeRO-3: 30 elements -> shards of 8 + 4 + 4 per rank, x 3 tensors = 48 packed, 1 per rank per slice
        assert d["zero3_whole"]["collectives"] == 1 and d["zero3_sliced"]["collectives"] == 48
        # ZeRO-1/2: both ranks own part of the flat partition: one broadcast each whole, 15 x 3 / 3 each sliced
        assert d["flat_whole"]["collectives"] == 2 and d["flat_sliced"]["collectives"] == 30
