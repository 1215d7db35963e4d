"""growlm-run's phases and command line without processes (trainer/driver/phases.py, cli.py, dry_run.py; the run
path in trainer/run.py): what a restarted driver reads from disk (outcome, resume point, a committed grown folder),
the refusals of its progress file and lock, the dry run's output, and the stop save of a job that resumes at its
stop step. Checkpoints here are tag folders holding only growlm_state.json, which is all these functions read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from growlm import DS_CONFIG_DIR
from growlm.growth.stages.plan import parse_stages
from growlm.runtime.run_state import RunState
from growlm.trainer.driver import cli
from growlm.trainer.driver.phases import Run, drive, grow_phase, outcome, resume_point, train_phase
from growlm.trainer.driver.segments import DriverError, grown_path, make_segments

DS = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 2}}
PLAN = {
    "start": {"preset": "tiny", "resources": {"ranks_per_node": 1, "micro_batch": 4, "grad_accum": 2}},
    "stages": [
        {"name": "deeper", "target": {"n_layer": 3}, "family": "masked", "when": {"step": 2}, "ramp_steps": 2},
        {"name": "wider", "target": {"n_embd": 96, "n_head": 6}, "family": "masked", "when": {"step": 5},
         "resources": {"ranks_per_node": 2, "grad_accum": 1}},
    ],
}  # fmt: skip


def make_run(tmp_path: Path) -> Run:
    plan = parse_stages(PLAN)
    run = Run(plan, make_segments(plan, DS), tmp_path, max_steps=7)
    run.driver_dir.mkdir(parents=True)
    return run


def write_tag(run: Run, step: int, growth_stage: int) -> Path:
    """A committed tag at ``step`` after ``growth_stage`` stages (the model shape of that stage)."""
    cfg = run.plan.stages[growth_stage - 1].target if growth_stage else run.plan.start
    tag = run.save_dir / f"global_step{step}"
    tag.mkdir(parents=True)
    state = RunState(cfg, step, step * 8, 32, 1, 2, 0, growth_stage=growth_stage)
    (tag / "growlm_state.json").write_text(state.dumps())
    return tag


def write_metrics(run: Run, *records: dict) -> None:
    with open(run.out_dir / "metrics.jsonl", "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def prog_at(segment: int, start_step: int, resume: str | None = None, phase: str = "train") -> dict:
    return {"version": 1, "segment": segment, "phase": phase, "resume": resume, "start_step": start_step,
            "record_written": False, "pgids": [], "timings": {}}  # fmt: skip


def test_outcome_and_resume_point_read_only_complete_checkpoints(tmp_path):
    run = make_run(tmp_path)
    seg0, seg1 = run.segments
    assert outcome(run, seg0, 0) == ("run", None) and resume_point(run, prog_at(0, 0)) == (None, 0)
    tag4 = write_tag(run, 4, 1)
    (run.save_dir / ".tmp-global_step5").mkdir()  # a save killed before its rename: never taken
    assert outcome(run, seg0, 0)[0] == "run" and resume_point(run, prog_at(0, 0)) == (str(tag4), 4)
    write_tag(run, 5, 1)
    assert outcome(run, seg0, 0)[0] == "run"  # the stop checkpoint without its stop record: not stopped yet
    write_metrics(run, {"event": "stop", "step": 5, "stage": "wider", "save_s": 0.5})
    assert outcome(run, seg0, 0)[0] == "stopped"
    grown = str(grown_path(run.driver_dir, 1))
    assert resume_point(run, prog_at(1, 5, grown)) == (grown, 5)  # segment 1 starts from the grown folder
    assert outcome(run, seg1, 5)[0] == "run"
    write_tag(run, 7, 2)
    state, st = outcome(run, seg1, 5)
    assert (state, st.global_step) == ("done", 7)


def test_grow_phase_skips_a_committed_folder_and_recovers_its_seconds(tmp_path, monkeypatch):
    from growlm.growth.offline import pipeline

    run = make_run(tmp_path)
    write_tag(run, 5, 1)
    write_metrics(run, {"event": "stop", "step": 5, "stage": "wider", "save_s": 0.5, "tokens": 1280, "flops": 9})
    out = grown_path(run.driver_dir, 1)
    out.mkdir(parents=True)  # committed by a driver killed before it wrote its progress
    prog = prog_at(0, 0, phase="grow")
    prog["timings"]["wider"] = {"grow_started": out.stat().st_ctime - 3.0}

    def no_grow(*a, **k):
        raise AssertionError("a committed grown folder was grown again")

    monkeypatch.setattr(pipeline, "grow_checkpoint", no_grow)
    grow_phase(run, prog)
    assert (prog["segment"], prog["phase"], prog["resume"], prog["start_step"]) == (1, "train", str(out), 5)
    assert prog["timings"]["wider"]["grow_s"] == pytest.approx(3.0) and prog["timings"]["wider"]["save_s"] == 0.5
    assert json.loads(run.progress_path.read_text()) == prog
    assert out.name == "stage1"  # by the stage's index, not its name


@pytest.mark.bad_input
def test_grow_phase_refuses_a_stop_without_its_record_or_checkpoint(tmp_path):
    run = make_run(tmp_path)
    with pytest.raises(DriverError, match="holds no checkpoint from step 0 on"):
        grow_phase(run, prog_at(0, 0, phase="grow"))
    write_tag(run, 5, 1)
    with pytest.raises(DriverError, match="has no 'stop' record for stage 'wider'"):
        grow_phase(run, prog_at(0, 0, phase="grow"))


def test_a_restarted_driver_whose_run_is_complete_launches_nothing(tmp_path, capsys):
    run = make_run(tmp_path)
    write_tag(run, 7, 2)

    def launch(seg, resume):
        raise AssertionError("launched a finished run")

    run.launch = launch
    prog = prog_at(1, 5, str(grown_path(run.driver_dir, 1)))
    assert drive(run, prog) == 0 and prog["phase"] == "done"
    assert json.loads(run.progress_path.read_text())["phase"] == "done"


@pytest.mark.bad_input
def test_progress_file_refusals(tmp_path):
    path, save_dir = tmp_path / "driver" / "progress.json", tmp_path / "checkpoints"
    path.parent.mkdir()
    new = cli.start_progress(path, "sha", ["--x"], save_dir)
    assert (new["segment"], new["phase"], new["version"]) == (0, "train", 1)
    path.write_text(json.dumps(new))
    assert cli.start_progress(path, "sha", ["--x"], save_dir) == new
    for sha, args, match in (("other", ["--x"], "another plan"), ("sha", ["--y"], "other train.py flags")):
        with pytest.raises(DriverError, match=match):
            cli.start_progress(path, sha, args, save_dir)
    path.write_text(json.dumps({**new, "version": 99}))
    with pytest.raises(DriverError, match="progress version 99, this growlm-run reads version 1"):
        cli.start_progress(path, "sha", ["--x"], save_dir)
    path.write_text('{"segment": ')
    with pytest.raises(DriverError, match="not valid JSON"):
        cli.start_progress(path, "sha", ["--x"], save_dir)
    path.unlink()
    (save_dir / "global_step2").mkdir(parents=True)
    (save_dir / "global_step2" / "growlm_state.json").write_text("{}")
    with pytest.raises(DriverError, match="checkpoints growlm-run did not write"):
        cli.start_progress(path, "sha", ["--x"], save_dir)


@pytest.mark.bad_input
def test_one_driver_per_run_folder(tmp_path):
    held = cli.hold_driver_lock(tmp_path)
    with pytest.raises(DriverError, match="another growlm-run is driving"):
        cli.hold_driver_lock(tmp_path)
    held.close()
    cli.hold_driver_lock(tmp_path).close()  # released with its holder


def write_plan(tmp_path: Path, last_resources: str) -> Path:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "start: {preset: tiny, resources: {ranks_per_node: 1, zero_stage: 2, micro_batch: 4, grad_accum: 2}}\n"
        "stages:\n  - {name: deeper, target: {n_layer: 3}, family: masked, when: {step: 2}}\n"
        f"  - {{name: wider, target: {{n_embd: 96, n_head: 6}}, family: masked, when: {{step: 5}}, "
        f"resources: {last_resources}}}\n"
    )
    return plan


def test_dry_run_prints_each_stage_and_the_real_launch_commands(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = write_plan(tmp_path, "{ranks_per_node: 2, grad_accum: 1}")
    (tmp_path / "mine.json").write_text((DS_CONFIG_DIR / "zero2_fp32.json").read_text())
    args = ["plan.yaml", "--dry_run", "--mem_per_rank_gib", "0.001", "--deepspeed", "ds",
            "--", "--ds_config", "mine.json", "--seq_len", "32", "--out", "runs/x"]  # fmt: skip
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    launches = [line for line in out.splitlines() if line.strip().startswith("launch:")]
    assert len(launches) == 2 and all(line.count("--ds_config") == 1 for line in launches)
    driver = tmp_path / "runs" / "x" / "driver"
    assert f"--ds_config {driver / 'ds_config.segment1.json'}" in launches[1]
    assert f"--resume {driver / 'grown' / 'stage1'} " in launches[1] + " "
    assert f"--growth_plan {plan}" in launches[0] and "--stop_before_stage wider" in launches[0]
    assert launches[1].split()[1:4] == ["ds", "--num_gpus", "2"] and "mine.json" not in out
    assert [line.split("]")[0] for line in out.splitlines() if line.startswith("[")] == ["[start", "[deeper", "[wider"]
    assert out.count("WARNING") == 3 and "growlm-run dry run: 3 warning(s)" in out
    assert not (tmp_path / "runs").exists()  # the dry run writes nothing


@pytest.mark.bad_input
def test_a_bad_hostfile_is_refused_before_anything_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_plan(tmp_path, "{nodes: 2, ranks_per_node: 1, grad_accum: 1, hostfile: hosts.txt}")
    (tmp_path / "hosts.txt").write_text("a slots=1\n")
    for extra in (["--dry_run"], []):
        assert cli.main(["plan.yaml", *extra, "--", "--out_dir", "runs/x"]) == 2
        assert "resources.hostfile hosts.txt lists [('a', 1)], but the stage's resources say 2 node(s)" in (
            capsys.readouterr().err
        )
    assert not (tmp_path / "runs").exists()


@pytest.mark.bad_input
def test_init_from_and_default_out_dir_are_refused(tmp_path, capsys):
    plan = write_plan(tmp_path, "{ranks_per_node: 2, grad_accum: 1}")
    assert cli.main([str(plan), "--", "--init_from", "hf", "--out_dir", str(tmp_path / "o")]) == 2
    assert "does not combine with --init_from; drop it" in capsys.readouterr().err
    assert cli.main([str(plan), "--", "--out_dir=runs/default"]) == 2
    assert "give --out_dir (not the default)" in capsys.readouterr().err


def test_stop_save_is_skipped_only_for_the_same_state(tmp_path):
    from growlm.trainer.errors import UsageError
    from growlm.trainer.run import stop_checkpoint_saved

    run = make_run(tmp_path)
    cfg = types.SimpleNamespace(save_dir=run.save_dir)
    live = types.SimpleNamespace(step=5, stage_index=1, model=run.plan.stages[0].target)
    assert not stop_checkpoint_saved(live, cfg, "wider")  # no tag: save
    write_tag(run, 5, 1)
    assert stop_checkpoint_saved(live, cfg, "wider")  # a killed job's own stop save: keep it
    grown = types.SimpleNamespace(step=5, stage_index=2, model=run.plan.stages[1].target)
    with pytest.raises(UsageError, match="two stages due in the same step cannot run on different resources"):
        stop_checkpoint_saved(grown, cfg, "third")  # the tag is the previous segment's pre-growth checkpoint
    assert os.listdir(run.save_dir) == ["global_step5"]


def test_a_job_the_kernel_killed_is_named_so(tmp_path):
    """A segment's launcher ending with a SIGKILL's status (its own -9 here; 137 through a shell, 247 through
    DeepSpeed's launch.py) is named as killed by the kernel, likely out of memory."""
    run = make_run(tmp_path)
    log = tmp_path / "job.log"
    log.write_text("")

    def launch(seg, resume):
        job = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                               start_new_session=True)  # fmt: skip
        return [job], [log]

    run.launch = launch
    with pytest.raises(DriverError) as e:
        train_phase(run, prog_at(0, 0))
    assert str(e.value).startswith(
        "segment 0's job exited with status -9 (killed by the kernel, likely out of memory (SIGKILL)); its log: "
    ), str(e.value)
