"""Masked Structural Growth: exact preservation for every dimension, zero gradients into masked units, resume."""

import pytest
import torch
from growth_helpers import grown_model, random_model, random_params, small_cfg, tokens
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from growlm.growth.errors import GrowthError
from growlm.growth.ops import make_rules
from growlm.growth.ops.apply import OptimizerPolicy
from growlm.growth.ops.single_process import TrainingState, grow_state, to_modules
from growlm.growth.ops.stores import ParamState
from growlm.model.config import GPTConfig
from growlm.model.gpt2.hf import to_hf

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)


@st.composite
def masked_case(draw):
    n_layer, n_head, head_dim = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(2, 4))
    n_inner = draw(st.one_of(st.none(), st.integers(4, 20)))
    old = small_cfg(n_layer, n_head, head_dim, n_inner)
    d_l, d_h, d_q, d_f = (draw(st.integers(0, 2)) for _ in range(4))
    new_head, new_q = n_head + d_h, head_dim + d_q
    f_new = None if (n_inner is None and d_f == 0) else (n_inner or 4 * n_head * head_dim) + d_f
    new = GPTConfig(
        n_layer=n_layer + d_l, n_embd=new_head * new_q, n_head=new_head, n_inner=f_new, n_positions=16, vocab_size=97
    )
    assume(new.ffn_dim >= old.ffn_dim)
    assume((new.n_layer, new.n_embd, new.n_head, new.ffn_dim) != (old.n_layer, old.n_embd, old.n_head, old.ffn_dim))
    opts = dict(
        layer_order=draw(st.sampled_from(["stack", "interleave"])),
        new_layers=draw(st.sampled_from(["copy", "fresh"])),
        init_std=draw(st.sampled_from([0.02, 1.0])),  # preservation must not depend on the init
        bias_std=draw(st.sampled_from([0.0, 1.0])),
        seed=draw(st.integers(0, 3)),
    )
    return old, new, opts


@SETTINGS
@given(masked_case())
def test_masked_growth_preserves_logits(case):
    old, new, opts = case
    small = random_model(old)
    big = grown_model(small, make_rules(old, new, "masked", **opts))
    x = tokens(old)
    with torch.no_grad():
        assert (big(x) - small(x)).abs().max().item() <= 1e-5


@pytest.mark.parametrize(
    "target",
    [
        dict(n_layer=3),  # layers alone
        dict(head_dim=6),  # n_embd alone (head dim grows, n_head fixed)
        dict(n_head=3),  # n_head with n_embd (head dim fixed)
        dict(n_inner=48),  # FFN alone
        dict(n_layer=4, n_head=3, head_dim=5, n_inner=50),  # all at once
    ],
)
def test_masked_gradients_into_new_units_are_zero(target):
    old = small_cfg()
    shape = dict(n_layer=2, n_head=2, head_dim=4) | target
    new = small_cfg(**shape)
    plan = make_rules(old, new, "masked", init_std=0.5, bias_std=0.5)
    small = random_model(old)
    big = grown_model(small, plan).train()
    x = tokens(old, t=13)
    small.train()
    small(x[:, :-1], x[:, 1:]).backward()
    big(x[:, :-1], x[:, 1:]).backward()
    for name, rule in plan.rules.items():
        p_new = big.get_parameter(name)
        src = rule.source or name
        old_grad = small.get_parameter(src).grad
        new_units = rule.exp_avg_sq(torch.ones_like(old_grad)) == 0
        assert p_new.grad[new_units].abs().max().item() == 0.0 if new_units.any() else True, name
        if not rule.source and not new_units.all():  # old units of original blocks keep their exact gradient
            torch.testing.assert_close(rule.exp_avg(old_grad)[~new_units], p_new.grad[~new_units], rtol=1e-4, atol=1e-6)


def test_masked_mid_ramp_and_hf_after_ramp():
    old = small_cfg()
    small = random_model(old)
    params = random_params(small)
    state = TrainingState(config=old, params=params, adam_step=100, consumed_samples=800)
    plan = make_rules(old, small_cfg(n_layer=3, n_head=3, head_dim=5, n_inner=44), "masked", init_std=0.3)
    grown = grow_state(state, plan, ramp_steps=20)
    x = tokens(old)
    model0, _, _ = to_modules(grown)
    with torch.no_grad():
        assert (model0.eval()(x) - small(x)).abs().max().item() <= 1e-5  # at r = 0
    grown.adam_step = 110  # mid-ramp (as if 10 steps had run)
    mid, _, _ = to_modules(grown)
    assert mid.growth_masks is not None and mid.growth_mask_hidden[-1].item() == pytest.approx(0.5)
    # back at r = 0 the masked model is still the old function
    grown.adam_step = 100
    at0, _, _ = to_modules(grown)
    with torch.no_grad():
        assert (at0.eval()(x) - small(x)).abs().max().item() <= 1e-5
    # ramp over: plain GPT-2, and transformers gives the same logits
    grown.adam_step = 120
    done, _, _ = to_modules(grown)
    assert done.growth_masks is None
    with torch.no_grad():
        torch.testing.assert_close(to_hf(done)(x).logits, done.eval()(x), rtol=0, atol=1e-5)


def test_masked_moments_old_carried_new_zero():
    old = small_cfg()
    small = random_model(old)
    params = random_params(small)
    plan = make_rules(old, small_cfg(n_inner=40), "masked")
    grown = grow_state(TrainingState(config=old, params=params, adam_step=7), plan, policy=OptimizerPolicy())
    m = grown.params["transformer.h.0.mlp.c_fc.weight"].exp_avg
    torch.testing.assert_close(m[:, :32], params["transformer.h.0.mlp.c_fc.weight"].exp_avg)
    assert m[:, 32:].abs().max() == 0 and grown.adam_step == 7


@pytest.mark.parametrize(
    ("target", "match"),
    [
        (dict(n_layer=1), "shrink"),
        (dict(n_head=4, head_dim=2), "head dim would shrink"),
        (dict(), "nothing grows"),
    ],
)
def test_masked_bad_targets(target, match):
    with pytest.raises(GrowthError, match=match):
        make_rules(small_cfg(), small_cfg(**(dict(n_layer=2, n_head=2, head_dim=4) | target)), "masked")


def test_second_growth_while_ramp_runs_is_refused_and_state_untouched():
    old = small_cfg()
    params = random_params(random_model(old))
    grown = grow_state(
        TrainingState(config=old, params=params, adam_step=5),
        make_rules(old, small_cfg(n_layer=3), "masked"),
        ramp_steps=10,
    )
    before = {k: ParamState(*(t.clone() for t in v)) for k, v in grown.params.items()}
    with pytest.raises(GrowthError, match="ramp is still running"):
        grow_state(grown, make_rules(grown.config, small_cfg(n_layer=4), "masked"))
    assert all(torch.equal(grown.params[k].weight, before[k].weight) for k in before)
    grown.adam_step = 15  # ramp over: growing again is allowed
    assert grow_state(grown, make_rules(grown.config, small_cfg(n_layer=4), "masked")).config.n_layer == 4
