"""growlm-gpu-check --smoke: the GPU acceptance sections at tiny shapes on the CPU (fp32, one rank per run; the ranks
and offload sections on 2 gloo ranks): every default section runs in its own process and passes, each writes its
record the moment it ends, a section past its budget is killed and recorded as timed out, and a growlm-gpu-check
killed with SIGKILL keeps what it measured.

The full smoke runs once (the module's ``smoke`` fixture); the other tests run one or two short sections."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

from growlm import PACKAGE_DIR
from growlm.eval.bench import gpu_check, gpu_check_runs, gpu_check_sections


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, builtin_data):
    """The default sections (ranks on 2 gloo ranks) and fp16 in smoke mode: (exit status, printed output, the device
    folder). The compile section is left out: inductor's first compilation costs a minute of CPU here (tests/unit:
    its logic); offload has a test of its own."""
    out = tmp_path_factory.mktemp("smoke") / "gpu"
    printed = io.StringIO()
    sections = ",".join([*gpu_check.DEFAULT_SECTIONS, "fp16"])
    with contextlib.redirect_stdout(printed):
        rc = gpu_check.main(["--smoke", "--out", str(out), "--data", str(builtin_data), "--sections", sections])
    (folder,) = out.iterdir()
    return rc, printed.getvalue(), folder


def sections_of(folder) -> dict:
    """Each section's record as written to sections/NAME.json."""
    return {p.stem: json.loads(p.read_text()) for p in sorted((folder / "sections").glob("*.json"))
            if not p.name.endswith(".partial.json")}  # fmt: skip


