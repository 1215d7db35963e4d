"""runtime.processes: a watchdog on its way out kills every descendant, even one being started or orphaned."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import psutil

from growlm.runtime import launch, peers, processes


def test_a_rank_is_started_holding_the_spawn_lock(monkeypatch, tmp_path):
    held = []

    def popen(*args, **kwargs):
        held.append(processes.SPAWN_LOCK.locked())
        return "started"

    monkeypatch.setattr(launch.subprocess, "Popen", popen)
    assert launch.start_rank(["true"], {}, None, tmp_path / "rank0.log") == "started"
    assert held == [True] and not processes.SPAWN_LOCK.locked()


ORPHAN = textwrap.dedent("""
    import json, os, subprocess, sys
    from growlm.runtime import processes
    processes.adopt_orphans()
    # a child that starts a grandchild in a session of its own, prints its PID and exits: the grandchild is an orphan
    grandchild = ("import subprocess; print(subprocess.Popen(['sleep', '600'], start_new_session=True, "
                  "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)")
    child = subprocess.run([sys.executable, "-c", grandchild], capture_output=True, text=True, check=True)
    orphan = int(child.stdout)
    import psutil
    adopted = psutil.Process(orphan).ppid() == os.getpid()
    left = processes.kill_descendants(timeout_s=30)
    print(json.dumps({"orphan": orphan, "adopted": adopted, "left": left,
                      "locked": processes.SPAWN_LOCK.locked(), "children": processes.descendant_groups(os.getpid())}))
""")


def test_kill_descendants_reaches_an_orphan_and_holds_the_spawn_lock():
    out = subprocess.run([sys.executable, "-c", ORPHAN], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    try:
        gone = psutil.Process(seen["orphan"]).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        gone = True
    if not gone:  # do not leave a sleeper behind when the assertion below fails
        psutil.Process(seen["orphan"]).kill()
    assert seen["adopted"] and gone and seen["left"] == [] and seen["children"] == []
    assert seen["locked"]  # no child can be started after it


def killed_child() -> int:
    """The PID of a child killed by SIGKILL and left unreaped (a zombie, as a launcher's rank is for a moment)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child.kill()
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
        pass
    return child.pid


def test_a_silent_rank_whose_process_is_gone_is_named_killed_by_the_kernel(monkeypatch):
    """The survivor's line for a rank the kernel killed (SIGKILL: no word, no heartbeat, no process) before any
    checkpoint; a rank whose process is still there (stopped, hung) keeps the line it had; a rank on another host
    cannot be told from here."""
    host, dead, alive = socket.gethostname(), killed_child(), os.getpid()
    where = {1: (host, dead), 2: (host, alive), 3: ("another-host", dead)}
    monkeypatch.setattr(peers, "running", lambda: True)
    monkeypatch.setattr(peers, "rank_process", lambda r: where[r])
    monkeypatch.setitem(peers._STATE, "rank", 0)
    monkeypatch.setitem(peers._STATE, "doing", "training")
    monkeypatch.setitem(peers._STATE, "oom_kills", 3)
    monkeypatch.setattr(peers, "oom_kill_count", lambda: 3)
    monkeypatch.setattr(peers, "silent_ranks", lambda listen_s=4.0: ([], [1]))
    fix = "give it less to hold (a smaller model or micro batch, --activation_checkpointing, a higher ZeRO stage, more "
    assert peers.lost_rank_message(None) == (
        "rank 0: rank 1 was killed by the kernel, likely out of memory (its process ended without a word, as a SIGKILL "
        f"ends it) during training; the job ends here: {fix}ranks on more hosts), then run it again"
    )
    monkeypatch.setattr(peers, "oom_kill_count", lambda: 4)  # the kernel's out-of-memory killer struck meanwhile
    assert peers.lost_rank_message("runs/a/checkpoints").startswith(
        "rank 0: rank 1 was killed by the kernel, out of memory (this host's out-of-memory kills rose by 1 during the "
        "job) during training;"
    )
    for silent in ([2], [3]):
        monkeypatch.setattr(peers, "silent_ranks", lambda listen_s=4.0, s=silent: ([], s))
        assert f"rank {silent[0]} stopped answering (no heartbeat for 4 s)" in peers.lost_rank_message(None)


def test_a_sigkill_exit_status_is_named_and_the_oom_count_is_read():
    for code in (-9, 137, 247):
        assert processes.sigkill_note(code) == "killed by the kernel, likely out of memory (SIGKILL)"
    assert processes.sigkill_note(1) == processes.sigkill_note(-15) == ""
    count = processes.oom_kill_count()
    assert count is None or count >= 0
    assert processes.process_gone("another-host", os.getpid()) is None
    assert processes.process_gone(socket.gethostname(), os.getpid()) is False
