"""A rank's process groups are gone once it closes them, at every ZeRO stage (2 real ranks, gloo, CPU).

The cause of the rare "terminate called without an active exception" abort (SIGABRT, exit -6) after a finished
run: torch.distributed.nn.functional binds ``group=group.WORLD`` as a default argument when it is first imported,
and DeepSpeed's engine imports it after the group exists; the default group then outlived destroy_process_group,
and so did its gloo worker threads, until the interpreter's teardown (where a worker that needs the GIL is ended by
a forced unwind). ZeRO-3 parameters kept the data-parallel group alive the same way through their closures.
runtime.dist imports torch.distributed.nn first and closes DeepSpeed's groups; runtime.engine.release_engine drops
the ZeRO-3 closures. ``tests/stress_exit.py`` (not part of the suite) repeats whole runs and counts aborts.
"""

from __future__ import annotations

import json

import pytest
from dist_utils import run_ranks

GROUP_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop", "pt_tcpstore_uv")


@pytest.mark.parametrize("template", ["zero1_fp32", "zero2_fp32", "zero3_fp32"])
def test_close_joins_every_process_group_thread(tmp_path, template):
    out = tmp_path / "exit.json"
    r = run_ranks([f"ds_configs/{template}.json", str(out)], script="tests/exit_probe.py", timeout=300)
    assert r.returncode == 0, r.stdout[-4000:]
    for rank in range(2):
        res = json.loads((tmp_path / f"exit.json.rank{rank}").read_text())
        assert all(loss == loss and loss > 0 for loss in res["losses"])  # the engine really trained (finite)
        # while training, the gloo workers of the default group exist (the probe would see a broken reader)
        assert any(t.startswith(GROUP_THREADS) for t in res["threads_before_close"]), res
        assert res["threads_after_close"] == [], res  # every group freed: no worker left for the teardown
        assert res["nn_default_group"] == "None"  # torch.distributed.nn did not capture the default group
