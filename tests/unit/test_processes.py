"""runtime.processes: a watchdog on its way out kills every descendant, even one being started or orphaned."""

import json
import subprocess
import sys
import textwrap

import psutil

from growlm.runtime import launch, processes


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
