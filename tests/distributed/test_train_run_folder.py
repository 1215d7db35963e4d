"""A run folder has one writer and keeps the user's data: a second train.py on a folder another one is training in
is refused (runtime.lock), a resumed run's metrics.jsonl holds each step once and a fresh rerun's holds its own
steps only (the earlier run's kept beside it), a checkpoint missing a rank's RNG
file is refused, and a disk that fills up during a save leaves the earlier checkpoints as they were.

One real 1-rank run (tiny model, ZeRO-2 fp32) is held at step 3 by a test-only hold point (runtime.crash_points),
with saves every 2 steps: it holds the folder's lock while the second run is tried, then is killed (SIGKILL) after
writing the records of step 3 and the checkpoint of step 2, the state a user finds after a crash.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest
from cli_utils import train_fails as fails
from dist_utils import REPO, base_env, read_metrics

from growlm.runtime.manifest import MANIFEST_FILE, verify_manifest

ARGS = ["--preset", "tiny", "--seq_len", "32", "--no_final_eval", "--log_interval", "1", "--ds_config",
        "ds_configs/zero2_fp32.json"]  # fmt: skip


@pytest.fixture(scope="module")
def held_run(tmp_path_factory):
    """(process, run folder) of a run (--max_steps 4, --save_interval 2) held after step 3, alive until killed."""
    base = tmp_path_factory.mktemp("held")
    out, marks = base / "run", base / "marks"
    env = base_env(GROWLM_TEST_HOLD_AT="train.step:3", GROWLM_TEST_HOLD_DIR=str(marks))
    cmd = [sys.executable, "train.py", *ARGS, "--max_steps", "4", "--save_interval", "2", "--out_dir", str(out)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not (marks.is_dir() and any(marks.iterdir())):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the run never reached step 3: {proc.communicate()[0][-3000:]}")
        time.sleep(0.2)
    yield proc, out
    proc.kill()
    proc.wait()


@pytest.fixture()
def killed_run(held_run):
    """The held run after SIGKILL: metrics of steps 1-3, checkpoint global_step2 (its 'latest')."""
    proc, out = held_run
    proc.kill()
    proc.wait()
    return out


@pytest.mark.bad_input
def test_a_second_run_on_a_folder_in_use_is_refused(capsys, held_run):
    """Both runs would stage into the same .tmp-global_stepN and one metrics.jsonl; the second, planning other tags
    (3 and 6, so no tag clash stops it earlier), exits 2 naming the folder and the holder, and writes nothing."""
    proc, out = held_run
    assert proc.poll() is None, "the held run must still be alive (this test runs before the ones that kill it)"
    metrics_before = (out / "metrics.jsonl").read_bytes()
    argv = [*ARGS, "--max_steps", "6", "--save_interval", "3", "--out_dir", str(out), "--dist_timeout_s", "60"]
    line = fails(capsys, argv, f"--out_dir {out} is in use by another growlm-train (pid {proc.pid} on host ",
                 f"lock {out / 'train.lock'}", "choose another --out_dir")  # fmt: skip
    assert "(train.py)" in line
    assert (out / "metrics.jsonl").read_bytes() == metrics_before
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("global_step")) == [
        "global_step2"
    ]


def test_resume_after_a_kill_logs_each_step_once(killed_run, tmp_path):
    """Killed after step 3 with saves every 2: the resume from global_step2 writes step 3 again (and 4); metrics.jsonl
    holds steps 1-4 once each, steps 1-2 as the first job wrote them."""
    out = tmp_path / "run"
    shutil.copytree(killed_run, out)
    first = read_metrics(out)
    assert [r["step"] for r in first] == [1, 2, 3]
    r = subprocess.run(
        [sys.executable, "train.py", *ARGS, "--max_steps", "4", "--save_interval", "2", "--out_dir", str(out),
         "--resume", str(out / "checkpoints")],  # fmt: skip
        cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    steps = read_metrics(out)
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert steps[:2] == first[:2]
    assert steps[2]["consumed_samples"] == first[2]["consumed_samples"] == 24  # micro 8 x 1 x 1 rank, 3 steps


def test_a_fresh_rerun_starts_its_records_afresh_and_keeps_the_dead_runs(killed_run, tmp_path):
    """Killed before any checkpoint (here: the killed run's folder without its checkpoints), the run is started again
    into the same --out_dir without --resume, as the lost-rank line says: its metrics.jsonl holds its own steps once
    each, the dead run's records and TensorBoard files are kept beside it under an ``earlier`` name, and one line
    says so."""
    out = tmp_path / "run"
    shutil.copytree(killed_run, out)
    shutil.rmtree(out / "checkpoints")
    dead = (out / "metrics.jsonl").read_text()
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]
    r = subprocess.run(
        [sys.executable, "train.py", *ARGS, "--max_steps", "2", "--no_final_save", "--out_dir", str(out)],
        cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert [s["step"] for s in read_metrics(out)] == [1, 2]  # not 1, 2, 3, 1, 2
    (earlier,) = out.glob("metrics.earlier-*.jsonl")
    assert earlier.read_text() == dead
    tb = out / earlier.name.replace("metrics.", "tb.").removesuffix(".jsonl")
    assert tb.is_dir() and any(tb.iterdir()) and (out / "tb").is_dir()
    lines = dead.count("\n")
    assert (
        f"growlm: --out_dir {out} holds an earlier run's records and this run starts afresh (no --resume): moved "
        f"metrics.jsonl ({lines} line(s)) to {earlier.name} and tb/ to {tb.name}/, so its steps do not mix with this "
        "run's"
    ) in r.stdout


@pytest.mark.bad_input
def test_a_checkpoint_missing_a_ranks_rng_file_is_refused(capsys, killed_run, tmp_path, monkeypatch):
    """Without its manifest nothing else notices a deleted rng_state_rank<r>.pt: that rank used to resume with a
    fresh random stream, silently."""
    ck = tmp_path / "checkpoints"
    shutil.copytree(killed_run / "checkpoints", ck)
    tag = ck / "global_step2"
    (tag / MANIFEST_FILE).unlink()
    (tag / "rng_state_rank0.pt").unlink()
    argv = [*ARGS, "--max_steps", "4", "--out_dir", str(tmp_path / "run"), "--resume", str(ck)]
    fails(capsys, argv, f"--resume {tag / 'rng_state_rank0.pt'} is missing", "rank(s) 0 of 1", "resume from another")
    # the 2-rank case: saved by 2 ranks, resumed by 2, rank 1's file gone
    shutil.copy(killed_run / "checkpoints" / "global_step2" / "rng_state_rank0.pt", tag / "rng_state_rank0.pt")
    state = json.loads((tag / "growlm_state.json").read_text())
    state["world_size"] = 2
    (tag / "growlm_state.json").write_text(json.dumps(state))
    monkeypatch.setenv("WORLD_SIZE", "2")
    fails(capsys, argv, f"{tag / 'rng_state_rank1.pt'} is missing", "rank(s) 1 of 2")
    assert not (tmp_path / "run").exists()


# a child train.py whose disk fills up while it saves global_step4 (torch.save raises ENOSPC there, as a full disk
# does: DeepSpeed's and growlm's files of the tag both go through torch.save)
DISK_FULL = """
import errno, runpy, sys, torch
real = torch.save
def save(obj, f, *a, **k):
    if ".tmp-global_step4" in str(f):
        raise OSError(errno.ENOSPC, "No space left on device", str(f))
    return real(obj, f, *a, **k)
torch.save = save
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


@pytest.mark.bad_input
def test_disk_full_during_a_save_keeps_the_earlier_checkpoint(killed_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(killed_run, out)
    ck = out / "checkpoints"
    before = {p.name: p.stat().st_size for p in (ck / "global_step2").iterdir()}
    r = subprocess.run(
        [sys.executable, "-c", DISK_FULL, *ARGS, "--max_steps", "4", "--save_interval", "2", "--out_dir", str(out),
         "--resume", str(ck)],  # fmt: skip
        cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    errors = [x for x in r.stderr.splitlines() if x.startswith("growlm-train: error: ")]  # tqdm also writes there
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    line = errors[0].removeprefix("growlm-train: error: ")
    assert line.startswith(f"no space left on device while saving checkpoint global_step4 into {ck}: "), line
    assert "the earlier checkpoints and 'latest' are untouched" in line and f"--resume {ck}" in line
    assert (ck / "latest").read_text().strip() == "global_step2"
    assert sorted(p.name for p in ck.iterdir() if "global_step" in p.name) == ["global_step2"]  # no .tmp- left
    assert {p.name: p.stat().st_size for p in (ck / "global_step2").iterdir()} == before
    assert verify_manifest(ck / "global_step2")
