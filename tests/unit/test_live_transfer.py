"""Live growth's data path without processes: which rules a rank applies to its own shard (growth.live.transfer), bucket
bounds, and the build without random init (model.registry.init_skipped, which runtime.engine.build_engine uses for a
grown model)."""

from __future__ import annotations

import pytest
import torch

from growlm.growth.live.transfer import _buckets, local_maps
from growlm.growth.ops import make_rules
from growlm.growth.ops.apply import OptimizerPolicy, grow_param
from growlm.growth.ops.rules import Rule, identity, zeros
from growlm.growth.ops.stores import ParamState
from growlm.model.config import GPTConfig
from growlm.model.gpt2.model import GPT
from growlm.model.registry import init_skipped

OLD = GPTConfig(n_layer=1, n_embd=32, n_head=2, n_positions=16, vocab_size=97)


def test_depth_rules_are_local_and_width_rules_are_not():
    depth = make_rules(OLD, GPTConfig(**{**OLD.to_dict(), "n_layer": 2}), "duplicate")
    width = make_rules(OLD, GPTConfig(**{**OLD.to_dict(), "n_embd": 64, "n_head": 4}), "duplicate")
    carry = OptimizerPolicy(moments="carry")
    assert local_maps(depth.rules["transformer.wte.weight"], carry) == (identity, identity, identity)
    assert local_maps(depth.rules["transformer.h.1.ln_1.weight"], carry) == (identity, identity, identity)
    assert all(local_maps(r, carry) is None for r in width.rules.values())  # every width map reshapes
    # 'reset' zeroes the moments of any elementwise rule; a 'mean' fill of fresh entries needs the whole tensor
    assert local_maps(depth.rules["transformer.wte.weight"], OptimizerPolicy(moments="reset")) == (
        identity,
        zeros,
        zeros,
    )
    zeroed = Rule(weight=zeros, exp_avg=zeros, exp_avg_sq=zeros)
    assert local_maps(zeroed, OptimizerPolicy(fresh_exp_avg_sq="mean")) is None
    assert local_maps(zeroed, carry) == (zeros, zeros, zeros)


def test_a_map_marked_elementwise_applied_to_a_shard_equals_the_full_tensor_slice():
    def quarter(v: torch.Tensor) -> torch.Tensor:
        return v / 4.0

    rule = Rule(weight=identity, exp_avg=zeros, exp_avg_sq=quarter)
    assert local_maps(rule, OptimizerPolicy()) is None  # unmarked: gathered
    quarter.elementwise = True
    maps = local_maps(rule, OptimizerPolicy())
    assert maps == (identity, zeros, quarter)
    old = ParamState(*(torch.randn(10, 6) for _ in range(3)))
    full = grow_param(rule, old, OptimizerPolicy())
    for f, o, g in zip(maps, old, full, strict=True):
        shard = o.reshape(-1)[17:41]
        assert torch.equal(f(shard), g.reshape(-1)[17:41])  # bit for bit


def test_buckets_stay_within_the_limit_unless_one_parameter_is_larger():
    sizes = {"a": 30, "b": 30, "c": 50, "d": 200, "e": 10}
    assert _buckets(list(sizes), sizes, 64) == [["a", "b"], ["c"], ["d"], ["e"]]
    assert _buckets(list(sizes), sizes, 0) == [[k] for k in sizes]


def test_init_skipped_skips_init_inside_and_restores_it():
    torch.manual_seed(0)
    state = torch.random.get_rng_state()
    with init_skipped():
        GPT(OLD)
    assert torch.equal(torch.random.get_rng_state(), state)  # no random draw at all
    with pytest.raises(RuntimeError), init_skipped():
        raise RuntimeError("restored on error too")
    model = GPT(OLD)
    assert not torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(model.transformer.ln_f.weight, torch.ones(32))  # GPT-2 init again after the block
    assert 0.015 < float(model.transformer.wte.weight.detach().std()) < 0.025
