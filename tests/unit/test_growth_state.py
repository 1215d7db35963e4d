"""TrainingState <-> single-process modules, grow_state carrying the whole state, policies, schedule placement."""

import pytest
import torch
from growth_helpers import random_model, random_params, small_cfg, tokens

from growlm.growth.errors import GrowthError
from growlm.growth.ops import make_rules
from growlm.growth.ops.apply import OptimizerPolicy
from growlm.growth.ops.schedule_rule import ScheduleRule
from growlm.growth.ops.single_process import (
    TrainingState,
    from_modules,
    grow_state,
    make_optimizer,
    make_scheduler,
    to_modules,
)
from growlm.growth.ops.stores import ParamState
from growlm.runtime.schedule import ScheduleState, warmup_cosine_ratio

HP = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
SCHED = ScheduleState(total_num_steps=1000, warmup_num_steps=100, warmup_type="linear")


def trained(steps=4):
    model = random_model(small_cfg()).train()
    opt = make_optimizer(model, HP)
    sched = make_scheduler(opt, SCHED, 0)
    for s in range(steps):
        opt.zero_grad()
        x = tokens(model.config, t=13, seed=s)
        model(x[:, :-1], x[:, 1:]).backward()
        opt.step()
        sched.step()
    scaler = {"cur_scale": 1024.0, "cur_iter": steps, "last_overflow_iter": -1, "cur_hysteresis": 2}
    state = from_modules(model, opt, sched, loss_scaler=scaler, consumed_samples=8 * steps, rng={"torch": 1})
    return model, opt, sched, state


def test_round_trip_through_modules():
    model, opt, sched, state = trained()
    assert state.adam_step == 4 and state.schedule.last_batch_iteration == sched.last_batch_iteration
    model2, opt2, sched2 = to_modules(state)
    for (n, p), (_, p2) in zip(model.named_parameters(), model2.named_parameters(), strict=True):
        assert torch.equal(p, p2), n
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p][key], opt2.state[p2][key]), (n, key)
    assert [g["lr"] for g in opt2.param_groups] == pytest.approx([g["lr"] for g in opt.param_groups])
    assert sched2.last_batch_iteration == sched.last_batch_iteration


def test_grow_carries_step_data_position_rng_scaler_and_places_lr():
    _, _, _, state = trained()
    plan = make_rules(state.config, small_cfg(n_head=4), "duplicate")
    rule = ScheduleRule(kind="target", constant_op=1.8, rewarm_steps=10, total_num_steps=2000, warmup_num_steps=100)
    grown = grow_state(state, plan, schedule=rule)
    assert grown.config == plan.new and grown.adam_step == state.adam_step
    assert grown.consumed_samples == state.consumed_samples and grown.rng == state.rng
    assert grown.loss_scaler == state.loss_scaler
    lbi = round(state.schedule.last_batch_iteration / 1.8)
    assert grown.schedule.last_batch_iteration == lbi
    model, opt, sched = to_modules(grown)
    # the first post-growth step already runs at the target schedule's LR times the first re-warm factor
    expected = HP["lr"] * warmup_cosine_ratio(lbi, 2000, 100, warmup_type="linear") * (1 / 10)
    assert opt.param_groups[0]["lr"] == pytest.approx(expected)
    assert all(int(opt.state[p]["step"]) == 4 for p in model.parameters())
    # new parameters are in the optimizer and update (DeepSpeed #2921's kind)
    before = model.transformer.h[0].mlp.c_fc.weight.detach().clone()
    x = tokens(model.config, t=13)
    model.train()(x[:, :-1], x[:, 1:]).backward()
    opt.step()
    moved = (model.transformer.h[0].mlp.c_fc.weight - before).abs()
    assert moved[:8, 32:].max() > 0  # off-diagonal (fresh) entries are in the optimizer and get updates
    assert moved[8:, 32:].min() > 0  # the duplicate block moves


@pytest.mark.parametrize("policy", ["carry", "carry_old", "reset"])
def test_moment_policies(policy):
    old = small_cfg()
    params = random_params(random_model(old))
    grown = grow_state(
        TrainingState(config=old, params=params, adam_step=9),
        make_rules(old, small_cfg(n_head=4), "duplicate"),
        policy=OptimizerPolicy(moments=policy),
    )
    m_old = params["transformer.h.0.mlp.c_fc.weight"].exp_avg
    m_new = grown.params["transformer.h.0.mlp.c_fc.weight"].exp_avg
    expected = {"carry": m_old / 2, "carry_old": m_old, "reset": torch.zeros_like(m_old)}[policy]
    torch.testing.assert_close(m_new[:8, :32], expected)
    second = {"carry": m_old / 2, "carry_old": torch.zeros_like(m_old), "reset": torch.zeros_like(m_old)}[policy]
    torch.testing.assert_close(m_new[8:, 32:], second)
    assert m_new[:8, 32:].abs().max() == 0 and grown.adam_step == 9


def test_fresh_exp_avg_sq_mean_policy():
    old = small_cfg()
    params = random_params(random_model(old))
    grown = grow_state(
        TrainingState(config=old, params=params),
        make_rules(old, small_cfg(n_inner=40), "masked"),
        policy=OptimizerPolicy(fresh_exp_avg_sq="mean"),
    )
    v = grown.params["transformer.h.0.mlp.c_fc.weight"].exp_avg_sq
    v_old = params["transformer.h.0.mlp.c_fc.weight"].exp_avg_sq
    torch.testing.assert_close(v[:, 32:], torch.full_like(v[:, 32:], v_old.mean().item()))
    torch.testing.assert_close(v[:, :32], v_old)


def test_masked_init_is_deterministic_and_release_gives_same_result():
    old = small_cfg()
    params = random_params(random_model(old))
    plan = make_rules(old, small_cfg(n_layer=3, n_head=3), "masked", seed=3)
    a = grow_state(TrainingState(config=old, params=dict(params)), plan)
    b = grow_state(TrainingState(config=old, params=dict(params)), plan, release=True)
    for k in a.params:
        assert all(torch.equal(x, y) for x, y in zip(a.params[k], b.params[k], strict=True)), k


def test_depth_copies_do_not_share_storage():
    old = small_cfg()
    params = random_params(random_model(old))
    grown = grow_state(TrainingState(config=old, params=params), make_rules(old, small_cfg(n_layer=4), "duplicate"))
    w0 = grown.params["transformer.h.0.ln_1.weight"].weight
    w1 = grown.params["transformer.h.1.ln_1.weight"].weight  # interleaved copy of block 0
    assert torch.equal(w0, w1) and w0.data_ptr() != w1.data_ptr()


def test_bad_input_fails_before_touching_state():
    old = small_cfg()
    params = random_params(random_model(old))
    state = TrainingState(config=old, params=params)
    other = make_rules(small_cfg(n_layer=3), small_cfg(n_layer=4), "masked")
    with pytest.raises(GrowthError, match="the plan grows"):
        grow_state(state, other, release=True)
    assert set(state.params) == set(params)
    broken = TrainingState(config=old, params={k: v for k, v in params.items() if "ln_f" not in k})
    with pytest.raises(GrowthError, match="do not match its config"):
        grow_state(broken, make_rules(old, small_cfg(n_layer=3), "masked"))
    with pytest.raises(GrowthError, match="n_embd"):
        make_rules(old, small_cfg(n_head=1, head_dim=4), "masked")  # shrinking
    with pytest.raises(GrowthError, match="unknown moments policy"):
        OptimizerPolicy(moments="keep")
    assert isinstance(ParamState(*params["transformer.wte.weight"]), tuple)
