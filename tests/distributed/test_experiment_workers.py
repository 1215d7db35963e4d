"""growlm-experiment's worker processes end with the command: SIGKILLed mid-run, it leaves no run training on (and
writing a curve) behind it (eval.experiments.runner.Workers, runtime.processes.exit_with_parent)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

SCRIPT = """
import time
from growlm.eval.experiments.runner import Workers
with Workers(2) as w:
    runs = [w.pool.submit(time.sleep, 600) for _ in range(2)]  # two runs in flight, one per worker
    print("ready", flush=True)
    time.sleep(600)
"""


def test_workers_end_when_the_command_is_killed():
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True)
    workers: list[psutil.Process] = []
    try:
        assert proc.stdout.readline().strip() == "ready"
        for _ in range(300):  # the pool starts its workers as the runs are submitted
            workers = [c for c in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(c.cmdline())]
            if len(workers) == 2:
                break
            time.sleep(0.1)
        assert len(workers) == 2  # killed now, before or after their watchdogs start: they were given the PID
        proc.kill()
        proc.wait(timeout=30)
        gone, alive = psutil.wait_procs(workers, timeout=20)
        assert not alive, f"workers {[p.pid for p in alive]} outlived the killed command"
        assert len(gone) == 2
    finally:  # nothing left behind when the check fails: the workers are no longer this process's descendants
        proc.kill()
        for w in workers:
            try:
                w.kill()
            except psutil.NoSuchProcess:
                pass
