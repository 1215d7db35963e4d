"""growlm-experiment --quick end to end (real train.py processes, 2 at a time), started through the GPU script on the
CPU (its smoke test): runs, the scratch reference fit, paired savings, intervals, report.md, results.json and plots;
a rerun skips the finished runs."""

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARMS = "scratch,scratch-long,depth-g50,depth-slope,multi-1x64-2x128-4x128"


def _run(out: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, GROWLM_DEVICE="cpu")
    cmd = ["bash", str(REPO / "eval/experiments/gpu_staged.sh"), "--quick", "--arms", ARMS, "--out", str(out),
           "--report", str(out / "report")]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500)  # generous: shared CI machines


def test_quick_experiment_writes_the_report_and_resumes(tmp_path):
    r = _run(tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((tmp_path / "report/results.json").read_text())
    arms = {a["arm"]: a for a in res["arms"]}
    assert set(arms) == {"depth-g50", "depth-slope", "multi-1x64-2x128-4x128"}
    for a in arms.values():
        assert a["n_seeds"] == 2 and len(a["per_seed"]) == 2
        assert a["saving_ci95_low"] <= a["saving_mean"] <= a["saving_ci95_high"]
        assert 0 <= a["seeds_positive"] <= 2
        assert a["seeds_positive"] == sum(r["saving"] > 0 for r in a["per_seed"])
        assert 0.5 < a["dynamics_logit_ratio"] < 2.0  # duplication growth: near-preserving
    assert len(arms["multi-1x64-2x128-4x128"]["dynamics_logit_ratios"]) == 2
    g50 = arms["depth-g50"]["per_seed"][0]
    assert g50["grow_steps"] == [16] and g50["steps"] > 32  # the cheap stage buys extra steps at equal compute
    slope = json.loads((tmp_path / "depth-slope/seed1000/job.json").read_text())
    assert slope["slope_threshold"] < 0 and slope["max_steps"] > 32
    assert res["ngram"]["bigram_all_train"] < res["ngram"]["unigram_all_train"]
    div = arms["multi-1x64-2x128-4x128"]["copy_divergence"]  # its first growth doubles the width
    assert len(div) == 1 and set(next(iter(div.values()))) == {"2", "5", "10"}
    for png in ("loss_vs_flops.png", "savings.png", "dynamics.png"):
        assert (tmp_path / "report" / png).stat().st_size > 10_000
    assert "| depth-g50 | 2 |" in (tmp_path / "report/report.md").read_text()
    assert list((tmp_path / "scratch/seed1000/tb").iterdir())  # TensorBoard per run
    again = _run(tmp_path)
    assert again.returncode == 0 and "9 already finished, 0 to run" in again.stdout, again.stdout[-2000:]
