"""A stop that stops: SIGTERM to the ``deepspeed`` command of a job, SIGINT to one rank under the rank launcher,
SIGTERM to a single process with --no_final_save.

Real jobs of a tiny model with a --max_steps they would not reach for minutes: the test waits until a few steps
are logged, sends the signal, and requires every process of the job to be gone, one checkpoint at the step where
the ranks stopped (no tag after it), metrics.jsonl ending in a complete "interrupt" record, and (for the
``deepspeed`` job) that checkpoint resuming. DeepSpeed's runner ends on SIGTERM without passing it on (it forwards
signals only on its pdsh path), so there the ranks stop because their launcher is gone
(``runtime.processes.watch_launchers``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from dist_utils import REPO, SMALL_VOCAB, base_env, free_port, read_metrics, run_ranks, tiny_ds_config

from growlm.runtime import checkpoint, launch
from growlm.runtime.metrics_file import metrics_path, read_records
from growlm.runtime.processes import wait_procs

LONG = "100000"  # --max_steps: the job would run on for many minutes
GONE_WITHIN_S = 60.0  # generous: the ranks finish a step of a tiny model and save it


def _args(tmp_path: Path, data: Path, out: Path) -> list[str]:
    ds = tiny_ds_config(tmp_path, "zero1_fp32")
    return ["--preset", "tiny", "--seq_len", "32", "--data", str(data), "--vocab_size", str(SMALL_VOCAB),
            "--no_final_eval", "--log_interval", "1", "--ds_config", str(ds), "--max_steps", LONG,
            "--out_dir", str(out)]  # fmt: skip


def _wait_for_steps(out: Path, n: int, alive, log: Path, deadline_s: float = 180.0) -> None:
    """Wait until ``out``'s metrics.jsonl holds ``n`` train records; fail (with the log's tail) if ``alive()``
    turns false first or the deadline passes."""
    deadline = time.monotonic() + deadline_s
    while len(read_metrics(out)) < n:
        assert alive(), f"the job ended before {n} steps:\n{log.read_text(errors='replace')[-3000:]}"
        assert time.monotonic() < deadline, (
            f"no {n} steps in {deadline_s} s:\n{log.read_text(errors='replace')[-3000:]}"
        )
        time.sleep(0.2)


def _session_members(sid: int) -> list[int]:
    """PIDs of the live (non-zombie) processes of session ``sid``."""
    members = []
    for p in psutil.process_iter(["status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getsid(p.pid) == sid:
                members.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def _wait_gone(sid: int, timeout_s: float) -> list[int]:
    """Poll until session ``sid`` has no live process or ``timeout_s`` passes; returns those left."""
    deadline = time.monotonic() + timeout_s
    left = _session_members(sid)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _session_members(sid)
    return left


def _check_stopped_run(out: Path, signame: str) -> int:
    """The run folder of a run a signal stopped: one checkpoint, at the last step, named by ``latest`` and by the
    "interrupt" record that ends metrics.jsonl (a complete line). Returns that step."""
    records = read_records(out)
    steps = [r["step"] for r in records if r["event"] == "train"]
    last = steps[-1]
    assert steps == list(range(1, last + 1))
    assert records[-1] == {
        "event": "interrupt",
        "step": last,
        "signal": signame,
        "checkpoint": str(out / "checkpoints" / f"global_step{last}"),
        "tokens": last * 4 * 2 * 32,
        "flops": records[-2]["flops"],
    }
    assert metrics_path(out).read_text().endswith("}\n")
    save_dir = out / "checkpoints"
    assert checkpoint.existing_tags(save_dir) == [f"global_step{last}"]  # no tag after the stop, none before
    assert (save_dir / "latest").read_text() == f"global_step{last}"
    assert not list(save_dir.glob(".tmp-*"))
    return last


@pytest.mark.bad_input
def test_sigterm_to_the_deepspeed_command_stops_every_rank_after_a_step_and_saves(tmp_path, small_vocab_data):
    if shutil.which("numactl") is None:
        pytest.skip("the deepspeed launcher needs numactl on CPU (apt-get install numactl; make setup does)")
    deepspeed = REPO / ".venv" / "bin" / "deepspeed"
    out, log = tmp_path / "ds", tmp_path / "ds.log"
    cmd = [str(deepspeed) if deepspeed.exists() else "deepspeed", "--num_gpus", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), "train.py", *_args(tmp_path, small_vocab_data, out)]  # fmt: skip
    with open(log, "w") as f:
        job = subprocess.Popen(
            cmd, cwd=REPO, env=base_env(), stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        _wait_for_steps(out, 3, lambda: job.poll() is None, log)
        tree = psutil.Process(job.pid).children(recursive=True)
        assert len([p for p in tree if "train.py" in " ".join(p.cmdline())]) >= 3  # launch.py and the two ranks
        os.kill(job.pid, signal.SIGTERM)
        assert job.wait(timeout=30) == -signal.SIGTERM  # DeepSpeed's runner dies and passes nothing on
        left = _wait_gone(job.pid, GONE_WITHIN_S)
        assert left == [], f"still running {GONE_WITHIN_S} s after SIGTERM: {left}\n{log.read_text()[-3000:]}"
    finally:
        for pid in _session_members(job.pid):
            os.kill(pid, signal.SIGKILL)
    text = log.read_text(errors="replace")
    last = _check_stopped_run(out, "SIGTERM")
    assert f"stopped after step {last} of {LONG}, checkpoint {out / 'checkpoints' / f'global_step{last}'}" in text
    assert f"--out_dir {out} --resume {out / 'checkpoints'}" in text  # the resume command, launcher and all
    assert "deepspeed --num_gpus 2" in text.split("resume: ")[-1]

    r = run_ranks([*_args(tmp_path, small_vocab_data, out)[:-4], "--max_steps", str(last + 2), "--out_dir", str(out),
                   "--resume", str(out / "checkpoints")])  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:]
    assert [m["step"] for m in read_metrics(out)] == list(range(1, last + 3))
    assert checkpoint.existing_tags(out / "checkpoints") == [f"global_step{last}", f"global_step{last + 2}"]


@pytest.mark.bad_input
def test_sigint_to_one_rank_stops_both_at_the_same_step(tmp_path, small_vocab_data):
    out, port = tmp_path / "rl", free_port()
    argv = [sys.executable, str(REPO / "train.py"), *_args(tmp_path, small_vocab_data, out)]
    procs = [
        launch.start_rank(argv, launch.rank_env(r, 2, port, base_env()), REPO, tmp_path / f"rank{r}.log")
        for r in range(2)
    ]
    try:
        _wait_for_steps(out, 2, lambda: all(p.returncode is None for p in procs), tmp_path / "rank0.log")
        os.kill(procs[1].pid, signal.SIGINT)  # rank 1 only: rank 0 learns of it with the step's loss
        codes, _, timed_out = wait_procs(procs, GONE_WITHIN_S, GONE_WITHIN_S)
    finally:
        for p in procs:
            if p.returncode is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    logs = [(tmp_path / f"rank{r}.log").read_text(errors="replace") for r in range(2)]
    assert not timed_out and codes == [130, 130], (codes, logs[0][-2000:], logs[1][-2000:])
    last = _check_stopped_run(out, "SIGINT")
    assert f"growlm: SIGINT on another rank: stopped after step {last} of {LONG}" in logs[0]
    assert "Traceback" not in logs[0] + logs[1]


@pytest.mark.bad_input
def test_sigterm_with_no_final_save_stops_without_a_checkpoint(tmp_path, small_vocab_data):
    out = tmp_path / "one"
    argv = [sys.executable, str(REPO / "train.py"), *_args(tmp_path, small_vocab_data, out), "--no_final_save"]
    rank = launch.start_rank(argv, launch.rank_env(0, 1, free_port(), base_env()), REPO, tmp_path / "rank0.log")
    codes, timed_out = _sigterm_after(rank, lambda: _wait_for_steps(out, 2, lambda: rank.returncode is None,
                                                                    tmp_path / "rank0.log"))  # fmt: skip
    log = (tmp_path / "rank0.log").read_text(errors="replace")
    assert not timed_out and codes == [143], log[-2000:]
    records = read_records(out)
    last = records[-2]["step"]
    assert records[-1] == {"event": "interrupt", "step": last, "signal": "SIGTERM", "checkpoint": None,
                           "tokens": last * 4 * 32, "flops": records[-2]["flops"]}  # fmt: skip
    assert checkpoint.existing_tags(out / "checkpoints") == []
    assert f"growlm: SIGTERM received: stopped after step {last} of {LONG}; no checkpoint of this step" in log


def _sigterm_after(rank, wait) -> tuple[list[int], bool]:
    """Call ``wait()`` (it returns at the moment to stop), SIGTERM ``rank`` and reap it within ``GONE_WITHIN_S``;
    its process group is SIGKILLed if anything fails. Returns (exit codes, timed out)."""
    try:
        wait()
        os.kill(rank.pid, signal.SIGTERM)
        codes, _, timed_out = wait_procs([rank], GONE_WITHIN_S, GONE_WITHIN_S)
    finally:
        if rank.returncode is None:
            os.killpg(rank.pid, signal.SIGKILL)
            rank.wait()
    return codes, timed_out


def _wait_for_text(log: Path, text: str, alive, deadline_s: float = 180.0) -> None:
    """Wait until ``log`` holds ``text``; fail (with the log's tail) if ``alive()`` turns false first or the
    deadline passes."""
    deadline = time.monotonic() + deadline_s
    while text not in (log.read_text(errors="replace") if log.is_file() else ""):
        assert alive(), f"the job ended before printing {text!r}:\n{log.read_text(errors='replace')[-3000:]}"
        assert time.monotonic() < deadline, f"no {text!r} in {deadline_s} s:\n{log.read_text(errors='replace')[-3000:]}"
        time.sleep(0.05)


@pytest.mark.parametrize("when", ["before", "after"])
def test_sigterm_during_the_held_out_evaluation_ends_it_within_a_few_batches(tmp_path, small_vocab_data, when):
    """The evaluation before and after training scores held-out tokens at every token (--eval_stride 1, one window
    per forward call: seconds to a minute for the tiny model); a SIGTERM during it ends it at the ranks' next
    stop check (before every forward call), not after it: before training the run then stops before its first step with
    nothing saved, after training it ends without the evaluation's "val" record, with the checkpoint of its last
    step, and with status 143 (not 0)."""
    out = tmp_path / "run"
    args = [a for a in _args(tmp_path, small_vocab_data, out) if a != "--no_final_eval"]
    args[args.index("--max_steps") + 1] = "2"
    tokens = (
        "20000" if when == "before" else "4000"
    )  # about 45 s and 9 s at stride 1 (the evaluation before runs whole)
    argv = [sys.executable, str(REPO / "train.py"), *args, "--eval_stride", "1", "--eval_batch_size", "1",
            "--final_eval_tokens", tokens]  # fmt: skip
    log = tmp_path / "rank0.log"
    rank = launch.start_rank(argv, launch.rank_env(0, 1, free_port(), base_env()), REPO, log)
    # before: the run's announcement (its handlers are installed); after: the last step's save
    ready = "growlm: model" if when == "before" else f"growlm: saved checkpoint {out / 'checkpoints' / 'global_step2'}"
    codes, timed_out = _sigterm_after(rank, lambda: _wait_for_text(log, ready, lambda: rank.returncode is None))
    text = log.read_text(errors="replace")
    assert not timed_out and codes == [143], text[-2000:]
    records = read_records(out)
    if when == "before":
        assert "growlm: SIGTERM received: the evaluation before training stopped early" in text
        assert "held-out perplexity before training" not in text
        assert "stopped before training (at step 0); nothing to save" in text
        assert [r for r in records if r["event"] == "train"] == [] and checkpoint.existing_tags(
            out / "checkpoints"
        ) == []
    else:
        assert "growlm: SIGTERM received: training finished; the evaluation after it stopped early" in text
        assert "held-out perplexity after" not in text and [r["step"] for r in records if r["event"] == "train"] == [
            1,
            2,
        ]
        assert [r for r in records if r["event"] == "val"] == []
        assert checkpoint.existing_tags(out / "checkpoints") == ["global_step2"]
