"""Run by tests/distributed/test_clean_exit.py as every rank of a real 2-rank job: are process groups really gone?

    python tests/exit_probe.py DS_CONFIG OUT_JSON

Builds a tiny GPT engine (ZeRO stage and precision from DS_CONFIG), takes two steps, releases the engine
(runtime.engine.release_engine) and closes the process groups (runtime.dist.close_distributed). Each rank writes
OUT_JSON.rankN with the communication threads alive before and after the close (``live_comm_threads``) and
whether torch.distributed.nn's collectives captured the default group as a default argument. A group that survives
the close keeps gloo worker threads into the interpreter's teardown, where a rank can abort with "terminate called
without an active exception" after a finished run.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from growlm.runtime.dist import close_distributed, init_distributed  # noqa: E402


def live_comm_threads() -> list[str]:
    """Names of this process's threads that belong to a process group (gloo worker and transport loops, the TCP
    store server), read from /proc/self/task; empty after ``close_distributed`` freed every group, and on a system
    without /proc."""
    prefixes = ("pt_gloo", "gloo_", "pt_tcpstore", "pt_nccl")
    names = []
    try:
        for task in os.listdir("/proc/self/task"):
            try:
                name = Path(f"/proc/self/task/{task}/comm").read_text().strip()
            except OSError:  # the thread ended meanwhile
                continue
            if name.startswith(prefixes):
                names.append(name)
    except OSError:
        return []
    return sorted(names)


info = init_distributed(120)

import torch  # noqa: E402
import torch.distributed.nn.functional as dist_nn  # noqa: E402

from growlm.model.config import GPTConfig  # noqa: E402
from growlm.runtime.engine import build_engine, release_engine  # noqa: E402

ds_path, out_path = sys.argv[1:3]
ds_cfg = json.loads(Path(ds_path).read_text())
ds_cfg["scheduler"]["params"].update(total_num_steps=10, warmup_num_steps=1)
ds_cfg["train_micro_batch_size_per_gpu"] = 2
ds_cfg.pop("train_batch_size", None)
cfg = GPTConfig(n_layer=2, n_embd=32, n_head=2, n_positions=16, vocab_size=97)
torch.manual_seed(0)  # the same GPT-2 init on every rank, as train.py builds a fresh engine (not under zero.Init)
engine = build_engine(cfg, None, ds_cfg)
gen = torch.Generator().manual_seed(info.rank)
losses = []
for _ in range(2):
    x = torch.randint(0, 97, (2, 17), generator=gen)
    loss = engine(x[:, :-1], x[:, 1:])
    engine.backward(loss)
    engine.step()
    losses.append(float(loss))
before = live_comm_threads()
release_engine(engine)
del engine, loss
close_distributed()
result = {
    "rank": info.rank,
    "losses": losses,
    "threads_before_close": before,
    "threads_after_close": live_comm_threads(),
    "nn_default_group": repr(dist_nn.all_reduce.__defaults__[-1]),
}
Path(f"{out_path}.rank{info.rank}").write_text(json.dumps(result))
