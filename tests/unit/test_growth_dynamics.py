"""Dynamics preservation of the duplication family (DESIGN.md, "Growth dynamics"): one AdamW step right after growth
moves the grown model's logits about as much as the same step moves the small model's (eval/bench/dynamics.py),
and the 'noise' symmetry breaker keeps the function exact while making the copies come apart."""

from dataclasses import replace

import pytest
import torch
from growth_helpers import small_cfg

from growlm.eval.bench.dynamics import (
    clone_training,
    copy_divergence,
    logit_step_ratio,
    ramp_loss_bump,
    width_divergence,
)
from growlm.growth.errors import GrowthError
from growlm.growth.ops import make_rules
from growlm.growth.ops.apply import apply_rules
from growlm.growth.ops.preparation import prepare_growth
from growlm.growth.ops.rules import RuleSet
from growlm.growth.ops.schedule_rule import ScheduleRule
from growlm.growth.ops.single_process import make_optimizer
from growlm.growth.ops.stores import ModuleStore
from growlm.growth.stages.plan import parse_stages
from growlm.model.gpt2.model import GPT
from growlm.runtime.schedule import ScheduleState

HP = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}  # ds_configs' AdamW
V = 97


def bigram_batch(seed: int, b: int = 8, t: int = 17) -> torch.Tensor:
    """(b, t) tokens from a fixed random bigram table: learnable structure, so Adam's moments are not pure noise."""
    table = torch.softmax(3 * torch.randn(V, V, generator=torch.Generator().manual_seed(0)), -1)
    g = torch.Generator().manual_seed(seed)
    x = torch.empty(b, t, dtype=torch.long)
    x[:, 0] = torch.randint(0, V, (b,), generator=g)
    for i in range(1, t):
        x[:, i] = torch.multinomial(table[x[:, i - 1]], 1, generator=g)[:, 0]
    return x


@pytest.fixture(scope="module")
def trained():
    """A tiny GPT (2 layers, n_embd 16) after 25 AdamW steps, with its optimizer."""
    torch.manual_seed(0)
    model = GPT(small_cfg(n_layer=2, n_head=4, head_dim=4))
    opt = make_optimizer(model, HP)
    for s in range(25):
        x = bigram_batch(s)
        opt.zero_grad()
        model(x[:, :-1], targets=x[:, 1:]).backward()
        opt.step()
    return model, opt


def grown(model, opt, plan: RuleSet):
    small, small_opt = clone_training(model, opt)
    big = GPT(plan.new)
    big_opt = make_optimizer(big, HP)
    step = int(next(iter(small_opt.state.values()))["step"])
    apply_rules(plan, ModuleStore(small, small_opt), ModuleStore(big, big_opt, step=step))
    return big, big_opt


def ratio(trained, plan: RuleSet) -> float:
    big, big_opt = grown(*trained, plan)
    small, small_opt = clone_training(*trained)
    return logit_step_ratio(small, small_opt, big, big_opt, bigram_batch(1000), bigram_batch(2000)[:, :-1])


def old_zero_state_rule(plan: RuleSet) -> RuleSet:
    """The rule before the dynamics-preserving moment rules: entries without momentum (0 at growth) also got
    exp_avg_sq 0."""
    rules = {}
    for name, r in plan.rules.items():

        def v(x, r=r):
            return torch.where(r.exp_avg(torch.ones_like(x)) != 0, r.exp_avg_sq(x), 0.0)

        rules[name] = replace(r, exp_avg_sq=v)
    return replace(plan, rules=rules)


