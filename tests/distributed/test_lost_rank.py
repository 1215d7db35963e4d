"""A rank lost in the middle of the work: one rank of a 2-rank job killed (SIGKILL) or stopped (SIGSTOP) by PID at a
fixed moment, during training, a live growth or a checkpoint save; the other rank must end within a bounded time
with one line naming the lost rank, what the job was doing and the ``--resume`` that continues it (runtime.peers),
leave no checkpoint half-written or named by ``latest``, and the resumed job must train the steps the lost one did
not as an uninterrupted run does.

A killed rank's process is gone, and the line says it was killed (by the kernel, likely out of memory: the usual
sender of a SIGKILL); a stopped one's is still there, and the line says it stopped answering.

The moment is a test-only hold point (runtime/crash_points.py) armed on rank 1 only: rank 1 writes a marker and
sleeps there, rank 0 goes on into the next collective and waits for it; then the test signals rank 1. Tiny models,
2 ranks over gloo on CPU. The seconds from the signal to rank 0's exit are printed (``-s`` shows them), not asserted;
a rank 0 still running ``TIMEOUT_S`` + 90 s after the signal counts as hung (the default wait is 300 s, or forever).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dist_utils import GROWTH_AT_STEP_3, REPO, held_ranks, read_metrics, run_ranks, tiny_ds_config

from growlm.runtime import checkpoint

TIMEOUT_S = 12  # --dist_timeout_s of the held jobs: far below the default 300 s, so a wait that ignores it shows


@pytest.fixture(scope="module")
def job(tmp_path_factory, builtin_data):
    """The job's arguments (a growth at step 3, checkpoints at steps 2 and 4) and its uninterrupted run's metrics."""
    tmp = tmp_path_factory.mktemp("lost_rank")
    plan = tmp / "plan.yaml"
    plan.write_text(GROWTH_AT_STEP_3)
    args = ["--seq_len", "32", "--no_final_eval", "--log_interval", "1", "--ds_config", str(tiny_ds_config(tmp)),
            "--max_steps", "4", "--save_interval", "2", "--growth_plan", str(plan),
            "--dist_timeout_s", str(TIMEOUT_S)]  # fmt: skip
    ref = tmp / "uninterrupted"
    r = run_ranks([*args, "--out_dir", str(ref)], timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    return args, {m["step"]: m for m in read_metrics(ref)}


def rank1_signalled(point: str, sig: int, args: list[str], tmp: Path) -> tuple[int, str, float]:
    """Start the 2 ranks with ``point`` armed on rank 1 only; when rank 1 holds there, send it ``sig``. Returns rank
    0's exit code, its output, and the seconds from the signal to its exit. Rank 1 is killed at the end."""
    cmds = [[sys.executable, str(REPO / "train.py"), *args]] * 2
    with held_ranks(cmds, tmp, point, armed=[1]) as (procs, logs, _):
        time.sleep(1.0)  # rank 0 is now waiting in the collective after the point
        t0 = time.monotonic()
        os.kill(procs[1].pid, sig)
        try:
            code = procs[0].wait(timeout=TIMEOUT_S + 90)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - t0
        logs[0].seek(0)
        out = logs[0].read()
        print(f"{point} {signal.Signals(sig).name}: rank 0 ended {took:.1f} s after the signal (exit {code})")
        return code, out, took


def error_line(out: str) -> str:
    """Rank 0's one error line; no traceback anywhere in its output."""
    lines = [ln for ln in out.splitlines() if ln.startswith("growlm-train: error:")]
    assert len(lines) == 1 and "Traceback" not in out, out[-4000:]
    return lines[0]


