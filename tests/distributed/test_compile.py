"""train.py --compile on the CPU (torch.compile, DeepSpeed's inductor backend, C++ built with g++): a tiny GPT trains
a few steps compiled, without and with one live growth, against the same run in eager mode; a tiny Llama too.

Each rank runs train.py through tests/compile_probe.py, which records every graph inductor compiles (its tensor
inputs: one per parameter the forward reads, with its shape), so the tests see that the grown model itself, not
only the first one, was compiled. One rank: inductor's first compilation of a shape costs 20-35 CPU-seconds per
rank (docs/training.md, "--compile"), and the growth takes the same code path at any world size.
"""

from __future__ import annotations

import json
import math

import pytest
from dist_utils import SMALL_VOCAB, read_metrics, run_ranks, tiny_ds_config

TINY = ["--seq_len", "32", "--log_interval", "1", "--no_final_eval", "--no_final_save"]
START = ["--preset", "tiny", "--n_layer", "1", "--n_embd", "32", "--n_head", "2"]  # the plan's start shape
PLAN = """
seed: 0
start: {preset: tiny, n_layer: 1, n_embd: 32, n_head: 2}
stages:
  - name: grow
    target: {n_layer: 2, n_embd: 64, n_head: 4}
    family: duplicate
    when: {step: 3}
    schedule: {kind: continue}
"""
WTE = "l_self_modules_transformer_modules_wte_parameters_weight_"  # the token embedding, (V, d), as a graph input
SECOND_BLOCK = "l_self_modules_transformer_modules_h_modules_1_"  # any parameter of block 1 (only the grown model)


def train(tmp_path, name: str, *args: str) -> tuple[str, list[dict], list[dict], list[dict]]:
    """Run train.py (one rank, through the probe) with ZeRO-2 fp32; its console output, its train and growth
    records, and the graphs inductor compiled (tests/compile_probe.py)."""
    out = tmp_path / name
    ds = tiny_ds_config(tmp_path)
    r = run_ranks(
        [str(tmp_path / f"{name}-graphs"), *TINY, "--ds_config", str(ds), "--out_dir", str(out), *args],
        nproc=1,
        script="tests/compile_probe.py",
    )
    assert r.returncode == 0, r.stdout[-4000:]
    graphs = json.loads((tmp_path / f"{name}-graphs.rank0.json").read_text())
    return r.stdout, read_metrics(out), read_metrics(out, "growth"), graphs


@pytest.fixture(scope="module")
def eager(tmp_path_factory) -> list[dict]:
    """The eager run's train records: the start shape, 2 steps, seed 0."""
    stdout, steps, _, graphs = train(tmp_path_factory.mktemp("eager"), "eager", *START, "--max_steps", "2")
    assert graphs == [] and "compiled" not in stdout  # eager: inductor never runs
    return steps


def test_compiled_run_trains_as_the_eager_one(tmp_path, eager):
    stdout, steps, _, graphs = train(tmp_path, "compiled", *START, "--max_steps", "2", "--compile")
    assert "attention: SDPA" in stdout and ", compiled" in stdout
    assert [m["step"] for m in steps] == [1, 2]
    # same seed, same data: the compiled model computes the eager model's losses (fp32; inductor's fused kernels
    # round differently, about 2e-6 here), and the step it takes is the same step
    for m, e in zip(steps, eager, strict=True):
        assert math.isfinite(m["loss"]) and abs(m["loss"] - e["loss"]) <= 1e-4, (m["loss"], e["loss"])
    # the training forward (with its backward) was compiled, at the start shape: d = 32, one block
    train_graphs = [g for g in graphs if g["grad"]]
    assert train_graphs, graphs
    assert all(g["inputs"][WTE][1] == 32 for g in graphs)
    assert not any(k.startswith(SECOND_BLOCK) for g in graphs for k in g["inputs"])


