"""runtime/: atomic writes and file modes, RunState (fixtures written by the code before RunState), the checkpoint
opener, safe loading (a crafted pickle is refused by every growlm loader and never runs), and the rank launcher.
Single process, no DeepSpeed engine; about 20 s."""

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