CASES = {
    "width-block": (dict(n_head=8), {}),
    "width-split": (dict(n_head=8), {"pattern": "split"}),
    "width-noise": (dict(n_head=8), {"symmetry": "noise"}),
    "depth-interleave": (dict(n_layer=4, n_head=4), {}),
    "depth-stack": (dict(n_layer=4, n_head=4), {"layer_order": "stack"}),
    "ffn-net2net": (dict(n_head=4, n_inner=100), {}),
    "width+depth": (dict(n_layer=4, n_head=8), {"pattern": "split"}),  # both at once: the two excesses compound
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_step_after_growth_moves_the_logits_like_the_small_model(trained, case):
    target, opts = CASES[case]
    plan = make_rules(trained[0].config, small_cfg(**(dict(n_layer=2, head_dim=4) | target)), "duplicate", **opts)
    assert 0.95 <= ratio(trained, plan) <= 1.1


def test_old_rules_shocked_the_step(trained):
    """Documented old behaviour: zero exp_avg_sq on the block pattern's off-diagonal blocks (Adam's first update of
    each is then about (1 - beta1) / sqrt(1 - beta2) lr sign(g)): 1.21 here, 1.76 on a 32-wide model after 40
    steps (DESIGN.md, "Growth dynamics")."""
    cfg = trained[0].config
    block = make_rules(cfg, small_cfg(n_layer=2, n_head=8, head_dim=4), "duplicate")
    assert ratio(trained, old_zero_state_rule(block)) > 1.15


def test_copy_divergence_definition():
    a = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    assert copy_divergence(torch.cat([a, a], -1)) == 0.0
    assert copy_divergence(torch.cat([a, -a], -1)) == pytest.approx(2.0)
    assert copy_divergence(torch.cat([a, 2 * a], -1)) == pytest.approx(1 / 1.5)
    assert copy_divergence(torch.cat([a, a, -a], 0), n_copies=3, dim=0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="n_copies"):
        copy_divergence(a, n_copies=3)


def test_noise_symmetry_is_exact_and_the_copies_diverge_faster(trained):
    """'noise' adds zero-sum noise over the input copies: exact at growth; at noise_std 1.0, after 8 steps the
    residual-stream halves differ far more than with the split pattern (0.10 vs 0.035 measured) and the embedding
    halves have come apart (the plain block pattern keeps them identical: test_growth_duplicate.py)."""
    model, opt = trained
    x = bigram_batch(3000)[:, :-1]
    gaps = {}
    noise = {"symmetry": "noise", "noise_std": 1.0}  # the default 0.3 trades divergence for a smaller first-step shock
    for name, opts in {"split": {"pattern": "split"}, "noise": noise}.items():
        plan = make_rules(model.config, small_cfg(n_layer=2, n_head=8, head_dim=4), "duplicate", **opts)
        big, big_opt = grown(model, opt, plan)
        with torch.no_grad():
            assert (big.eval()(x) - model.eval()(x)).abs().max().item() <= 1e-5
        assert width_divergence(big, x)["wte"] == 0.0
        for s in range(8):
            b = bigram_batch(100 + s)
            big_opt.zero_grad()
            big.train()(b[:, :-1], targets=b[:, 1:]).backward()
            big_opt.step()
        gaps[name] = width_divergence(big, x)
    assert gaps["noise"]["wte"] > 1e-2
    assert gaps["noise"]["residual"] > 2 * gaps["split"]["residual"]


def test_masked_ramp_is_a_fraction_of_the_remaining_run():
    old, new = small_cfg(), small_cfg(n_layer=3, n_head=3)
    plan = make_rules(old, new, "masked")
    assert (plan.ramp_frac, plan.masks.ramp_steps) == (0.25, 5000)  # defaults: 0.25 of the rest; MSG's 5000 steps
    sched = ScheduleState(total_num_steps=200, warmup_num_steps=10, last_batch_iteration=41)
    prep = prepare_growth(plan, old, 40, masks=None, schedule=sched, rule=ScheduleRule())
    assert prep.masks.ramp_steps == 40  # round(0.25 * (200 - 41))
    assert prepare_growth(plan, old, 40, masks=None, schedule=None, rule=ScheduleRule()).masks.ramp_steps == 5000
    half = make_rules(old, new, "masked", ramp_frac=0.5)
    assert prepare_growth(half, old, 40, masks=None, schedule=sched, rule=ScheduleRule()).masks.ramp_steps == 80
    fixed = make_rules(old, new, "masked", ramp_steps=7)
    assert fixed.ramp_frac is None
    assert prepare_growth(fixed, old, 40, masks=None, schedule=sched, rule=ScheduleRule()).masks.ramp_steps == 7
    with pytest.raises(GrowthError, match="not both"):
        make_rules(old, new, "masked", ramp_steps=7, ramp_frac=0.5)
    with pytest.raises(GrowthError, match="ramp_frac"):
        make_rules(old, new, "masked", ramp_frac=1.5)
    stage = {"target": {"n_layer": 3}, "family": "masked", "when": {"step": 10}, "ramp_frac": 0.1}
    stages = parse_stages({"start": old.to_dict(), "stages": [stage]})
    assert stages.stages[0].rules(old).ramp_frac == 0.1


def test_ramp_loss_bump_is_zero_at_mask_0_and_measures_the_new_units():
    old = small_cfg()
    torch.manual_seed(0)
    small = GPT(old)
    plan = make_rules(old, small_cfg(n_head=4), "masked", ramp_steps=10, init_std=0.5)
    big = GPT(plan.new, masks=plan.masks)
    apply_rules(plan, ModuleStore(small), ModuleStore(big))
    x = bigram_batch(5)
    bumps = ramp_loss_bump(big, x, (0.0, 0.5, 1.0))
    assert bumps[0] == 0.0 and abs(bumps[2]) > 1e-3 and big.growth_masks is not None  # the model is left as it was
    with pytest.raises(ValueError, match="no growth masks"):
        ramp_loss_bump(small, x)
