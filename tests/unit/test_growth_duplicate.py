"""Duplication family (staged training / Net2Net / LEMON / G_stack): exactness, the Adam moment rule against real
gradients and a real Adam step, and symmetry breaking."""

import pytest
import torch
from growth_helpers import grown_model, random_model, small_cfg, tokens
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from growlm.growth.errors import GrowthError
from growlm.growth.ops import make_rules
from growlm.growth.ops.apply import apply_rules
from growlm.growth.ops.common import ZERO_ENTRY_UPDATE, replica_map
from growlm.growth.ops.single_process import make_optimizer
from growlm.growth.ops.stores import ModuleStore
from growlm.model.gpt2.model import GPT

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)
HP = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-14, "weight_decay": 0.1}  # eps: see the Adam-step test


@st.composite
def dup_case(draw):
    n_layer, n_head, head_dim = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(2, 4))
    old = small_cfg(n_layer, n_head, head_dim)
    k, extra_f, extra_l = draw(st.integers(1, 3)), draw(st.integers(0, 9)), draw(st.integers(0, 3))
    assume(k > 1 or extra_f or extra_l)
    new = small_cfg(n_layer + extra_l, k * n_head, head_dim, n_inner=k * old.ffn_dim + extra_f)
    opts = dict(
        layer_order=draw(st.sampled_from(["stack", "interleave"])),
        pattern=draw(st.sampled_from(["block", "split"])),
        alpha=draw(st.sampled_from([0.6, 0.9])),
        symmetry=draw(st.sampled_from(["none", "noise"])),
    )
    return old, new, opts


@SETTINGS
@given(dup_case())
def test_exact_duplication_preserves_logits(case):
    old, new, opts = case
    small = random_model(old)
    big = grown_model(small, make_rules(old, new, "duplicate", **opts))
    x = tokens(old)
    with torch.no_grad():
        assert (big(x) - small(x)).abs().max().item() <= 1e-5


def test_plain_depth_copy_is_not_exact():
    small = random_model(small_cfg())
    big = grown_model(small, make_rules(small.config, small_cfg(n_layer=4), "duplicate", exact=False))
    x = tokens(small.config)
    with torch.no_grad():
        assert (big(x) - small(x)).abs().max().item() > 1e-3  # documented: G_stack-style copies move the logits


def loss(model, x):
    """Mean CE in the model's dtype (GPT.forward's own loss is fp32; float64 tests need float64 gradients)."""
    logits = model(x[:, :-1])
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())


