"""The GPT against transformers' GPT2LMHeadModel, conversions both ways, presets, parameter and FLOP counts."""

from __future__ import annotations

import pytest
import torch
from init_from_helpers import read_as_init_from

from growlm.model.config import PRESETS, GPTConfig, flops_per_token, from_preset, param_count
from growlm.model.gpt2.hf import to_hf, to_hf_config
from growlm.model.gpt2.model import GPT


@pytest.mark.parametrize("n_inner", [None, 48])
def test_logits_equal_transformers_on_same_random_weights(n_inner, tmp_path):
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=3, n_embd=64, n_head=4, n_inner=n_inner, n_positions=32, vocab_size=211)
    hf = GPT2LMHeadModel(to_hf_config(cfg)).eval()  # HF's own random init; we import it
    with torch.no_grad():  # make biases and LayerNorms non-trivial so every term is compared
        for name, p in hf.named_parameters():
            if "ln" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    ours = read_as_init_from(hf, tmp_path / "hf")
    assert type(ours) is GPT and ours.config == cfg
    idx = torch.randint(0, cfg.vocab_size, (3, 32))
    with torch.no_grad():
        diff = (ours(idx) - hf(idx).logits).abs().max().item()
    assert diff <= 1e-5


def test_round_trip_to_hf_and_back_is_exact(tmp_path):
    torch.manual_seed(1)
    ours = GPT(GPTConfig(n_layer=2, n_embd=32, n_head=2, n_positions=16, vocab_size=97)).eval()
    back = read_as_init_from(to_hf(ours), tmp_path / "hf")
    for (name, a), (_, b) in zip(ours.state_dict().items(), back.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    idx = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        assert (to_hf(ours)(idx).logits - ours(idx)).abs().max() <= 1e-5


def test_names_and_shapes_follow_hf_and_head_is_tied():
    cfg = GPTConfig(n_layer=1, n_embd=32, n_head=2, n_positions=16, vocab_size=97)
    m = GPT(cfg)
    shapes = {k: tuple(v.shape) for k, v in m.named_parameters()}
    assert shapes["transformer.wte.weight"] == (97, 32)
    assert shapes["transformer.h.0.attn.c_attn.weight"] == (32, 96)  # Conv1D layout (in, out)
    assert shapes["transformer.h.0.mlp.c_proj.weight"] == (128, 32)
    assert "lm_head.weight" not in shapes  # tied: listed once
    assert m.lm_head.weight is m.transformer.wte.weight


def test_loss_is_cross_entropy_of_logits_and_ignores_minus_100():
    torch.manual_seed(2)
    m = GPT(GPTConfig(n_layer=1, n_embd=32, n_head=2, n_positions=16, vocab_size=97)).eval()
    x, y = torch.randint(0, 97, (2, 8)), torch.randint(0, 97, (2, 8))
    y[0, :3] = -100
    logits = m(x)
    keep = y != -100
    expected = -torch.log_softmax(logits, -1).gather(-1, y.clamp(min=0)[..., None])[..., 0][keep].mean()
    assert torch.allclose(m(x, y), expected, atol=1e-6)


def test_sequence_longer_than_n_positions_is_refused():
    m = GPT(GPTConfig(n_layer=1, n_embd=32, n_head=2, n_positions=8, vocab_size=97))
    with pytest.raises(ValueError, match="exceeds n_positions=8"):
        m(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize("name", ["tiny", "cpu-small", "GPT2_base_div4_width_div4_depth"])
def test_param_count_matches_module(name):
    cfg = from_preset(name)
    assert param_count(cfg) == sum(p.numel() for p in GPT(cfg).parameters())


def test_param_count_of_known_shapes():
    assert param_count(from_preset("gpt2")) == 124_439_808  # GPT-2 small, as published by HF
    assert param_count(from_preset("gpt2-medium")) == 354_823_168


def test_flops_per_token_formula():
    cfg = from_preset("gpt2")
    n = param_count(cfg) - cfg.n_positions * cfg.n_embd
    assert flops_per_token(cfg, 1024) == 6 * n + 12 * 12 * 12 * 64 * 1024
    with pytest.raises(ValueError, match="n_positions"):
        flops_per_token(cfg, 2048)


def test_staged_training_presets():
    assert from_preset("GPT2_base").shape_str().startswith("L=12 d=768 H=8")
    assert from_preset("GPT2_large").shape_str().startswith("L=24 d=1536 H=16")
    assert from_preset("GPT2_large_div2_width").n_embd == 768
    assert from_preset("GPT2_large_div4_depth").n_layer == 6
    assert {c.head_dim for k, c in PRESETS.items() if k.startswith("GPT2_")} == {96}


@pytest.mark.bad_input
def test_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="n_embd=100 is not divisible by n_head=3"):
        GPTConfig(n_embd=100, n_head=3)
    with pytest.raises(ValueError, match="unknown model preset 'gpt5'"):
        from_preset("gpt5")
    with pytest.raises(ValueError, match="unknown GPTConfig fields"):
        from_preset("tiny", n_layers=3)
    with pytest.raises(ValueError, match="unknown GPTConfig fields"):
        GPTConfig.from_dict({"n_layer": 2, "hidden": 3})
    assert GPTConfig.from_dict(from_preset("tiny").to_dict()) == from_preset("tiny")


@pytest.mark.parametrize("masked", [False, True])
def test_activation_checkpointing_gives_the_same_losses_and_gradients(masked):
    """fp32, dropout on (the recomputation replays the same RNG), with and without growth masks ramping: three
    AdamW steps with and without activation checkpointing give bit-identical losses, gradients and weights."""
    from growlm.growth.ops import make_rules

    torch.manual_seed(0)
    small = GPTConfig(n_layer=2, n_embd=32, n_head=2, n_positions=16, vocab_size=97, dropout=0.1)
    cfg, masks = small, None
    if masked:
        rules = make_rules(small, GPTConfig(n_layer=3, n_embd=48, n_head=3, n_positions=16, vocab_size=97,
                                            dropout=0.1), "masked", ramp_steps=4)  # fmt: skip
        cfg, masks = rules.new, rules.masks
    runs = []
    for ckpt in (False, True):
        torch.manual_seed(1)
        model = GPT(cfg, masks=masks, activation_checkpointing=ckpt).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        gen = torch.Generator().manual_seed(2)
        losses, grads = [], []
        for step in range(3):
            x = torch.randint(0, 97, (4, 17), generator=gen)
            loss = model(x[:, :-1], targets=x[:, 1:])
            loss.backward()
            losses.append(loss.item())
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
            opt.step()
            opt.zero_grad()
            model.set_growth_step(step + 1)
        runs.append((losses, grads, {n: p.detach().clone() for n, p in model.named_parameters()}))
    (l0, g0, w0), (l1, g1, w1) = runs
    assert l0 == l1
    for a, b in zip(g0, g1, strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all(torch.equal(w0[k], w1[k]) for k in w0)


def test_activation_checkpointing_keeps_less_for_backward():
    """The bytes autograd keeps from the forward pass for backward: with checkpointing only each block's input (and
    the head's and embeddings' own) stay until backward, which recomputes the rest block by block."""
    cfg = GPTConfig(n_layer=4, n_embd=64, n_head=4, n_positions=64, vocab_size=97)
    x = torch.randint(0, 97, (8, 65))
    saved = {}
    for ckpt in (False, True):
        model = GPT(cfg, activation_checkpointing=ckpt).train()
        total = [0]

        def pack(t, total=total):
            total[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(x[:, :-1], targets=x[:, 1:])
        saved[ckpt] = total[0]
        loss.backward()  # and backward still works
    assert saved[True] < saved[False] / 2, saved


def test_attention_kernel_is_the_fused_one_on_a_cpu():
    from growlm.model.layers import attention_kernel

    for dtype in (torch.float32, torch.bfloat16):  # PyTorch's CPU flash kernel takes both, any head size
        assert attention_kernel(16, dtype, "cpu") == attention_kernel(64, dtype, "cpu") == "flash"