def leftovers(marker: str) -> list[str]:
    """Command lines of live processes that name ``marker`` (a test's output folder)."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if marker in cmd and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(cmd)
    return found


def test_smoke_runs_every_default_section_and_fp16_and_writes_the_results(smoke):
    rc, printed, folder = smoke
    assert folder.name.endswith("-smoke")
    report = json.loads((folder / "gpu_check.json").read_text())
    failed = [c for c in report["checks"] if not c["ok"]]
    assert rc == 0 and not failed and report["passed"], failed
    assert "checks of this run passed" in printed
    assert list(report["sections"]) == [*gpu_check.DEFAULT_SECTIONS, "fp16"]
    sec = sections_of(folder)
    assert sorted(sec) == sorted(report["sections"])
    fp16 = sec.pop("fp16")  # trained where DeepSpeed's CPU accelerator has fp16, else skipped with the reason
    if fp16["status"] == "passed":
        scaler = [c for c in fp16["checks"] if c["name"] == "train-zero2-fp16 loss scaler"]
        assert len(scaler) == 1 and scaler[0]["ok"] and len(fp16["results"]["train-zero2-fp16"]["growths"]) == 2
    else:
        assert fp16["status"].startswith("skipped: this device (cpu) does not train fp16") and not fp16["checks"]
    for name, rec in sec.items():  # each section's own record: passed within its budget, its log kept
        assert rec["status"] == "passed" and rec["section"] == name and rec == report["sections"][name]
        assert rec["budget_s"] == gpu_check.BUDGETS["smoke"][name] and 0 < rec["seconds"] < rec["budget_s"]
        assert (folder / rec["log"]).is_file()
    assert not list((folder / "sections").glob("*.partial.json"))
    assert not (folder / "runs").exists()  # no --keep_work: run folders and checkpoints deleted
    env = report["environment"]
    assert env["torch"] and env["deepspeed"] and env["attention"] == {"fp32": "flash"}  # the CPU flash kernel
    train = sec["train"]["results"]
    for stage in (1, 2, 3):  # every ZeRO stage grows live twice, each growth preserving the loss
        run = train[f"train-zero{stage}-fp32"]
        assert [(g["stage"], g["family"], g["step"]) for g in run["growths"]] == [
            ("depth-x2", "duplicate", 2), ("width", "masked", 4)
        ]  # fmt: skip
        for g in run["growths"]:
            assert abs(g["loss_after"] - g["loss_before"]) <= gpu_check_runs.GROWTH_TOL["fp32"]
            assert g["equivalent_steps"] == pytest.approx(g["seconds"] / run["step_time_s_median"])
        assert len(run["losses"]) == 6 and run["losses"][-1] < run["losses"][0]
        assert (folder / "logs" / "train" / f"train-zero{stage}-fp32" / "rank0.log").is_file()
    offline = sec["offline"]["results"]
    assert len(offline["resume"]["losses"]) == 2 and all(map(math.isfinite, offline["resume"]["losses"]))
    assert sec["export"]["results"]["round_trip_max_abs_diff"] == 0.0
    bench = sec["throughput"]["results"]["bench-tiny"]
    assert [x["name"] for x in bench] == ["pytorch-fp32", "zero1-fp32", "zero1-fp32-ckpt"]
    assert bench[2]["activation_recomputation"] and bench[2]["recompute_memory_saved_bytes"] is not None
    kept = folder / "throughput" / "bench-tiny"  # growlm-bench's own outputs, one record per configuration
    assert json.loads((kept / "zero1-fp32-ckpt.json").read_text())["tokens_per_s"] == bench[2]["tokens_per_s"]
    md = (folder / "gpu_check.md").read_text()
    assert "| train | passed |" in md and "| train | train-zero2-fp32 ran | pass |" in md
    assert "| zero1-fp32-ckpt | 4 |" in md
    assert "| ranks | passed |" in md and "| ranks | ranks: world size | pass | 2 rank(s) launched, world size 2" in md


def test_smoke_ranks_grows_at_every_zero_stage_on_2_ranks_and_resumes_exactly(smoke):
    _, _, folder = smoke
    ranks = sections_of(folder)["ranks"]
    assert ranks["status"] == "passed", [c for c in ranks["checks"] if not c["ok"]]
    res = ranks["results"]
    assert res["ranks"] == {"ranks": 2, "visible_gpus": 0, "backend": "gloo", "note": "smoke: 2 gloo ranks on the CPU",
                            "world_size": 2}  # fmt: skip
    tol = gpu_check_runs.GROWTH_TOL["fp32"]
    for stage in (1, 2, 3):  # the train section's runs, on 2 ranks: each rank's log, train.py's own world size
        run = res[f"ranks-zero{stage}-fp32"]
        assert run["exit_status"] == 0 and run["world_size"] == 2
        assert [(g["stage"], g["family"], g["step"]) for g in run["growths"]] == [
            ("depth-x2", "duplicate", 2), ("width", "masked", 4)
        ]  # fmt: skip
        for g in run["growths"]:
            assert math.isfinite(g["loss_before"]) and abs(g["loss_after"] - g["loss_before"]) <= tol
        losses = run["losses"]
        assert len(losses) == 6 and all(map(math.isfinite, losses)) and losses[-1] < losses[0]
        logs = folder / "logs" / "ranks" / f"ranks-zero{stage}-fp32"
        assert (logs / "rank1.log").is_file() and "2 rank(s) on cpu" in (logs / "rank0.log").read_text()
    # the ZeRO-3 run saved at step 3 (between its growths); a second train.py resumed it on 2 ranks to step 6
    full, resumed = res["ranks-zero3-fp32"], res["ranks-resume-zero3-fp32"]
    assert resumed["exit_status"] == 0 and resumed["world_size"] == resumed["checkpoint_world_size"] == 2
    assert resumed["resumed_from"] == "ranks-zero3-fp32 step 3" and resumed["steps"] == [4, 5, 6]
    assert resumed["uninterrupted_losses"] == full["losses"][3:]
    for got, want in zip(resumed["losses"], full["losses"][3:], strict=True):
        assert math.isfinite(got) and abs(got - want) <= 1e-6, (resumed["losses"], full["losses"])
    assert resumed["max_abs_loss_diff"] <= 1e-6 and resumed["max_rel_lr_diff"] <= 1e-9
    assert resumed["tolerance"] == 1e-6
    # the growth still due after the resume (width at step 4) grew exactly, on the fixed batch the uninterrupted
    # run's did: the same weights after the resume
    (g,) = resumed["growths"]
    (want,) = [x for x in full["growths"] if x["stage"] == "width"]
    assert (g["stage"], g["step"]) == ("width", 4) and abs(g["loss_after"] - g["loss_before"]) <= tol
    assert abs(g["loss_before"] - want["loss_before"]) <= 1e-6
    compared = next(c for c in ranks["checks"] if c["name"] == "ranks-resume-zero3-fp32: the uninterrupted run's "
                    "losses and LRs")  # fmt: skip
    assert compared["ok"] and f"{resumed['losses'][0]:.6f} / {full['losses'][3]:.6f}" in compared["detail"]


def test_offload_section_grows_live_with_the_optimizer_offloaded_on_2_ranks(tmp_path, builtin_data, capsys):
    out = tmp_path / "gpu"
    rc = gpu_check.main(["--smoke", "--out", str(out), "--data", str(builtin_data), "--sections", "offload"])
    printed = capsys.readouterr().out
    (folder,) = out.iterdir()
    rec = sections_of(folder)["offload"]
    assert rc == 0 and rec["status"] == "passed", (printed[-3000:], [c for c in rec["checks"] if not c["ok"]])
    assert rec["budget_s"] == gpu_check.BUDGETS["smoke"]["offload"] and rec["seconds"] < rec["budget_s"]
    res = rec["results"]
    assert res["ranks"]["ranks"] == res["ranks"]["world_size"] == 2
    run = res["offload-zero2-fp32"]
    assert run["exit_status"] == 0 and run["world_size"] == 2
    assert run["zero_optimization"]["stage"] == 2 and run["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert len(run["losses"]) == 6 and all(map(math.isfinite, run["losses"])) and run["losses"][-1] < run["losses"][0]
    (g,) = run["growths"]  # one live growth (depth x2), exact with the optimizer state in CPU memory
    assert (g["stage"], g["family"], g["step"]) == ("depth-x2", "duplicate", 2)
    assert (
        math.isfinite(g["loss_before"]) and abs(g["loss_after"] - g["loss_before"]) <= gpu_check_runs.GROWTH_TOL["fp32"]
    )
    assert (folder / "logs" / "offload" / "offload-zero2-fp32" / "rank1.log").is_file()
    assert list(json.loads((folder / "gpu_check.json").read_text())["sections"]) == ["offload"]


def test_a_section_past_its_budget_is_killed_and_the_next_one_runs(tmp_path, builtin_data, capsys):
    out = tmp_path / "gpu"
    rc = gpu_check.main(["--smoke", "--out", str(out), "--data", str(builtin_data), "--sections", "train,env",
                         "--budget", "train=1", "--keep_work"])  # fmt: skip
    printed = capsys.readouterr().out
    assert rc == 1
    (folder,) = out.iterdir()
    sec = sections_of(folder)
    assert sec["train"]["status"] == "timed out" and sec["train"]["budget_s"] == 1.0
    assert sec["train"]["seconds"] < 60  # killed at its budget, not at the end of its runs
    last = sec["train"]["checks"][-1]
    assert (last["name"], last["ok"]) == ("finished within its budget", False)
    assert last["detail"] == "killed after 1 s (--budget train=SECONDS)"
    assert sec["env"]["status"] == "passed"  # the next section ran
    report = json.loads((folder / "gpu_check.json").read_text())
    assert list(report["sections"]) == ["env", "train"] and not report["passed"]
    assert "growlm-gpu-check: train: timed out in" in printed
    assert (folder / "runs" / "train").is_dir()  # --keep_work: its run folders stay (train.py's --out_dir there)
    assert leftovers(str(out)) == []  # nothing it started outlives it
    # the report rebuilt from the section records alone
    (folder / "gpu_check.json").unlink()
    (folder / "gpu_check.md").unlink()
    assert gpu_check.main(["--report_only", "--out", str(out)]) == 1
    assert json.loads((folder / "gpu_check.json").read_text())["sections"] == report["sections"]
    assert "| train | timed out |" in (folder / "gpu_check.md").read_text()


def test_sigkill_after_the_first_section_keeps_its_record_and_the_report(tmp_path, builtin_data):
    out = tmp_path / "gpu"
    cmd = [sys.executable, "-m", "growlm.eval.bench.gpu_check", "--smoke", "--out", str(out), "--data",
           str(builtin_data), "--sections", "env,train", "--keep_work"]  # fmt: skip
    log = open(tmp_path / "gpu_check.log", "w")  # noqa: SIM115  (closed below)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not list(out.glob("*/sections/env.json")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # growlm-gpu-check itself, right after its first section finished
        proc.wait()
    finally:
        log.close()
    assert proc.returncode == -signal.SIGKILL, (tmp_path / "gpu_check.log").read_text()
    (folder,) = out.iterdir()
    env = json.loads((folder / "sections" / "env.json").read_text())
    assert env["section"] == "env" and env["status"] == "passed" and env["checks"][0]["ok"]
    report = json.loads((folder / "gpu_check.json").read_text())
    assert report["sections"]["env"] == env and report["environment"]["torch"] == torch.__version__
    assert "| env | passed |" in (folder / "gpu_check.md").read_text()
    # the running section and its train.py rank die with it (their command lines name the output folder)
    deadline = time.monotonic() + 60
    while leftovers(str(out)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers(str(out)) == []
    # --report_only: the killed section is 'interrupted' with what it had recorded, if it had started
    assert gpu_check.main(["--report_only", "--out", str(out)]) in (0, 1)
    rebuilt = json.loads((folder / "gpu_check.json").read_text())
    assert rebuilt["sections"]["env"] == env and set(rebuilt["sections"]) <= {"env", "train"}
    if "train" in rebuilt["sections"]:
        assert rebuilt["sections"]["train"]["status"] == "interrupted" and not rebuilt["passed"]


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
    b = gpu_check_sections.fit_micro_batch(cfg, 1024, n, recompute=False)
    per_seq = 24 * 34 * 1024 * 1024 + 12 * 1024 * cfg.vocab_size  # layers + the LM head
    state = 16 * 354_823_168
    assert b == 2 ** int(math.log2((0.85 * n - state) // per_seq)) == 64
    assert gpu_check_sections.fit_micro_batch(cfg, 1024, n, recompute=True) >= 2 * b  # recomputation fits more
    assert gpu_check_sections.fit_micro_batch(cfg, 1024, 1, recompute=False) == 1


def test_make_gpu_check_runs_it_in_the_environment_at_hand():
    def words(*make_args: str) -> list[str]:
        r = subprocess.run(["make", "-n", "-s", "gpu-check", *make_args], cwd=PACKAGE_DIR, capture_output=True,
                           text=True)  # fmt: skip
        return r.stdout.replace("\\\n", " ").split()

    smoke = words("SMOKE=1")
    assert smoke[1:] == ["-m", "growlm.eval.bench.gpu_check", "--out", "eval/results/gpu", "--smoke"], smoke
    assert smoke[0] in (".venv/bin/python", "python3")  # the clone's .venv, else NODE_PYTHON (an offline install)
    assert words("SECTIONS=compile,fp16")[5:] == ["--sections", "compile,fp16"]