def first_update_scale(plan, name, g_old):
    """The dynamics rule's first-update scale s of every entry (exp_avg_sq = gradient rule / s^2): 1 for copies,
    1/k for ln_f, 1/n for Net2Net c_proj rows, ZERO_ENTRY_UPDATE for entries that are 0 at growth."""
    rule = plan.rules[name]
    momentum = rule.exp_avg(torch.ones_like(g_old)) != 0
    s = torch.where(momentum, 1.0, ZERO_ENTRY_UPDATE).double()
    if name.startswith("transformer.ln_f"):
        s = s / (plan.new.n_embd // plan.old.n_embd)
    if name.endswith("mlp.c_proj.weight") and plan.new.n_embd == plan.old.n_embd:  # FFN-only (Net2Net) growth
        g, n = replica_map(plan.old.ffn_dim, plan.new.ffn_dim)
        s = s / n[g][:, None]
    return s, momentum


@pytest.mark.parametrize("target", [dict(n_head=4), dict(n_head=6), dict(n_inner=45)])
def test_moment_rule_matches_real_gradients(target):
    """exp_avg maps like the gradient (where momentum is carried); exp_avg_sq like the gradient squared divided by
    the square of the entry's first-update scale (so that its first Adam update is s times the small model's)."""
    small = random_model(small_cfg(), dtype=torch.float64)
    plan = make_rules(small.config, small_cfg(**(dict(n_layer=2, n_head=2, head_dim=4) | target)), "duplicate")
    big = grown_model(small, plan)
    x = tokens(small.config, t=13)
    loss(small, x).backward()
    loss(big, x).backward()
    for name, rule in plan.rules.items():
        g_old, g_new = small.get_parameter(rule.source or name).grad, big.get_parameter(name).grad
        s, momentum = first_update_scale(plan, name, g_old)
        scale = g_new.abs().max().item()  # float64 throughout: agreement to rounding
        torch.testing.assert_close(rule.exp_avg(g_old)[momentum], g_new[momentum], rtol=0, atol=1e-12 * scale)
        v_true = g_new**2 / s**2
        torch.testing.assert_close(rule.exp_avg_sq(g_old**2), v_true, rtol=1e-9, atol=1e-12 * scale**2)
        if name.endswith("c_fc.weight") and plan.new.n_embd > plan.old.n_embd:  # duplicates get exactly half (or 1/k)
            k = plan.new.n_embd // plan.old.n_embd
            torch.testing.assert_close(g_new[: g_old.shape[0], : g_old.shape[1]], g_old / k, rtol=0, atol=1e-12 * scale)


def test_one_adam_step_moves_duplicates_like_the_small_model():
    """exp_avg/2, exp_avg_sq/4 make every duplicated entry take exactly the small model's Adam update (and the same
    decoupled weight decay). Two things the function sees besides: the fresh off-diagonal blocks get a nonzero first
    update (their gradient is not 0), and ln_f (value 1/2, same update) moves twice as fast; with those two reset,
    the grown model after one step computes exactly what the small model computes after its step.
    Adam's eps is not scaled by the rule (update = m / (sqrt(v) + 2 eps) for a duplicate): this tiny model's
    gradients go down to 1e-9, so the test scales the loss by 1e4 (Adam is otherwise scale-free) and uses eps = 1e-14
    (not 0: the key bias has an analytically zero gradient, and Adam would amplify its rounding noise)."""
    small = random_model(small_cfg(), dtype=torch.float64).train()
    opt_s = make_optimizer(small, HP)
    for seed in range(3):  # real Adam state
        opt_s.zero_grad()
        (1e4 * loss(small, tokens(small.config, t=13, seed=10 + seed))).backward()
        opt_s.step()
    plan = make_rules(small.config, small_cfg(n_head=4), "duplicate")
    big = GPT(plan.new).double().train()
    opt_b = make_optimizer(big, HP)
    apply_rules(plan, ModuleStore(small, opt_s), ModuleStore(big, opt_b, step=3))
    x = tokens(small.config, t=13, seed=99)
    for model, opt in ((small, opt_s), (big, opt_b)):
        opt.zero_grad()
        (1e4 * loss(model, x)).backward()
        opt.step()
    with torch.no_grad():
        for name, rule in plan.rules.items():
            w_old, w_new = small.get_parameter(name), big.get_parameter(name)
            carried = rule.exp_avg(torch.ones_like(w_old)) != 0  # off-diagonal blocks: no momentum, they move
            if name.startswith("transformer.ln_f"):
                continue
            if name.endswith("c_attn.bias"):  # the key bias: gradient 0 analytically, Adam updates its rounding noise
                d = small.config.n_embd  # and it cannot change the function (softmax is shift-invariant)
                carried = carried.clone()
                carried[2 * d : 4 * d] = False
            torch.testing.assert_close(w_new[carried], rule.weight(w_old)[carried], rtol=0, atol=1e-10)
            assert w_new[~carried].abs().max().item() > 1e-4 if (~carried).any() else True  # fresh blocks moved
            w_new[~carried] = 0.0
        for name in ("transformer.ln_f.weight", "transformer.ln_f.bias"):
            big.get_parameter(name).copy_(plan.rules[name].weight(small.get_parameter(name)))
        xe = tokens(small.config, seed=7)
        torch.testing.assert_close(big.eval()(xe), small.eval()(xe), rtol=0, atol=1e-9)


def halves_gap(model, d):
    w = model.transformer.wte.weight
    return (w[:, :d] - w[:, d:]).abs().max().item()


@pytest.mark.parametrize("pattern", ["block", "split"])
def test_symmetry_breaker_makes_halves_diverge(pattern):
    small = random_model(small_cfg())
    big = grown_model(small, make_rules(small.config, small_cfg(n_head=4), "duplicate", pattern=pattern, alpha=0.8))
    x = tokens(small.config, t=13)
    with torch.no_grad():
        assert (big(x) - small(x)).abs().max().item() <= 1e-5  # exact either way
    big.train()  # dropout is 0: no noise breaks the tie
    opt = make_optimizer(big, HP | {"eps": 1e-8, "lr": 1e-2})
    for seed in range(15):
        opt.zero_grad()
        loss(big, tokens(small.config, t=13, seed=seed)).backward()
        opt.step()
    gap = halves_gap(big, small.config.n_embd)
    if pattern == "block":
        assert gap <= 1e-6  # the trap: copies stay identical
    else:
        assert gap > 1e-3


@pytest.mark.parametrize(
    ("target", "match"),
    [
        (dict(n_head=3, head_dim=4), "integer factor"),
        (dict(n_head=2, head_dim=8), "head dim changes"),
        (dict(n_layer=1), "shrink"),
        (dict(n_head=4, n_inner=40), "n_inner >= 64"),
    ],
)
def test_duplicate_bad_targets(target, match):
    with pytest.raises(GrowthError, match=match):
        make_rules(small_cfg(), small_cfg(**(dict(n_layer=2, n_head=2, head_dim=4) | target)), "duplicate")


def test_split_alpha_half_is_refused():
    with pytest.raises(GrowthError, match="keeps symmetry"):
        make_rules(small_cfg(), small_cfg(n_head=4), "duplicate", pattern="split", alpha=0.5)
