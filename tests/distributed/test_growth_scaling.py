"""The growth-scaling benchmark (eval/bench/growth_scaling.py, --small) on real gloo ranks: every rank's record holds
the growth's seconds and memory beside the ZeRO formula's bytes for its world size, the grown engine's loss equals
the old one's (depth x2 is function-preserving), and a second run with the same output skips the rows it holds.
Nothing here asserts a speed or a memory size."""

from __future__ import annotations

import json
import math

import pytest

from growlm.eval.bench import growth_scaling as bench
from growlm.model.config import GPTConfig, param_count
from growlm.runtime.memory import model_state_bytes


def test_rows_per_rank_with_the_formula_and_a_resumed_run_skips_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GROWLM_STRICT_COLLECTIVES", "1")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    out = tmp_path / "scaling.json"
    argv = ["--small", "--ranks", "1", "2", "--cases", "depth x2", "--stages", "3", "--precision", "fp32",
            "--seq_len", "16", "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    rows = json.loads(out.read_text())
    assert [(r["world_size"], r["rank"]) for r in rows] == [(1, 0), (2, 0), (2, 1)]
    old, new = (GPTConfig(n_positions=16, **s) for s in bench.SMALL["depth x2"])
    assert new.n_layer == 2 * old.n_layer
    for r in rows:
        assert (r["case"], r["zero_stage"], r["precision"]) == ("depth x2", 3, "fp32")
        assert (r["params_from"], r["params_to"]) == (param_count(old), param_count(new))
        assert r["predicted_new_bytes"] == model_state_bytes(param_count(new), 3, "fp32", r["world_size"])
        assert r["predicted_old_bytes"] == model_state_bytes(param_count(old), 3, "fp32", r["world_size"])
        assert r["threads"] >= 1 and r["growth_s"] > 0 and r["growth_cpu_s"] > 0
        assert r["peak_reset"] is True  # Linux: the growth's own peak, not the old engine's build
        assert r["fp32_master_separate"] is True  # ZeRO-3 fp32: K = 12, as runtime.memory counts it
        assert r["peak_rss_bytes"] >= max(r["rss_before_bytes"], r["rss_after_bytes"])
        assert r["rss_base_bytes"] < r["rss_before_bytes"]
        assert set(r["phase_s"]) == {"build", "gather", "expand", "write", "refresh", "teardown"}
        assert math.isfinite(r["loss_before"]) and r["loss_after"] == pytest.approx(r["loss_before"], abs=1e-5)
    assert rows[1]["predicted_new_bytes"] == rows[0]["predicted_new_bytes"] / 2  # ZeRO-3: all of it partitioned
    table = out.with_suffix(".md").read_text().splitlines()
    assert table[0].startswith("| case | ZeRO |") and len(table) == 4  # header, rule, one line per world size
    assert table[2].startswith("| depth x2 | 3 | fp32 | 1 |") and table[3].startswith("| depth x2 | 3 | fp32 | 2 |")
    capsys.readouterr()
    assert bench.main(argv) == 0  # resumed: both rows are held, nothing runs
    assert capsys.readouterr().out.count("skip (recorded)") == 2
    assert json.loads(out.read_text()) == rows
