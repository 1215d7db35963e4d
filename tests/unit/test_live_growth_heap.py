"""A live growth (growth.live.grow.grow_engine) returns the heap that DeepSpeed's build of the new engine freed
before it allocates the new engine's Adam state and the gather's working set, so those transients are not held
under the growth's peak (growth.live.grow's module docstring has the measurement). One real growth of a tiny GPT at
ZeRO-2 in this process, over a one-rank gloo group; nothing here measures memory."""

from __future__ import annotations

import json

import deepspeed.comm.comm as ds_comm
import pytest
import torch
import torch.distributed as dist

from growlm.growth.live import grow as live
from growlm.growth.ops import make_rules
from growlm.growth.ops.apply import OptimizerPolicy
from growlm.growth.ops.schedule_rule import ScheduleRule
from growlm.model.config import GPTConfig
from growlm.runtime.ds_config import shipped_ds_config
from growlm.runtime.engine import build_engine


@pytest.fixture
def one_rank_group(monkeypatch):
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    for k, v in {**env, "MASTER_PORT": "29591", "DS_ACCELERATOR": "cpu"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(ds_comm, "cdb", ds_comm.cdb)  # DeepSpeed's handle on this group goes with it
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_builds_freed_heap_is_returned_before_the_growth_allocates_more(one_rank_group, monkeypatch):
    ds_cfg = json.loads(shipped_ds_config(2, "fp32", "cpu").read_text())
    ds_cfg.update(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1)
    ds_cfg["scheduler"]["params"]["total_num_steps"] = 100
    old_cfg = GPTConfig(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=8)
    new_cfg = GPTConfig(n_layer=1, n_embd=64, n_head=4, vocab_size=64, n_positions=8)
    torch.manual_seed(0)
    engine = build_engine(old_cfg, None, ds_cfg)
    x = torch.randint(0, 64, (1, 9), generator=torch.Generator().manual_seed(1))
    engine.backward(engine(x[:, :-1], x[:, 1:]))
    engine.step()

    events: list[str] = []

    def spy(name, f):
        def call(*args, **kwargs):
            events.append(name)
            return f(*args, **kwargs)

        return call

    monkeypatch.setattr(live, "release_heap", spy("release_heap", live.release_heap))
    monkeypatch.setattr(live, "ensure_adam_state", spy("adam_state", live.ensure_adam_state))
    monkeypatch.setattr(live, "transfer", spy("transfer", live.transfer))

    def build(cfg, masks, **kwargs):
        new = build_engine(cfg, masks, ds_cfg, **kwargs)
        events.append("built")
        return new

    plan = make_rules(old_cfg, new_cfg, "duplicate")
    result = live.grow_engine(engine, plan, build, policy=OptimizerPolicy(), schedule_rule=ScheduleRule())
    del engine
    live.collect_old_engine(result)
    # returned right after the build, before anything else is allocated; then once more for the old engine
    assert events == ["built", "release_heap", "adam_state", "transfer", "release_heap"]
