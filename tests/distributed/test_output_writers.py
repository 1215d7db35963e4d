"""One writer per output: two real growlm-grow processes with --overwrite into one output folder, many rounds; a
writer held inside its write refuses a second one (exit status 2, one line naming the holder) and, killed there,
leaves the earlier output whole. CPU, preset tiny, one rank, a checkpoint after step 2."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
from cli_utils import one_error_line
from dist_utils import REPO, SMALL_DATA, SMALL_VOCAB, base_env, run_ranks, tiny_ds_config

from growlm.growth.offline.cli import main as grow_main
from growlm.runtime import checkpoint
from growlm.runtime.crash_points import HOLD_AT_ENV, HOLD_DIR_ENV
from growlm.runtime.lock import output_lock, output_lock_path
from growlm.runtime.manifest import verify_manifest

ROUNDS = 10
# the one line of a writer refused because another holds the output (runtime.lock.output_held_message)
HELD = re.compile(
    r"output (?P<out>\S+) is being written by another process \(pid (?P<pid>\d+) on host \S+ since "
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(\S+\); lock (?P<lock>\S+)\); nothing was changed: wait for it to end, "
    r"or choose another output"
)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, small_vocab_data) -> Path:
    """A tiny ZeRO-2 run of one rank, saved after step 2: its checkpoint folder."""
    root = tmp_path_factory.mktemp("writers")
    args = ["--preset", "tiny", "--vocab_size", str(SMALL_VOCAB), "--seq_len", "32", "--data", str(SMALL_DATA)]
    args += ["--no_final_eval", "--max_steps", "2", "--ds_config", str(tiny_ds_config(root))]
    r = run_ranks([*args, "--out_dir", str(root / "run")], nproc=1)
    assert r.returncode == 0, r.stdout[-3000:]
    return root / "run" / "checkpoints"


def grow_cmd(ckpt: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "growlm.growth.offline.cli", str(ckpt), str(out), *extra]


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def assert_whole(out: Path) -> None:
    """``out`` is a complete growlm-grow output: it opens (manifest verified) and nothing else lies beside it."""
    opened = checkpoint.open_checkpoint(out)
    assert opened.state.universal and opened.state.global_step == 2
    assert verify_manifest(out / opened.tag)
    assert sorted(p.name for p in out.parent.iterdir() if p.name != "hold") == [out.name]  # no .tmp-, .old-, lock


def forked_grow(argv: list[str], err: Path) -> int:
    """Start ``growlm-grow ARGV`` in a child process forked from this one (growlm already imported, so a round costs
    no interpreter start), its stderr into ``err``; returns the child's pid (its exit status is growlm-grow's)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        rc = 1
        try:
            fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 2)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
            rc = grow_main(argv)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(rc)
    return pid


@pytest.mark.bad_input
def test_two_growlm_grow_overwrite_one_output(ckpt, tmp_path):
    out = tmp_path / "grown"
    assert grow_main([str(ckpt), str(out)]) == 0  # the earlier output
    assert_whole(out)
    outcomes = []
    for i in range(ROUNDS):
        errs = [tmp_path.parent / f"{tmp_path.name}-round{i}-{k}.err" for k in range(2)]
        pids = [forked_grow([str(ckpt), str(out), "--overwrite"], e) for e in errs]
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
        for rc, e, pid in zip(codes, errs, pids, strict=True):
            err = e.read_text()
            assert "Traceback" not in err, err
            assert rc in (0, 2), err
            if rc == 2:
                m = HELD.fullmatch(one_error_line(err, "growlm-grow"))
                assert m, err
                assert int(m["pid"]) == next(q for q in pids if q != pid) and m["out"] == str(out)
                assert m["lock"] == str(output_lock_path(out)) == str(tmp_path / ".grown.lock")
        assert 0 in codes  # at least one writer succeeds each round
        assert_whole(out)  # and leaves a whole output, nothing half-written beside it
        outcomes.append(sorted(codes))
    assert all(o in ([0, 0], [0, 2]) for o in outcomes), outcomes


