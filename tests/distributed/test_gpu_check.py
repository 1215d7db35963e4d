"""growlm-gpu-check --smoke: the GPU acceptance sequence at tiny shapes on the CPU (fp32, one rank per run): every
section runs, every check passes, and the results files hold the numbers the report is made of."""

from __future__ import annotations

import json

import pytest
import torch

from growlm.eval.bench import gpu_check


def test_smoke_runs_every_section_and_writes_the_results(tmp_path, builtin_data, capsys):
    out = tmp_path / "gpu"
    rc = gpu_check.main(
        ["--smoke", "--out", str(out), "--budget_s", "1200", "--data", str(builtin_data), "--keep_work"]
    )
    printed = capsys.readouterr().out
    (folder,) = out.iterdir()
    assert folder.name.endswith("-smoke")
    report = json.loads((folder / "gpu_check.json").read_text())
    failed = [c for c in report["checks"] if not c["ok"]]
    assert rc == 0 and not failed, failed
    assert "checks passed" in printed
    env = report["environment"]
    assert env["torch"] and env["deepspeed"] and env["attention"] == {"fp32": "flash"}  # the CPU flash kernel
    names = {c["name"] for c in report["checks"]}
    for stage in (1, 2, 3):
        assert f"train-zero{stage}-fp32 loss falls" in names
    sec = report["sections"]
    z3 = sec["training"]["train-zero3-fp32"]
    assert [(g["stage"], g["family"], g["step"]) for g in z3["growths"]] == [
        ("depth-x2", "duplicate", 2), ("width", "masked", 4)
    ]  # fmt: skip
    for g in z3["growths"]:
        assert abs(g["loss_after"] - g["loss_before"]) <= gpu_check.GROWTH_TOL["fp32"]
        assert g["equivalent_steps"] == pytest.approx(g["seconds"] / z3["step_time_s_median"])
    assert len(z3["losses"]) == 6 and z3["losses"][-1] < z3["losses"][0]
    assert len(sec["offline"]["resume"]["losses"]) == 2 and sec["offline"]["round_trip_max_abs_diff"] == 0.0
    (bench,) = [v for k, v in sec["throughput"].items() if k.startswith("bench-")]
    assert [x["name"] for x in bench] == ["pytorch-fp32", "zero1-fp32", "zero1-fp32-ckpt"]
    assert bench[2]["activation_recomputation"] and bench[2]["recompute_memory_saved_bytes"] is not None
    md = (folder / "gpu_check.md").read_text()
    assert "| training | train-zero2-fp32 ran | pass |" in md and "| zero1-fp32-ckpt | 4 |" in md
    assert (folder / "work" / "train-zero2-fp32" / "checkpoints" / "latest").is_file()  # --keep_work


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU node the full check runs (make gpu-check)")
def test_without_a_gpu_it_names_the_smoke_mode(tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "growlm-gpu-check: error: no CUDA device is visible: run on a GPU node, or pass --smoke for the CPU rehearsal"
    )
    assert not list(tmp_path.iterdir())


def test_the_micro_batch_fits_the_memory_model():
    from growlm.model.config import from_preset

    cfg = from_preset("gpt2-medium")
    n = 141 * 10**9  # an H200's memory in bytes
    b = gpu_check.fit_micro_batch(cfg, 1024, n, recompute=False)
    per_seq = 24 * 34 * 1024 * 1024 + 12 * 1024 * cfg.vocab_size  # layers + the LM head
    state = 16 * 354_823_168
    assert b == 2 ** int(__import__("math").log2((0.85 * n - state) // per_seq)) == 64
    assert gpu_check.fit_micro_batch(cfg, 1024, n, recompute=True) >= 2 * b  # recomputation fits more
    assert gpu_check.fit_micro_batch(cfg, 1024, 1, recompute=False) == 1


def test_make_gpu_check_runs_it_in_the_environment_at_hand():
    import subprocess

    from growlm import PACKAGE_DIR

    r = subprocess.run(["make", "-n", "-s", "gpu-check", "SMOKE=1"], cwd=PACKAGE_DIR, capture_output=True, text=True)
    words = r.stdout.replace("\\\n", " ").split()
    assert words[1:] == ["-m", "growlm.eval.bench.gpu_check", "--out", "eval/results/gpu", "--smoke"], r.stdout
    assert words[0] in (".venv/bin/python", "python3")  # the clone's .venv, else NODE_PYTHON (an offline install)
