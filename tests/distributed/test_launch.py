"""The rank launcher (runtime.launch.launch_ranks: fresh processes) and the tests' fork server (tests/rank_server.py,
which run_ranks uses): rendezvous variables, per-rank output, exit codes, stragglers killed. About 15 s."""

from __future__ import annotations

import sys
import time

from growlm.runtime.launch import launch_ranks


def test_launch_ranks_sets_rendezvous_and_collects_output(tmp_path):
    code = "import os; print(os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['LOCAL_RANK'], " \
           "os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'], os.environ['EXTRA'])"  # fmt: skip
    res = launch_ranks([sys.executable, "-c", code], 3, envs=[{"EXTRA": str(r * 10)} for r in range(3)],
                       log_dir=tmp_path / "logs")  # fmt: skip
    assert res.returncode == 0 and not res.timed_out and all(rss > 0 for rss in res.max_rss_bytes)
    rows = [o.split() for o in res.outputs]
    assert [r[:4] for r in rows] == [[str(r), "3", str(r), "127.0.0.1"] for r in range(3)]
    assert len({r[4] for r in rows}) == 1 and [r[5] for r in rows] == ["0", "10", "20"]  # one port, per-rank env
    assert (tmp_path / "logs" / "rank2.log").read_text() == res.outputs[2] and "--- rank 1\n" in res.output


def test_launch_ranks_kills_stragglers_after_a_failure_and_on_timeout():
    t0 = time.monotonic()
    res = launch_ranks([[sys.executable, "-c", "import sys; print('bad'); sys.exit(3)"],
                        [sys.executable, "-c", "import time; time.sleep(60)"]], 2, grace_s=0.5)  # fmt: skip
    assert res.returncodes[0] == 3 and res.returncodes[1] < 0 and res.returncode == 3 and not res.timed_out
    assert time.monotonic() - t0 < 20 and res.outputs[0] == "bad\n"
    res = launch_ranks([sys.executable, "-c", "import time; time.sleep(60)"], 2, timeout_s=1)
    assert res.timed_out and all(c < 0 for c in res.returncodes)


def test_the_fork_server_starts_ranks_as_python_script_would(tmp_path):
    """Ranks forked by tests/rank_server.py: own PID and session, this process their parent, the request's argv,
    folder, environment, umask and sys.path[0], ``__main__``, one OpenMP thread, a working garbage collector, exit
    codes and atexit as a fresh process."""
    import json
    import os
    import subprocess

    import pytest
    from dist_utils import REPO, run_ranks

    script = tmp_path / "probe.py"
    script.write_text(
        "import atexit, gc, json, os, sys, torch, weakref\n"
        "atexit.register(lambda: open(sys.argv[1] + os.environ['RANK'], 'w').write('exited'))\n"
        "mask = os.umask(0); os.umask(mask)\n"
        "class Cycle: pass\n"
        "c = Cycle(); c.me = c; ref = weakref.ref(c); del c; gc.collect()\n"  # the rank's own garbage is collected
        "print(json.dumps(dict(rank=os.environ['RANK'], world=os.environ['WORLD_SIZE'], cwd=os.getcwd(), argv=sys.argv,"
        " path0=sys.path[0], pid=os.getpid(), ppid=os.getppid(), sid=os.getsid(0), threads=torch.get_num_threads(),"
        " main=__name__, x=float(torch.ones(3).sum()), mask=mask, gc=gc.isenabled(), collected=ref() is None)))\n"
        "sys.exit(3 * int(os.environ['RANK']))\n"
    )
    mask = os.umask(0o027)  # the umask at the request is the rank's (not the one the server started with)
    try:
        res = run_ranks([str(tmp_path / "done")], script=str(script))
    finally:
        os.umask(mask)
    assert res.returncode == 3 and "--- rank 1\n" in res.stdout
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert [r["rank"] for r in rows] == ["0", "1"] and {r["world"] for r in rows} == {"2"}
    for r in rows:
        assert r["argv"] == [str(script), str(tmp_path / "done")] and r["path0"] == str(tmp_path)
        assert r["cwd"] == str(REPO) and r["main"] == "__main__" and r["threads"] == 1 and r["x"] == 3.0
        assert r["pid"] == r["sid"] != os.getpid() and r["ppid"] == os.getpid() and r["mask"] == 0o027
        assert r["gc"] and r["collected"]  # the server's imports are frozen (gc.freeze), the rank's objects are not
    assert [(tmp_path / f"done{r}").read_text() for r in range(2)] == ["exited", "exited"]
    script.write_text("import time\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        run_ranks([], script=str(script), timeout=2)


def test_the_fork_server_refuses_what_a_fresh_start_would_and_a_dead_server_means_fresh_starts(tmp_path, monkeypatch):
    """A bad working folder or log raises the OSError a fresh start would; a server that dies fails the request in
    flight with its log, and every later rank of the session starts fresh."""
    import os

    import pytest
    import rank_server

    server = rank_server.RankServer()
    try:
        script = [str(tmp_path / "x.py")]
        with pytest.raises(FileNotFoundError):
            server.fork(script, dict(os.environ), tmp_path / "missing", tmp_path / "a.log")
        with pytest.raises(FileNotFoundError):
            server.fork(script, dict(os.environ), tmp_path, tmp_path / "missing" / "a.log")
        assert not server.broken
        server._proc.kill()
        server._proc.wait()
        with pytest.raises(RuntimeError, match="rank fork server died; later ranks start fresh"):
            server.fork(script, dict(os.environ), tmp_path, tmp_path / "a.log")
        assert server.broken
        fresh_calls = []
        monkeypatch.setattr(rank_server, "_SERVER", server)
        start = rank_server.make_start_rank(lambda *a: fresh_calls.append(a) or "fresh")
        env = {**os.environ, "DS_ACCELERATOR": "cpu"}
        assert start([sys.executable, *script], env, tmp_path, tmp_path / "b.log") == "fresh" and fresh_calls
    finally:
        server.close()