def default_sigint() -> None:
    """In a child before exec: SIGINT's default action back, so the new interpreter turns it into KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def held_writer(ckpt: Path, out: Path, hold: Path) -> subprocess.Popen:
    """A growlm-grow --overwrite of ``ckpt`` into ``out``, started and waited for until it is held inside its write,
    at the hold point before its output is put in place (runtime.crash_points; ``hold``: the hold folder)."""
    env = base_env(**{HOLD_AT_ENV: "grow.commit", HOLD_DIR_ENV: str(hold)})
    # SIGINT as a terminal delivers it: pytest-xdist's workers ignore it, and an ignored signal is inherited
    holder = subprocess.Popen(grow_cmd(ckpt, out, "--overwrite"), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)  # fmt: skip
    deadline = time.monotonic() + 120
    while not (hold.is_dir() and any(hold.iterdir())):
        assert holder.poll() is None and time.monotonic() < deadline, holder.stderr.read()
        time.sleep(0.1)
    return holder


@pytest.mark.bad_input
def test_a_writer_inside_its_write_refuses_a_second_and_killed_leaves_the_old_output(ckpt, tmp_path):
    out = tmp_path / "grown"
    assert grow_main([str(ckpt), str(out)]) == 0
    before = digest(out)
    holder = held_writer(ckpt, out, tmp_path / "hold")
    try:
        for extra in (["--overwrite"], []):  # with --overwrite, and without it (the output exists)
            r = subprocess.run(grow_cmd(ckpt, out, *extra), cwd=REPO, env=base_env(), capture_output=True, text=True)
            assert r.returncode == 2, r.stderr
            m = HELD.fullmatch(one_error_line(r.stderr, "growlm-grow"))
            assert m and int(m["pid"]) == holder.pid and m["out"] == str(out), r.stderr
            assert digest(out) == before
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=60)
    # killed inside its write: the earlier output is whole; its staging folder and lock file stay, and are taken over
    assert digest(out) == before
    assert (tmp_path / ".tmp-grown").is_dir() and output_lock_path(out).is_file()
    checkpoint.open_checkpoint(out)
    assert grow_main([str(ckpt), str(out), "--overwrite"]) == 0
    assert_whole(out)


@pytest.mark.bad_input
def test_an_export_into_a_folder_being_written_is_refused(ckpt, tmp_path, capsys):
    hf = tmp_path / "hf"
    assert grow_main([str(ckpt), "--export_hf", str(hf)]) == 0
    before = digest(hf)
    capsys.readouterr()
    with output_lock(hf):  # this process writes it
        for extra in (["--overwrite"], []):
            assert grow_main([str(ckpt), "--export_hf", str(hf), *extra]) == 2
            line = one_error_line(capsys.readouterr().err, "growlm-grow")
            m = HELD.fullmatch(line.replace(f"--export_hf {hf}", f"output {hf}", 1))
            assert line.startswith(f"--export_hf {hf} is being written") and m and int(m["pid"]) == os.getpid(), line
            assert digest(hf) == before
    assert grow_main([str(ckpt), "--export_hf", str(hf), "--overwrite"]) == 0  # free again: replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


@pytest.mark.bad_input
def test_ctrl_c_inside_a_write_ends_in_one_line_and_keeps_the_old_output(ckpt, tmp_path):
    out = tmp_path / "grown"
    assert grow_main([str(ckpt), str(out)]) == 0
    before = digest(out)
    holder = held_writer(ckpt, out, tmp_path / "hold")
    os.kill(holder.pid, signal.SIGINT)
    _, err = holder.communicate(timeout=60)
    assert holder.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert lines == [
        "growlm-grow: interrupted (SIGINT) before it finished; no finished output was changed (outputs are put in "
        "place only when complete; an unfinished .tmp- folder is replaced by the next run)"
    ], err
    assert digest(out) == before
    assert grow_main([str(ckpt), str(out), "--overwrite"]) == 0  # the lock went with the interrupted writer
    assert_whole(out)
