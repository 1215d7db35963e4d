"""Run by tests/dist/test_growth_memory.py as every rank of a real 2-rank job: does an engine's memory return?

    python tests/growth_memory_probe.py DS_CONFIG MODE OUT_JSON

MODE ``grow``: train a tiny GPT, grow it live 4 times (depth and width in turn, exact duplication), one step after
each growth; after each, weak references to the replaced engine, its module and its optimizer must be dead.
MODE ``release``: build an engine, take a step, release it (runtime.engine.release_engine), drop it and collect;
no growth. Rank 0 writes OUT_JSON with, per rank (gathered): which weak references are still alive, the number of
live ``GPT`` modules (gc.get_objects), RSS (VmRSS, bytes) before and after, and (grow) each growth's phase record.
"""

from __future__ import annotations

import functools
import gc
import json
import sys
import weakref
from pathlib import Path

from growlm.runtime.dist import init_distributed  # noqa: E402

info = init_distributed(120)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from growlm.growth.live.grow import collect_old_engine, grow_engine  # noqa: E402
from growlm.growth.ops import make_rules  # noqa: E402
from growlm.growth.ops.apply import OptimizerPolicy  # noqa: E402
from growlm.growth.ops.schedule_rule import ScheduleRule  # noqa: E402
from growlm.model.config import GPTConfig  # noqa: E402
from growlm.model.gpt2.model import GPT  # noqa: E402
from growlm.runtime.engine import build_engine, release_engine  # noqa: E402
from growlm.runtime.process_memory import rss_bytes  # noqa: E402

ds_path, mode, out_path = sys.argv[1:4]
ds_cfg = json.loads(Path(ds_path).read_text())
ds_cfg["scheduler"]["params"].update(total_num_steps=40, warmup_num_steps=2)
ds_cfg["train_micro_batch_size_per_gpu"] = 4
partitioned = ds_cfg["zero_optimization"]["stage"] == 3
gen = torch.Generator().manual_seed(100 + info.rank)
SHAPES = [(1, 32, 2), (2, 32, 2), (2, 64, 4), (4, 64, 4), (4, 128, 8)]  # n_layer, n_embd, n_head: depth, width, ...


def config(n_layer: int, n_embd: int, n_head: int) -> GPTConfig:
    return GPTConfig(n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_positions=16, vocab_size=97)


def train_step(engine) -> None:
    x = torch.randint(0, 97, (4, 17), generator=gen)
    loss = engine(x[:, :-1], x[:, 1:])
    engine.backward(loss)
    engine.step()


def refs(engine) -> dict[str, weakref.ref]:
    return {
        "engine": weakref.ref(engine),
        "module": weakref.ref(engine.module),
        "optimizer": weakref.ref(engine.optimizer),
    }


def alive(wrefs: dict[str, weakref.ref]) -> list[str]:
    return [k for k, r in wrefs.items() if r() is not None]


def live_tensor_bytes() -> int:
    """Bytes of every tensor storage reachable from Python objects (each storage once), after a collection."""
    gc.collect()
    storages: dict[int, int] = {}
    for o in gc.get_objects():
        if isinstance(o, torch.Tensor) and not o.is_meta:
            st = o.untyped_storage()
            storages[st.data_ptr()] = max(storages.get(st.data_ptr(), 0), st.nbytes())
    return sum(storages.values())


def live_gpts() -> int:
    gc.collect()
    return sum(isinstance(o, GPT) for o in gc.get_objects())


torch.manual_seed(0)
rss_start = rss_bytes()
engine = build_engine(config(*SHAPES[0]), None, ds_cfg)
train_step(engine)
rss_before = rss_bytes()
left_alive, growths = [], []
if mode == "release":
    wrefs = refs(engine)
    release_engine(engine)
    del engine
    gc.collect()
    left_alive.append(alive(wrefs))
    gpts = live_gpts()
else:
    for old_shape, new_shape in zip(SHAPES[:-1], SHAPES[1:], strict=True):
        wrefs = refs(engine)
        family_plan = make_rules(config(*old_shape), config(*new_shape), "duplicate")
        result = grow_engine(
            engine,
            family_plan,
            functools.partial(build_engine, ds_config=ds_cfg, partitioned=partitioned),
            policy=OptimizerPolicy(moments="carry"),
            schedule_rule=ScheduleRule(),
        )
        engine = result.engine
        result = collect_old_engine(result)
        left_alive.append(alive(wrefs))
        growths.append(
            {"seconds": result.seconds, "phase_seconds": result.phase_seconds, "phase_bytes": result.phase_bytes,
             "peak_rss_bytes": result.peak_rss_bytes}
        )  # fmt: skip
        del result
        train_step(engine)
    gpts = live_gpts()
rss_after = rss_bytes()
tensors = {}
if mode == "grow":  # the grown engine's tensors against a fresh engine of the same shape, after one step each
    tensors["grown"] = live_tensor_bytes()
    release_engine(engine)
    del engine
    engine = build_engine(config(*SHAPES[-1]), None, ds_cfg)
    train_step(engine)
    tensors["fresh"] = live_tensor_bytes()
mine = {"rank": info.rank, "left_alive": left_alive, "live_gpts": gpts, "rss_start": rss_start,
        "rss_before": rss_before, "rss_after": rss_after, "growths": growths, "tensor_bytes": tensors}  # fmt: skip
ranks = [None] * info.world_size
dist.all_gather_object(ranks, mine)
if info.rank == 0:
    Path(out_path).write_text(json.dumps({"mode": mode, "ranks": ranks}))
dist.barrier()