def test_a_grown_model_is_compiled_anew_and_keeps_the_loss(tmp_path, eager):
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    stdout, steps, growths, graphs = train(
        tmp_path, "grown", "--growth_plan", str(plan), "--max_steps", "4", "--compile"
    )
    assert [m["step"] for m in steps] == [1, 2, 3, 4]
    assert all(math.isfinite(m["loss"]) for m in steps), steps
    for m, e in zip(steps[:2], eager, strict=True):  # before the growth: the eager run's losses
        assert abs(m["loss"] - e["loss"]) <= 1e-4, (m["loss"], e["loss"])
    # one growth before step 3; function-preserving (duplicate family, fp32): the fixed batch's eval-mode loss on
    # the grown compiled model equals the one on the old compiled model
    (g,) = growths
    assert g["step"] == 3 and g["to"]["n_embd"] == 64 and g["to"]["n_layer"] == 2
    assert abs(g["loss_after"] - g["loss_before"]) <= 1e-5, (g["loss_before"], g["loss_after"])
    assert "grew L=1 d=32" in stdout
    # inductor compiled the old shape first, then the grown one (d = 64, two blocks), for training (grad on: the
    # steps after the growth) and for the no-grad loss check; no graph of the old shape after the first grown one
    widths = [g["inputs"][WTE][1] for g in graphs]
    assert widths[0] == 32 and 64 in widths, widths
    first_grown = widths.index(64)
    assert set(widths[first_grown:]) == {64}, widths
    grown = graphs[first_grown:]
    assert {g["grad"] for g in grown} == {True, False}, grown
    assert all(any(k.startswith(SECOND_BLOCK) for k in g["inputs"]) for g in grown)
    assert all(g["inputs"][WTE] == [50257, 64] for g in grown)


LLAMA = ["--preset", "llama-tiny", "--n_layer", "1", "--max_steps", "2"]
LLAMA_EMBED = "l_self_modules_model_modules_embed_tokens_parameters_weight_"  # (V, d), as a graph input


def test_a_compiled_llama_trains_as_the_eager_one(tmp_path, small_vocab_data):
    small = ["--data", str(small_vocab_data), "--vocab_size", str(SMALL_VOCAB)]
    _, eager_steps, _, eager_graphs = train(tmp_path, "llama-eager", *LLAMA, *small)
    stdout, steps, _, graphs = train(tmp_path, "llama-compiled", *LLAMA, *small, "--compile")
    assert eager_graphs == [] and ", compiled" in stdout and "model llama L=1" in stdout
    assert [m["step"] for m in steps] == [1, 2]
    for m, e in zip(steps, eager_steps, strict=True):  # as GPT-2's: inductor's kernels round differently
        assert math.isfinite(m["loss"]) and abs(m["loss"] - e["loss"]) <= 1e-4, (m["loss"], e["loss"])
    # the training forward (with its backward) of the Llama itself was compiled: its embedding, untied head, and
    # the first block's SwiGLU projections are graph inputs
    train_graphs = [g for g in graphs if g["grad"]]
    assert train_graphs, graphs
    inputs = {k: v for g in train_graphs for k, v in g["inputs"].items()}
    assert inputs[LLAMA_EMBED] == [SMALL_VOCAB, 64]
    assert any("lm_head" in k for k in inputs) and any("gate_proj" in k for k in inputs), sorted(inputs)


@pytest.mark.bad_input
def test_compile_is_refused_on_another_accelerator(monkeypatch):
    import deepspeed.accelerator

    from growlm.trainer.config import check_compile_supported
    from growlm.trainer.errors import UsageError

    class Other:
        def device_name(self) -> str:
            return "xpu"

    check_compile_supported(True)  # this machine's CPU (or CUDA): allowed
    monkeypatch.setattr(deepspeed.accelerator, "get_accelerator", Other)
    check_compile_supported(False)  # no --compile: nothing to refuse
    with pytest.raises(UsageError, match=r"^--compile: torch.compile runs on CUDA or the CPU, and this run is on xpu"):
        check_compile_supported(True)
