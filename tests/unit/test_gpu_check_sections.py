"""growlm-gpu-check's sections and growlm-bench's per-configuration records, without starting a process: the budgets
and estimates --help states, bad input, how a section's record and status are made from what its process wrote,
the compile section's skip, the multi-rank sections' rank count and offload config, and a failing growlm-bench
configuration recorded while the others are kept."""

from __future__ import annotations

import json

import pytest

from growlm.eval.bench import gpu_check, gpu_check_ranks, gpu_check_runs, gpu_check_sections
from growlm.eval.bench import throughput as bench
from growlm.eval.bench.report import BenchError


def test_help_states_every_section_budget_and_its_h200_estimate(capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--help"])
    out = capsys.readouterr().out
    for name in gpu_check.SECTIONS:
        est, how = gpu_check.H200_ESTIMATE_S[name]
        star = "*" if name in gpu_check.DEFAULT_SECTIONS else " "
        line = next(ln for ln in out.splitlines() if ln.startswith(f"  {star}{name} "))
        assert f" {gpu_check.BUDGETS['gpu'][name]:>4} / {gpu_check.BUDGETS['smoke'][name]:>3} " in line
        assert f"~{est:>3} s = {how}" in line
        assert est < gpu_check.BUDGETS["gpu"][name]  # the estimate fits its budget
    default = sum(gpu_check.BUDGETS["gpu"][s] for s in gpu_check.DEFAULT_SECTIONS)
    assert default == 490 and default + 10 + 10 < 9 * 60  # with the parent's start and data: under 9 minutes
    assert f"default set: budgets {default} s" in out and "an estimate" in out and "under 9 minutes" in out
    assert "second set (e.g. a second lease): --sections compile,fp16,offload, budgets 480 s" in out


def test_help_names_the_multi_gpu_sections_and_their_rank_rule(capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--help"])
    out = capsys.readouterr().out
    assert "ranks" in gpu_check.DEFAULT_SECTIONS and "offload" not in gpu_check.DEFAULT_SECTIONS
    assert any(ln.startswith("  *ranks ") for ln in out.splitlines())  # in the default set
    assert any(ln.startswith("   offload ") for ln in out.splitlines())
    text = " ".join(out.split())  # argparse wraps the description
    assert "the same growths and a save/resume on all GPUs (ranks)" in text and "ZeRO offload" in text
    assert "the visible GPUs (at most 8) when there are 2 or more, else 1" in text
    assert "'one GPU: cross-rank paths not exercised'" in text and "smoke: 2 gloo ranks on the CPU" in text
    assert "their GPU budgets and estimates are estimates until a (multi-)GPU node measures them" in text
    assert set(gpu_check_sections.SECTION_FNS) == set(gpu_check.SECTIONS)
    assert gpu_check_sections.SECTION_FNS["ranks"] is gpu_check_ranks.section_ranks
    assert gpu_check_sections.SECTION_FNS["offload"] is gpu_check_ranks.section_offload


@pytest.mark.parametrize(
    ("gpus", "smoke", "ranks"),
    [(0, False, 1), (1, False, 1), (2, False, 2), (3, False, 3), (8, False, 8), (16, False, 8), (0, True, 2),
     (1, True, 2), (4, True, 2)],
)  # fmt: skip
def test_rank_count_is_the_visible_gpus_up_to_8_else_1_and_2_in_smoke_mode(gpus, smoke, ranks):
    assert gpu_check_ranks.rank_count(gpus, smoke) == ranks


def test_the_rank_note_says_when_cross_rank_paths_are_not_exercised():
    assert gpu_check_ranks.ranks_note(1, 1, False) == "one GPU: cross-rank paths not exercised"
    assert gpu_check_ranks.ranks_note(1, 0, False) == "one GPU: cross-rank paths not exercised"
    assert gpu_check_ranks.ranks_note(4, 4, False) == "4 ranks on 4 of 4 visible GPUs, NCCL"
    assert gpu_check_ranks.ranks_note(8, 16, False) == "8 ranks on 8 of 16 visible GPUs (at most 8), NCCL"
    assert gpu_check_ranks.ranks_note(2, 0, True) == "smoke: 2 gloo ranks on the CPU"


def test_the_save_resume_saves_between_the_two_growths():
    for shapes in (gpu_check_runs.GPU, gpu_check_runs.SMOKE):
        first, second = shapes.grow_steps
        assert first < gpu_check_ranks.resume_step(shapes) < second <= shapes.train_steps
    assert (
        gpu_check_ranks.resume_step(gpu_check_runs.SMOKE) == 3 and gpu_check_ranks.resume_step(gpu_check_runs.GPU) == 5
    )


def test_the_offload_config_offloads_the_optimizer_at_zero_2_in_the_asked_precision():
    from growlm.runtime.ds_config import check_ds_config_meaning

    for precision in ("fp32", "bf16", "fp16"):
        cfg = gpu_check_ranks.offload_config(precision)
        zero = cfg["zero_optimization"]
        assert zero["stage"] == 2 and zero["offload_optimizer"]["device"] == "cpu"
        assert not cfg["optimizer"]["params"].get("torch_adam")  # DeepSpeed's CPU Adam steps the offloaded state
        assert {k for k in ("bf16", "fp16") if cfg.get(k, {}).get("enabled")} == ({precision} - {"fp32"})
        check_ds_config_meaning(cfg)


def test_docs_state_every_section_budget_and_its_h200_estimate():
    from growlm import PACKAGE_DIR

    docs = (PACKAGE_DIR / "docs" / "benchmarks.md").read_text()
    for name in gpu_check.SECTIONS:
        star = " *" if name in gpu_check.DEFAULT_SECTIONS else ""
        budgets, est = gpu_check.BUDGETS, gpu_check.H200_ESTIMATE_S[name][0]
        assert f"| {name}{star} | {budgets['gpu'][name]} | {budgets['smoke'][name]} | {est} |" in docs, name
    default = sum(gpu_check.BUDGETS["gpu"][s] for s in gpu_check.DEFAULT_SECTIONS)
    estimate = sum(gpu_check.H200_ESTIMATE_S[s][0] for s in gpu_check.DEFAULT_SECTIONS)
    assert f"(* the default set: budgets {default} s, estimates {estimate} s;" in docs


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sections", "env,nope"], "--sections env,nope: give distinct names from env, train,"),
        (["--sections", "env,env"], "--sections env,env: give distinct names"),
        (["--budget", "train=0"], "--budget train=0: give SECTION=SECONDS"),
        (["--budget", "bogus=3"], "--budget bogus=3: give SECTION=SECONDS, SECTION one of env, train"),
        (["--budget", "train"], "--budget train: give SECTION=SECONDS"),
    ],
)
def test_bad_sections_and_budgets_are_refused_in_one_line(tmp_path, capsys, argv, message):
    assert gpu_check.main(["--smoke", "--out", str(tmp_path / "gpu"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"growlm-gpu-check: error: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "gpu").exists()  # refused before anything ran


@pytest.mark.bad_input
def test_report_only_without_records_is_refused(tmp_path, capsys):
    assert gpu_check.main(["--report_only", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"growlm-gpu-check: error: --report_only: no section records under {tmp_path} (no {tmp_path}/<device>/"
        "sections)\n"
    )


def test_budget_overrides_only_the_named_section():
    budgets = gpu_check.parse_budgets(["train=1", "compile=2.5"], gpu_check.BUDGETS["gpu"])
    assert budgets == {**gpu_check.BUDGETS["gpu"], "train": 1.0, "compile": 2.5}
    assert gpu_check.parse_sections(" compile,env ") == ["compile", "env"]  # run in the order given


META = {"mode": "GPU", "device": "NVIDIA H200", "budget_s": 60.0, "seconds": 12.0}


def test_a_section_status_comes_from_its_process_and_checks(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("starting\nRuntimeError: CUDA error: out of memory\n\n")
    ok = {"section": "train", "name": "a", "ok": True, "detail": ""}
    bad = {**ok, "ok": False}
    done = {"checks": [ok], "results": {"r": 1}, "skipped": None, "finished": True}
    assert gpu_check.section_record("train", META, done, 0, False, log)["status"] == "passed"
    assert gpu_check.section_record("train", META, {**done, "checks": [ok, bad]}, 0, False, log)["status"] == "failed"
    skipped = gpu_check.section_record("compile", META, {**done, "skipped": "--compile: no"}, 0, False, log)
    assert skipped["status"] == "skipped: --compile: no" and not gpu_check.failed(skipped["status"])
    crashed = gpu_check.section_record("train", META, {**done, "finished": False}, 1, False, log)
    assert crashed["status"] == "failed" and crashed["results"] == {"r": 1}  # what it measured is kept
    assert crashed["checks"][-1]["detail"] == "exit status 1: RuntimeError: CUDA error: out of memory"
    late = gpu_check.section_record("train", META, {**done, "finished": False}, -9, True, log)
    assert late["status"] == "timed out" and late["checks"][:1] == [ok]
    assert late["checks"][-1] == {"section": "train", "name": "finished within its budget", "ok": False,
                                  "detail": "killed after 60 s (--budget train=SECONDS)"}  # fmt: skip
    assert {late[k] for k in ("mode", "device", "budget_s", "seconds")} == {"GPU", "NVIDIA H200", 60.0, 12.0}


def test_the_report_keeps_a_killed_sections_partial_record(tmp_path):
    sections = tmp_path / "sections"
    sections.mkdir()
    env = gpu_check.section_record("env", META, {"checks": [], "results": {"environment": {"device": "H200"}},
                                                 "finished": True}, 0, False, tmp_path / "env.log")  # fmt: skip
    (sections / "env.json").write_text(json.dumps(env))
    partial = {"checks": [{"section": "train", "name": "train-zero1-bf16 ran", "ok": True, "detail": ""}],
               "results": {"train-zero1-bf16": {"exit_status": 0}}, "finished": False}  # fmt: skip
    (sections / "train.partial.json").write_text(json.dumps(partial))
    recs = gpu_check.load_sections(tmp_path)
    assert list(recs) == ["env", "train"] and recs["train"]["status"] == "interrupted"
    assert recs["train"]["results"] == partial["results"] and recs["train"]["checks"] == partial["checks"]
    report = gpu_check.write_report(tmp_path, recs)
    assert report["environment"] == {"device": "H200"} and not report["passed"] and report["seconds"] == 12.0
    md = (tmp_path / "gpu_check.md").read_text()
    assert "| env | passed | 12 | 60.0 |" in md and "| train | interrupted | - | - |" in md


class FakeRunner(gpu_check_runs.Runner):
    """A Runner whose train.py runs are replaced by answers given in advance."""

    def __init__(self, tmp_path, answers):
        (tmp_path / "sections").mkdir()
        super().__init__(gpu_check_runs.SMOKE, "compile", tmp_path, tmp_path / "work", None, True, False)
        self.work.mkdir()
        self.answers, self.seen = answers, []

    def train(self, name, args):
        self.seen.append((name, args))
        return self.answers.pop(0)


def test_compile_refused_by_train_py_is_a_skip_with_its_reason(tmp_path):
    reason = "--compile: torch.compile runs on CUDA or the CPU, and this run is on xpu; drop --compile"
    r = FakeRunner(tmp_path, [(2, tmp_path / "work" / "c", reason, 4.0)])
    gpu_check_sections.section_compile(r)
    ((name, args),) = r.seen
    assert name == "compile-zero2-fp32" and args[-1] == "--compile" and "--no_final_save" in args
    assert args[args.index("--n_embd") + 1] == "32"  # the smoke shape, no growth plan
    partial = json.loads((tmp_path / "sections" / "compile.partial.json").read_text())
    assert partial["skipped"] == reason and partial["checks"] == []
    assert (
        gpu_check.section_record("compile", META, {**partial, "finished": True}, 0, False, tmp_path)["status"]
        == f"skipped: {reason}"
    )


def test_a_failed_compiled_run_fails_the_section_and_the_eager_run_still_runs(tmp_path):
    r = FakeRunner(tmp_path, [(1, tmp_path / "c", None, 4.0), (1, tmp_path / "e", None, 3.0)])
    gpu_check_sections.section_compile(r)
    assert [n for n, _ in r.seen] == ["compile-zero2-fp32", "eager-zero2-fp32"]
    assert "--compile" not in r.seen[1][1] and r.skipped is None
    assert [(c["name"], c["ok"]) for c in r.checks] == [("compile-zero2-fp32 ran", False),
                                                          ("eager-zero2-fp32 ran", False)]  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# growlm-bench: a failing configuration is recorded, the others are kept, each written as it ends


def _record(name: str, kind: str, common: dict) -> dict:
    """A finished run's record with the fields the reports read."""
    return {"name": name, "kind": kind, "precision": "fp32", "zero_stage": 1, "world_size": 1, **common,
            "step_time_s_median": 0.5, "tokens_per_s": 100.0, "tokens_per_s_per_rank": 100.0,
            "model_flops_per_s": 1e9, "mfu": 0.1, "skipped_steps": 0, "peak_rss_bytes_per_rank": [2**30],
            "peak_device_bytes_rank0": None, "activation_recomputation": name.endswith("-ckpt")}  # fmt: skip


def test_bench_records_a_failing_configuration_and_keeps_the_others(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bench, "available_precisions", lambda: ("cpu", ["fp32"]))
    out = tmp_path / "bench"
    seen_on_disk = []

    def pytorch(args, precision, work, base):
        return _record(f"pytorch-{precision}", "pytorch", base["common"])

    def deepspeed(args, stage, precision, work, base, recompute=False):
        seen_on_disk.append(sorted(p.name for p in out.glob("*.json")))  # what was written before this run
        if stage == 2 and not recompute:
            raise BenchError(f"train.py (zero2-{precision}) failed; last output:\nstep 1\nTraceback (most recent "
                             "call last):\n  File x\nRuntimeError: boom\n")  # fmt: skip
        if stage == 3 and not recompute:
            raise BenchError("a run did not finish within --timeout_s 9; logs in L")
        return _record(f"zero{stage}-{precision}" + ("-ckpt" if recompute else ""), "deepspeed", base["common"])

    monkeypatch.setattr(bench, "bench_pytorch", pytorch)
    monkeypatch.setattr(bench, "bench_deepspeed", deepspeed)
    argv = ["--preset", "tiny", "--seq_len", "32", "--precision", "fp32", "--world_size", "1", "--zero_stage", "2",
            "3", "--activation_checkpointing", "both", "--peak_tflops", "1", "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == ["growlm-bench: error: zero2-fp32: train.py (zero2-fp32) failed: RuntimeError: boom",
                   "growlm-bench: error: zero3-fp32: a run did not finish within --timeout_s 9; logs in L"]  # fmt: skip
    assert seen_on_disk == [  # each record on disk the moment its run ended
        ["bench.json", "pytorch-fp32.json"],
        ["bench.json", "pytorch-fp32.json", "zero2-fp32.json"],
        ["bench.json", "pytorch-fp32.json", "zero2-fp32-ckpt.json", "zero2-fp32.json"],
        ["bench.json", "pytorch-fp32.json", "zero2-fp32-ckpt.json", "zero2-fp32.json", "zero3-fp32.json"],
    ]
    records = json.loads((out / "bench.json").read_text())
    assert [(r["name"], r.get("failed", False)) for r in records] == [
        ("pytorch-fp32", False), ("zero2-fp32", True), ("zero2-fp32-ckpt", False), ("zero3-fp32", True),
        ("zero3-fp32-ckpt", False)
    ]  # fmt: skip
    failed = json.loads((out / "zero2-fp32.json").read_text())
    assert failed["error"] == "train.py (zero2-fp32) failed: RuntimeError: boom" and failed["zero_stage"] == 2
    assert failed["output_tail"].endswith("RuntimeError: boom\n") and failed["activation_recomputation"] is False
    ok = json.loads((out / "zero2-fp32-ckpt.json").read_text())
    assert ok["overhead_vs_baseline"] == pytest.approx(1.0) and "recompute_memory_saved_bytes" not in ok  # no twin
    md = (out / "bench.md").read_text()
    assert "| zero3-fp32-ckpt | 1 | fp32 | 1 |" in md and "| zero3-fp32 | a run did not finish" in md
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_error_line_picks_the_exception_of_a_log_tail():
    assert (
        bench.error_line(BenchError("train.py (x): --seq_len 9 is too long")) == "train.py (x): --seq_len 9 is too long"
    )
    tail = BenchError("the PyTorch baseline (fp32) failed; last output:\nloading\r50%\nkilled by the OOM killer")
    assert bench.error_line(tail) == "the PyTorch baseline (fp32) failed: killed by the OOM killer"
    assert bench.error_line(BenchError("")) == "BenchError"


def test_bench_without_its_baseline_still_measures_train_py(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bench, "available_precisions", lambda: ("cpu", ["fp32"]))

    def pytorch(args, precision, work, base):
        raise BenchError("the PyTorch baseline (fp32) failed; last output:\nTraceback\nMemoryError")

    def deepspeed(args, stage, precision, work, base, recompute=False):
        return _record(f"zero{stage}-{precision}", "deepspeed", base["common"])

    monkeypatch.setattr(bench, "bench_pytorch", pytorch)
    monkeypatch.setattr(bench, "bench_deepspeed", deepspeed)
    out = tmp_path / "bench"
    argv = ["--preset", "tiny", "--seq_len", "32", "--precision", "fp32", "--world_size", "1", "--peak_tflops", "1",
            "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 1
    assert (
        "growlm-bench: pytorch-fp32: failed: the PyTorch baseline (fp32) failed: MemoryError" in capsys.readouterr().out
    )
    records = json.loads((out / "bench.json").read_text())
    assert [(r["name"], r.get("failed", False)) for r in records] == [("pytorch-fp32", True), ("zero2-fp32", False)]
    assert records[1]["overhead_vs_baseline"] is None and records[0]["kind"] == "pytorch"
    assert "zero_stage" not in records[0]


def fake_run(folder, records):
    """A run folder whose metrics.jsonl holds ``records``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in records))


def step_record(step, loss):
    return {"event": "train", "step": step, "loss": loss, "lr": 1e-3 / step, "step_time_s": 0.1}


@pytest.mark.parametrize(("drift", "ok"), [(0.0, True), (1e-3, False)])
def test_a_resume_is_compared_with_the_uninterrupted_run_step_by_step(tmp_path, drift, ok):
    r = FakeRunner(tmp_path, [])
    r.section, r.ranks = "ranks", 2
    src, out = r.work / "src", r.work / "ranks-resume-zero3-fp32"
    fake_run(src, [step_record(s, 11 - 0.1 * s) for s in range(1, 7)])
    tag = src / "checkpoints" / "global_step3"
    tag.mkdir(parents=True)
    (tag / "growlm_state.json").write_text(json.dumps({"world_size": 2}))
    growth = {"event": "growth", "step": 4, "stage": "width", "family": "masked", "loss_before": 10.5,
              "loss_after": 10.5, "seconds": 0.5}  # fmt: skip
    fake_run(out, [step_record(4, 10.6), step_record(5, 10.5 + drift), step_record(6, 10.4), growth])
    log = tmp_path / "logs" / "ranks" / out.name / "rank0.log"
    log.parent.mkdir(parents=True)
    log.write_text("growlm: model L=4 d=64, ZeRO stage 3, fp32, 2 rank(s) on cpu, micro batch 4\n")
    r.answers = [(0, out, None, 5.0)]
    assert gpu_check_ranks.resume_run(r, "src", 3, 3) == 2
    ((name, args),) = r.seen
    assert name == out.name and args[args.index("--resume") + 1] == str(tag)
    assert args[args.index("--max_steps") + 1] == "6" and "--growth_plan" in args and "--no_final_save" in args
    rec = r.results[out.name]
    assert rec["steps"] == [4, 5, 6] and rec["checkpoint_world_size"] == 2 and rec["world_size"] == 2
    assert rec["losses"] == [10.6, 10.5 + drift, 10.4] and rec["uninterrupted_losses"] == [10.6, 10.5, 10.4]
    assert rec["max_abs_loss_diff"] == pytest.approx(drift, abs=1e-12) and rec["max_rel_lr_diff"] == 0.0
    checks = {c["name"]: c for c in r.checks}
    compared = checks[f"{out.name}: the uninterrupted run's losses and LRs"]
    assert compared["ok"] is ok and f"{10.5 + drift:.6f} / 10.500000" in compared["detail"]
    assert checks[f"{out.name} continues at step 4"]["ok"] and checks[f"{out.name} world size"]["ok"]
    assert checks[f"{out.name} width (masked) preserves the loss"]["ok"]
    assert not out.exists()  # its run folder deleted (no --keep_work)
