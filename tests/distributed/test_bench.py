"""growlm-bench: throughput numbers from real train.py runs, the PyTorch baseline, growth cost, peaks, bad input.

Nothing here asserts a speed: the checks are on the arithmetic that turns metrics into numbers and on the outputs.
"""

from __future__ import annotations

import json
import statistics

import pytest
from dist_utils import fp16_supported, read_metrics

from growlm.eval.bench import throughput as bench
from growlm.model.config import flops_per_token, from_preset


def test_fp16_on_a_cpu_is_refused_naming_the_available_precisions(capsys, tmp_path):
    device, avail = bench.available_precisions()
    assert ("fp16" in avail) == fp16_supported()
    if "fp16" in avail:  # this CPU trains fp16: the benchmark accepts it (train.py's real run is tested elsewhere)
        assert avail == ["fp32", "bf16", "fp16"]
        return
    rc = bench.main(["--preset", "tiny", "--seq_len", "32", "--precision", "fp16", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("growlm-bench: error: --precision fp16: this device (cpu) does not support fp16")
    assert "available precisions: fp32, bf16" in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())  # nothing ran


def test_bench_surfaces_train_py_errors(capsys, tmp_path):
    rc = bench.main(["--preset", "tiny", "--seq_len", "500", "--precision", "fp32", "--out", str(tmp_path)])
    assert rc == 2
    assert "seq_len=500 must be in [1, n_positions=128]" in capsys.readouterr().err


def test_bench_runs_train_py_and_the_pytorch_baseline(tmp_path, builtin_data):
    out = tmp_path / "bench"
    argv = ["--preset", "tiny", "--seq_len", "32", "--zero_stage", "2", "--precision", "fp32", "--micro_batch", "4",
            "--world_size", "2", "--threads_per_rank", "1", "--max_steps", "3", "--skip_steps", "1",
            "--activation_checkpointing", "both", "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "bench.json", "bench.md", "bench.png", "pytorch-fp32.json", "zero2-fp32-ckpt.json", "zero2-fp32.json"
    ]  # fmt: skip
    ds = json.loads((out / "zero2-fp32.json").read_text())
    base = json.loads((out / "pytorch-fp32.json").read_text())
    ckpt = json.loads((out / "zero2-fp32-ckpt.json").read_text())
    fpt = flops_per_token(from_preset("tiny"), 32)
    assert ds["flops_per_token"] == base["flops_per_token"] == ckpt["flops_per_token"] == fpt  # model FLOPs
    assert (ds["activation_recomputation"], ckpt["activation_recomputation"]) == (False, True)
    assert "--activation_checkpointing" in ckpt["train_cmd"] and "--activation_checkpointing" not in ds["train_cmd"]
    assert ckpt["final_loss"] == pytest.approx(ds["final_loss"], abs=1e-5)  # the same training, recomputed
    saved = ckpt["recompute_memory_saved_bytes"]  # the memory it saves: peak RSS of the twin run less its own
    assert saved == max(ds["peak_rss_bytes_per_rank"]) - max(ckpt["peak_rss_bytes_per_rank"])
    assert ckpt["recompute_step_time_ratio"] == pytest.approx(ckpt["step_time_s_median"] / ds["step_time_s_median"])
    assert "recompute_memory_saved_bytes" not in ds
    assert ds["global_batch"] == 8 and ds["tokens_per_step"] == 256
    assert ds["measured_steps"] == 2 and len(ds["step_times_s"]) == 2 and ds["measured_tokens"] == 2 * 256
    # one statistic: every rate from the median of the saved per-step times, min and max beside it
    times = ds["step_times_s"]
    assert ds["step_time_s_median"] == pytest.approx(statistics.median(times))
    assert (ds["step_time_s_min"], ds["step_time_s_max"]) == (min(times), max(times))
    assert ds["tokens_per_s"] == pytest.approx(256 / statistics.median(times))
    assert ds["tokens_per_s_per_rank"] == pytest.approx(ds["tokens_per_s"] / 2)
    assert ds["model_flops_per_s"] == pytest.approx(ds["tokens_per_s"] * fpt)
    assert ds["mfu"] == pytest.approx(ds["model_flops_per_s_per_rank"] / ds["peak_flops_per_s_per_rank"])
    assert "1 thread" in ds["peak_source"] and base["peak_source"] == ds["peak_source"]  # the same layout
    assert ds["skipped_steps"] == 0 and ds["final_loss"] > 0
    assert len(ds["peak_rss_bytes_per_rank"]) == 2 and min(ds["peak_rss_bytes_per_rank"]) > 2**20
    assert "train.py" in ds["train_cmd"] and "--no_final_save" in ds["train_cmd"]
    assert base["world_size"] == 2 and base["parallel"] == "torch DDP" and base["threads"] == 1
    assert base["measured_steps"] == 2 and base["measured_tokens"] == 512 and base["global_batch"] == 8
    assert base["tokens_per_s_per_rank"] == pytest.approx(base["tokens_per_s"] / 2)
    assert base["tokens_per_s"] == pytest.approx(256 / statistics.median(base["step_times_s"]))
    assert base["step_time_s_max"] == max(base["step_times_s"]) and base["mfu"] == pytest.approx(
        base["model_flops_per_s_per_rank"] / base["peak_flops_per_s_per_rank"]
    )
    assert len(base["peak_rss_bytes_per_rank"]) == 2 and "eval.bench.baseline" in base["train_cmd"]
    assert ds["overhead_vs_baseline"] == pytest.approx(ds["step_time_s_median"] / base["step_time_s_median"])
    assert ds["overhead_vs_baseline"] == pytest.approx(base["tokens_per_s"] / ds["tokens_per_s"])  # same statistic
    md = (out / "bench.md").read_text()
    ms = f"{ds['step_time_s_median'] * 1e3:,.0f}" if ds["step_time_s_median"] >= 0.01 else None
    assert "| run | ZeRO | precision | ranks | steps | step ms median | step ms min | step ms max |" in md
    assert ms is None or f"| zero2-fp32 | 2 | fp32 | 2 | 2 | {ms} |" in md
    assert "| zero2-fp32 | 2 | fp32 | 2 |" in md and "| pytorch-fp32 | - | fp32 | 2 |" in md
    assert "| zero2-fp32-ckpt | 2 | fp32 | 2 |" in md and "| run | peak memory MiB | without recomputation MiB" in md
    assert f"| zero2-fp32-ckpt | {max(ckpt['peak_rss_bytes_per_rank']) / 2**20:,.0f} |" in md
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"
    assert [r["name"] for r in json.loads((out / "bench.json").read_text())] == [
        "pytorch-fp32", "zero2-fp32", "zero2-fp32-ckpt"
    ]  # fmt: skip


GROW_AT_STEP_2 = """
seed: 0
start: {preset: tiny, n_layer: 1}
stages:
  - name: deeper
    target: {n_layer: 2}
    family: masked
    when: {step: 2}
    ramp_steps: 2
    optimizer: {moments: carry, fresh_exp_avg_sq: mean}
    schedule: {kind: continue}
"""


def test_bench_reports_the_cost_of_a_live_growth(tmp_path, builtin_data):
    plan = tmp_path / "plan.yaml"
    plan.write_text(GROW_AT_STEP_2)
    out = tmp_path / "bench"
    argv = ["--growth_plan", str(plan), "--seq_len", "32", "--zero_stage", "2", "--precision", "fp32",
                                 "--micro_batch", "4",
            "--world_size", "2", "--threads_per_rank", "1", "--max_steps", "4", "--skip_steps", "1", "--no_baseline",
            "--keep_runs", "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    rec = json.loads((out / "zero2-fp32.json").read_text())
    kept = out / "runs"  # --keep_runs: the train.py run folder and its DeepSpeed config stay in OUT/runs
    assert json.loads((kept / "zero2-fp32.json").read_text())["zero_optimization"]["stage"] == 2
    assert [r["step"] for r in read_metrics(kept / "zero2-fp32")] == [1, 2, 3, 4]
    assert [r["step"] for r in read_metrics(kept / "zero2-fp32", "growth")] == [2]
    assert sorted(p.name for p in (kept / "zero2-fp32" / "logs").iterdir()) == ["rank0.log", "rank1.log"]
    g = rec["growth"]
    assert g["events"] == 1 and g["per_event"][0]["step"] == 2 and g["seconds"] > 0
    assert g["equivalent_steps"] == pytest.approx(g["seconds"] / rec["step_time_s_median"])
    assert rec["model"]["n_layer"] == 1 and "--preset" not in rec["train_cmd"]
    assert "| zero2-fp32 | 1 |" in (out / "bench.md").read_text()  # the growth table
