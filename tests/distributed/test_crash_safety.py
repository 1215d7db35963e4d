"""Crash safety, measured: real runs killed with SIGKILL (by PID) at a fixed moment, then checked and rerun.

The moment is made deterministic by a test-only hold point (runtime/crash_points.py): with GROWLM_TEST_HOLD_AT set,
the process writes a marker file at that point and sleeps; the test waits for the marker and kills every rank with
``os.kill(pid, SIGKILL)``. Each case checks that the previous checkpoint is what ``latest`` names and resumes with the
same losses as an uninterrupted run, that nothing half-written is taken as a checkpoint or an output, and that the
same command run again succeeds. Tiny models (1-2 layers, 32-64 wide), 2 ranks over gloo on CPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from dist_utils import GROWTH_AT_STEP_3, REPO, base_env, held_ranks, read_metrics, run_ranks, tiny_ds_config

from growlm.growth.offline.cli import main as grow_main
from growlm.runtime import checkpoint

TINY = ["--preset", "tiny", "--n_layer", "1", "--n_embd", "32", "--n_head", "2", "--seq_len", "32", "--no_final_eval",
        "--log_interval", "1"]  # fmt: skip


def killed_at(point: str, cmds: list[list[str]], tmp: Path, timeout: float = 240) -> list[int]:
    """Start ``cmds`` (one per rank) with the hold point ``point`` armed, wait until a process reaches it, then
    SIGKILL every process by PID (the one holding first). Returns the exit codes (-9 each)."""
    with held_ranks(cmds, tmp, point, timeout=timeout) as (procs, _, holders):
        for p in sorted(procs, key=lambda p: p.pid not in holders):
            os.kill(p.pid, signal.SIGKILL)
        return [p.wait(timeout=60) for p in procs]


def train_cmds(args: list[str], nproc: int = 2) -> list[list[str]]:
    return [[sys.executable, str(REPO / "train.py"), *args] for _ in range(nproc)]


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*")
            if p.is_file()}  # fmt: skip


@pytest.fixture(scope="module")
def killed_in_save(tmp_path_factory, builtin_data):
    """A 2-rank ZeRO-2 run (4 steps, a checkpoint every 2) killed while committing global_step4: every rank has
    written .tmp-global_step4 (growlm_state.json and manifest included), rank 0 has not renamed it yet."""
    tmp = tmp_path_factory.mktemp("crash_save")
    out = tmp / "run"
    args = [*TINY, "--ds_config", str(tiny_ds_config(tmp)), "--max_steps", "4", "--save_interval", "2",
            "--out_dir", str(out)]  # fmt: skip
    codes = killed_at("checkpoint.commit:global_step4", train_cmds(args), tmp)
    return out, args, codes, read_metrics(out)


def test_train_killed_while_committing_a_checkpoint(killed_in_save):
    out, args, codes, before = killed_in_save
    ck = out / "checkpoints"
    assert codes == [-signal.SIGKILL] * 2
    assert [m["step"] for m in before] == [1, 2, 3, 4]  # step 4 was trained and logged, its save was cut
    # nothing half-written is taken: latest still names step 2, the finished .tmp folder is no tag and is refused
    assert (ck / "latest").read_text() == "global_step2"
    assert checkpoint.existing_tags(ck) == ["global_step2"]
    tmp_tag = ck / ".tmp-global_step4"
    assert (tmp_tag / "growlm_state.json").is_file() and not (ck / "global_step4").exists()
    with pytest.raises(checkpoint.CheckpointError, match="did not finish"):
        checkpoint.open_checkpoint(tmp_tag)
    step2 = digest(ck / "global_step2")
    assert checkpoint.open_checkpoint(ck).tag == "global_step2"  # manifest and pickles check out

    # the same command, resuming in place, succeeds: steps 3 and 4 as the interrupted run trained them
    r = run_ranks([*args, "--resume", str(ck)], timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    records = read_metrics(out)  # the resumed job replaced what the killed one logged after global_step2
    assert [m["step"] for m in records] == [1, 2, 3, 4]
    assert records[:2] == before[:2]
    after = records[2:]
    for m in after:
        assert abs(m["loss"] - before[m["step"] - 1]["loss"]) <= 1e-6, (m, before[m["step"] - 1])
        assert m["lr"] == pytest.approx(before[m["step"] - 1]["lr"], rel=1e-12)
    assert (ck / "latest").read_text() == "global_step4"
    assert checkpoint.existing_tags(ck) == ["global_step2", "global_step4"]
    assert not list(ck.glob(".tmp-*")) and not list(ck.glob(".old-*"))
    assert digest(ck / "global_step2") == step2  # the previous checkpoint is untouched
    assert checkpoint.open_checkpoint(ck).state.global_step == 4


def test_growlm_grow_killed_mid_way(killed_in_save, tmp_path):
    ck = killed_in_save[0] / "checkpoints" / "global_step2"
    source = digest(ck)
    out = tmp_path / "grown"
    argv = [str(ck), str(out), "--family", "masked", "--n_layer", "2", "--n_embd", "64", "--n_head", "4",
            "--ramp_steps", "4"]  # fmt: skip
    codes = killed_at("grow.commit", [[sys.executable, "-m", "growlm.growth.offline.cli", *argv]], tmp_path)
    assert codes == [-signal.SIGKILL]
    # converted and grown tensors were written into .tmp-grown; no output exists and the partial folder is refused
    partial = tmp_path / ".tmp-grown"
    assert not out.exists() and (partial / "global_step2" / "zero").is_dir()
    assert not (partial / "latest").exists()
    for path in (partial, partial / "global_step2"):
        with pytest.raises(checkpoint.CheckpointError):
            checkpoint.open_checkpoint(path)
    assert grow_main([str(partial), str(tmp_path / "again")]) == 2  # growlm-grow refuses it as an input too
    assert digest(ck) == source  # the input is never modified

    assert grow_main(argv) == 0  # the same command again: the stale .tmp-grown is replaced
    assert not partial.exists() and (out / "latest").read_text() == "global_step2"
    grown = checkpoint.open_checkpoint(out)  # manifest verified
    assert grown.state.universal and grown.state.model_config.n_embd == 64 and grown.state.global_step == 2


def test_live_growth_killed_mid_way(tmp_path, builtin_data):
    plan = tmp_path / "plan.yaml"
    plan.write_text(GROWTH_AT_STEP_3)
    common = ["--seq_len", "32", "--no_final_eval", "--log_interval", "1", "--ds_config", str(tiny_ds_config(tmp_path)),
              "--max_steps", "4", "--save_interval", "2", "--growth_plan", str(plan)]  # fmt: skip
    ref, out = tmp_path / "uninterrupted", tmp_path / "run"
    r = run_ranks([*common, "--out_dir", str(ref)], timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    codes = killed_at("live.applied", train_cmds([*common, "--out_dir", str(out)]), tmp_path)
    assert codes == [-signal.SIGKILL] * 2
    ck = out / "checkpoints"
    before = read_metrics(out)
    assert [m["step"] for m in before] == [1, 2, 3] and not read_metrics(out, "growth")  # killed inside the growth
    assert (ck / "latest").read_text() == "global_step2" and checkpoint.existing_tags(ck) == ["global_step2"]
    assert not list(ck.glob(".tmp-*"))

    r = run_ranks([*common, "--out_dir", str(out), "--resume", str(ck)], timeout=300)  # the same command, resumed
    assert r.returncode == 0, r.stdout[-3000:]
    want = {m["step"]: m for m in read_metrics(ref)}
    records = read_metrics(out)  # each step once: the killed job's step 3 was dropped, then trained again
    assert [m["step"] for m in records] == [1, 2, 3, 4] and records[:2] == before[:2]
    got = records[2:]
    for m in got:  # step 3 before the growth, step 4 after it: as the uninterrupted run
        assert abs(m["loss"] - want[m["step"]]["loss"]) <= 1e-6, (m, want[m["step"]])
    (g_ref,), (g,) = read_metrics(ref, "growth"), read_metrics(out, "growth")
    assert g["step"] == g_ref["step"] == 3
    assert g["loss_after"] == pytest.approx(g_ref["loss_after"], abs=1e-6)
    state = json.loads((ck / "global_step4" / "growlm_state.json").read_text())
    assert state["growth_stage"] == 1 and state["model_config"]["n_embd"] == 64
    assert (ck / "latest").read_text() == "global_step4"


def test_growlm_prepare_killed_before_the_rename_is_taken_over(tmp_path):
    """A growlm-prepare killed with its folder complete in .tmp-<name>: nothing at --out, its lock file names the dead
    holder; the same command run again takes the staging folder and the lock over (no "being written" refusal, no
    "unknown" holder) and leaves neither behind."""
    docs = {}
    for split in ("train", "val"):
        docs[split] = tmp_path / f"{split}.txt"
        docs[split].write_text(f"The {split} text, a few words long, said twice. " * 40)
    out = tmp_path / "tokens"
    argv = ["--train", str(docs["train"]), "--val", str(docs["val"]), "--out", str(out)]
    cmd = [sys.executable, "-m", "growlm.data.prepare", *argv]
    assert killed_at("tokens.finish", [cmd], tmp_path) == [-signal.SIGKILL]
    staging, lock = tmp_path / ".tmp-tokens", tmp_path / ".tokens.lock"
    assert not out.exists() and (staging / "meta.json").is_file() and (staging / "train.bin").is_file()
    assert "(" in lock.read_text() and lock.read_text().startswith("pid ")  # the dead holder's line, not "unknown"

    r = subprocess.run(cmd, cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # staging and lock gone
    assert (out / "meta.json").is_file() and not list(tmp_path.glob(".tmp-*"))