def resumed_like_uninterrupted(args: list[str], out: Path, want: dict[int, dict]) -> None:
    """--resume from the last complete checkpoint trains steps 3 and 4 (the growth included) as the uninterrupted
    run did."""
    ck = out / "checkpoints"
    r = run_ranks([*args, "--out_dir", str(out), "--resume", str(ck)], timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    records = read_metrics(out)
    assert [m["step"] for m in records] == [1, 2, 3, 4]
    for m in records:
        assert abs(m["loss"] - want[m["step"]]["loss"]) <= 1e-6, (m, want[m["step"]])
    assert (ck / "latest").read_text() == "global_step4"
    assert checkpoint.existing_tags(ck) == ["global_step2", "global_step4"] and not list(ck.glob(".tmp-*"))


@pytest.mark.parametrize(
    ("point", "during"),
    [
        ("live.applied", "during the live growth of stage 'deeper-wider' at step 3"),
        ("checkpoint.written:global_step4", "during the save of checkpoint global_step4"),
    ],
    ids=["live-growth", "checkpoint-save"],
)
def test_a_killed_rank_is_named_and_the_job_resumes_exactly(job, tmp_path, point, during):
    args, want = job
    out = tmp_path / "run"
    code, text, took = rank1_signalled(point, signal.SIGKILL, [*args, "--out_dir", str(out)], tmp_path)
    assert code == 1, (code, took, text[-3000:])  # None: still waiting TIMEOUT_S + 90 s after (default wait 300 s)
    ck = out / "checkpoints"
    line = error_line(text)  # its process is gone (not stopped): killed, as the kernel's out-of-memory killer kills
    killed = ("killed by the kernel, out of memory (this host's out-of-memory kills rose by " in line) or (
        "killed by the kernel, likely out of memory (its process ended without a word, as a SIGKILL ends it)" in line
    )
    assert line.startswith("growlm-train: error: rank 0: rank 1 was killed by the kernel, ") and killed, line
    assert line.endswith(
        f" {during}; the job ends here: give it less to hold (a smaller model or micro batch, "
        "--activation_checkpointing, a higher ZeRO stage, more ranks on more hosts), then resume from the last "
        f"complete checkpoint with --resume {ck}"
    ), line
    # nothing half-written: latest names the last complete checkpoint, no unfinished save is left
    assert (ck / "latest").read_text() == "global_step2" and checkpoint.existing_tags(ck) == ["global_step2"]
    assert not list(ck.glob(".tmp-*")) and not list(ck.glob(".old-*"))
    checkpoint.open_checkpoint(ck)  # manifest and files check out
    resumed_like_uninterrupted(args, out, want)


@pytest.mark.parametrize(
    ("point", "during", "then"),
    [
        ("train.step:1", "during training", "run it again"),  # before the first checkpoint: nothing to resume
        ("live.applied", "during the live growth of stage 'deeper-wider' at step 3", "resume from the last"),
    ],
    ids=["training", "live-growth"],
)
def test_a_stopped_rank_is_named_once_the_timeout_passes(job, tmp_path, point, during, then):
    """SIGSTOP for longer than --dist_timeout_s: rank 0 waits the timeout (a growth included), then names rank 1."""
    args, _ = job
    out = tmp_path / "run"
    code, text, took = rank1_signalled(point, signal.SIGSTOP, [*args, "--out_dir", str(out)], tmp_path)
    assert code == 1, (code, took, text[-3000:])  # None: still waiting TIMEOUT_S + 90 s after the signal
    line = error_line(text)
    assert line.startswith(f"growlm-train: error: rank 0: rank 1 stopped answering (no heartbeat for 4 s) {during};")
    assert f"(it was killed or stopped, or its node or network is lost), then {then}" in line, line
    if then != "run it again":
        assert line.endswith(f"--resume {out / 'checkpoints'}"), line


def test_a_checkpoint_that_only_rank_0_sees_is_refused_by_every_rank(tmp_path):
    """Rank 0 decides whether the tag exists and every rank learns it: with a folder the nodes see differently, no
    rank waits in the save's barrier for one that refused (rank 0's folder holds the tag, rank 1's does not)."""
    r = run_ranks([str(tmp_path)], script="tests/save_verdict_probe.py", timeout=120)
    assert r.returncode == 0, r.stdout[-3000:]
    got = sorted((json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")), key=lambda d: d["rank"])
    want = f"CheckpointError: {tmp_path / 'rank0' / 'global_step3'} already exists; refusing to overwrite it"
    assert [d["rank"] for d in got] == [0, 1] and all(d["raised"].startswith(want) for d in got), got
    assert not (tmp_path / "rank1").exists()  # rank 1 wrote nothing


@pytest.mark.bad_input
def test_a_built_in_corpus_that_cannot_be_prepared_ends_every_rank_at_once(tmp_path):
    """Local rank 0 prepares the built-in corpus; when it cannot (here growlm's cache lies under a file), every rank
    learns it and the job ends with one line at once, instead of rank 1 waiting in a barrier for the timeout."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    cache = blocker / "cache"
    args = ["--preset", "tiny", "--seq_len", "32", "--max_steps", "1", "--no_final_eval", "--out_dir",
            str(tmp_path / "run"), "--dist_timeout_s", "300"]  # fmt: skip
    t0 = time.monotonic()
    r = run_ranks(args, timeout=120, env={"GROWLM_CACHE": str(cache)})  # 300 s of waiting would time this out
    print(f"refused on every rank in {time.monotonic() - t0:.1f} s")
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("growlm-train: error:")]
    assert r.returncode == 2 and "Traceback" not in r.stdout, r.stdout[-3000:]
    assert len(lines) == 1 and lines[0].startswith(
        "growlm-train: error: rank 0 could not prepare the built-in corpus: [Errno 20] Not a directory: "
    ), lines
    assert lines[0].endswith("; set GROWLM_CACHE to a folder every rank can write, or pass --data"), lines
    assert not (tmp_path / "run" / "checkpoints").exists()
