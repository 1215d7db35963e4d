"""growlm-bench: throughput numbers from real train.py runs, the PyTorch baseline, growth cost, peaks, bad input.

Nothing here asserts a speed: the checks are on the arithmetic that turns metrics into numbers and on the outputs.
"""

from __future__ import annotations

import sys

import pytest

from growlm.eval.bench import throughput
from growlm.eval.bench.peak import measure_matmul_peak
from growlm.eval.bench.report import BenchError, growth_cost, markdown, step_statistics, summarize_train


def train_records(times: list[float], tokens_per_step: int = 100, flops_per_tok: int = 10, skipped=None) -> list:
    skipped = skipped or [0] * len(times)
    return [
        {"event": "train", "step": i + 1, "loss": 5.0 - i, "step_time_s": t, "tokens": (i + 1) * tokens_per_step,
         "flops": (i + 1) * tokens_per_step * flops_per_tok, "skipped_steps": skipped[i], "max_rss_bytes": 7}
        for i, t in enumerate(times)
    ]  # fmt: skip


def test_summarize_leaves_out_warmup_and_counts_skipped_steps():
    recs = train_records([9.0, 5.0, 1.0, 2.0, 3.0], skipped=[1, 2, 2, 3, 3])
    recs.insert(3, {"event": "val", "step": 3, "val_loss": 4.0})
    s = summarize_train(recs, warmup_steps=2, world_size=2)
    assert s["measured_steps"] == 3 and s["step_times_s"] == [1.0, 2.0, 3.0]
    assert (s["step_time_s_median"], s["step_time_s_min"], s["step_time_s_max"]) == (2.0, 1.0, 3.0)
    # every rate from the median step time: 100 tokens per step / 2 s
    assert s["measured_tokens"] == 300 and s["tokens_per_s"] == pytest.approx(100 / 2.0)
    assert s["tokens_per_s_per_rank"] == pytest.approx(100 / 2.0 / 2)
    assert s["model_flops_per_s"] == pytest.approx(1000 / 2.0)
    assert s["skipped_steps"] == 3 and s["skipped_steps_measured"] == 1
    assert s["growth"]["events"] == 0
    with pytest.raises(BenchError, match="raise --steps or lower --warmup"):
        summarize_train(recs, warmup_steps=5, world_size=2)


def test_one_slow_step_cannot_flip_a_comparison():
    """Two runs 10% apart over the default's 10 measured steps: one 1.3 s outlier in the faster run leaves it
    faster by tokens/s and by the step-time ratio alike (a mean would have flipped it: 1.3 s is 13 steps' worth)."""
    fast = [0.1] * 9 + [1.3]
    slow = [0.11] * 10
    a = step_statistics(fast, tokens_per_step=1000, flops_per_step=1e9, world_size=2)
    b = step_statistics(slow, tokens_per_step=1000, flops_per_step=1e9, world_size=2)
    assert a["step_time_s_median"] == 0.1 and a["step_time_s_max"] == 1.3 and a["step_time_s_min"] == 0.1
    assert a["tokens_per_s"] > b["tokens_per_s"]
    ratio = a["step_time_s_median"] / b["step_time_s_median"]
    assert ratio < 1 and a["tokens_per_s"] / b["tokens_per_s"] == pytest.approx(1 / ratio)
    assert sum(fast) / len(fast) > sum(slow) / len(slow)  # the mean says the opposite
    assert a["model_flops_per_s_per_rank"] == pytest.approx(1e9 / 0.1 / 2)
    with pytest.raises(BenchError, match="no measured step"):
        step_statistics([], tokens_per_step=1, flops_per_step=1, world_size=1)
    with pytest.raises(BenchError, match="positive"):
        step_statistics([0.1, float("nan")], tokens_per_step=1, flops_per_step=1, world_size=1)


def test_growth_cost_in_seconds_and_equivalent_steps():
    recs = train_records([1.0, 2.0, 2.0, 2.0, 4.0])
    recs.insert(2, {"event": "growth", "step": 2, "seconds": 3.0})
    recs.append({"event": "growth", "step": 5, "seconds": 1.0})
    s = summarize_train(recs, warmup_steps=1, world_size=1)
    g = s["growth"]
    assert g["events"] == 2 and g["seconds"] == 4.0
    assert g["equivalent_steps"] == pytest.approx(4.0 / 2.0)  # median step time 2 s
    assert [e["equivalent_steps"] for e in g["per_event"]] == [1.5, 0.5]
    assert growth_cost(recs, 0.5)["equivalent_steps"] == 8.0
    rec = {"name": "zero2-fp32", "kind": "deepspeed", "zero_stage": 2, "precision": "fp32", "world_size": 1,
           "mfu": 0.1, "model_flops_per_s": 1e9, **s}  # fmt: skip
    assert "| zero2-fp32 | 2 | 4.00 | 2.0 |" in markdown([rec], {"device": "test"})
    assert "| 0.0000 | 10.0% |" in markdown([rec], {})
    # a model faster than the measured "peak" (emulated bf16): no MFU above 100% is printed
    assert "| 0.0000 | n/a |" in markdown([rec | {"mfu": 2.3}], {})
    # a GPU without a known peak: MFU null, printed as n/a
    assert "| 0.0000 | n/a |" in markdown([rec | {"mfu": None}], {})


def test_measured_cpu_peak():  # the GPU table: tests/unit/test_peak.py
    peak = measure_matmul_peak("fp32", threads=1, n=128, repeats=2)
    assert peak.flops_per_s > 0 and "1 thread" in peak.source and "fp32" in peak.source


def test_recorded_command_is_relative_to_the_package(tmp_path):
    from growlm import TRAIN_SCRIPT
    from growlm.eval.bench.throughput import recorded_command

    cmd = [sys.executable, str(TRAIN_SCRIPT), "--ds_config", str(tmp_path / "z2.json"), "--out_dir", "runs/a b"]
    assert recorded_command(cmd, tmp_path) == "python train.py --ds_config WORK/z2.json --out_dir 'runs/a b'"


def test_a_run_the_kernel_killed_is_recorded_as_killed_not_with_an_empty_tail(tmp_path):
    """growlm-bench's record of a train.py run SIGKILLed with no output (the kernel's out-of-memory killer, before
    train.py printed a line) says so, where it said "failed; last output:" with nothing after it."""
    (tmp_path / "rank0.log").write_text("")
    (tmp_path / "rank1.log").write_text("")
    e = throughput._failure(tmp_path, "train.py (zero2-bf16)", [-9, -9])
    assert str(e) == (
        "train.py (zero2-bf16) failed: killed by the kernel, likely out of memory (SIGKILL): rank(s) 0, 1, exit status "
        "-9, with no output"
    )
    assert throughput.error_line(e) == str(e)
    (tmp_path / "rank0.log").write_text("growlm: model L=16 ...\n")
    e = throughput._failure(tmp_path, "train.py (zero2-bf16)", [137, 0])
    assert throughput.error_line(e) == (
        "train.py (zero2-bf16) failed (killed by the kernel, likely out of memory (SIGKILL): rank(s) 0, exit status "
        "137): growlm: model L=16 ..."
    )
    e = throughput._failure(tmp_path, "train.py (zero2-bf16)", [1, -9])  # rank 0 failed; rank 1 killed after it
    assert str(e).startswith("train.py (zero2-bf16) failed; last output:\n")
