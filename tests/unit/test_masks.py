"""Growth masks in the model: buffers, ramp, removal, save/resume, HF export."""

import pytest
import torch
from growth_helpers import grown_model, random_model, small_cfg, tokens

from growlm.growth.ops import make_rules
from growlm.model.gpt2.hf import to_hf
from growlm.model.gpt2.model import GPT, LayerNorm
from growlm.model.masks import MaskSpec


def grown_pair():
    small = random_model(small_cfg())
    plan = make_rules(
        small.config,
        small_cfg(n_layer=3, n_head=3, head_dim=5, n_inner=40),
        "masked",
        ramp_steps=10,
        init_std=0.3,
        bias_std=0.3,
    )
    return small, plan, grown_model(small, plan)


def test_masked_layer_norm_with_ones_is_layer_norm():
    ln = LayerNorm(6).double()
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.normal_()
    x = torch.randn(3, 6, dtype=torch.float64)
    torch.testing.assert_close(ln(x, mask=torch.ones(6, dtype=torch.float64)), ln(x))
    assert torch.equal(ln(x), torch.nn.functional.layer_norm(x, (6,), ln.weight, ln.bias, ln.eps))


def test_masked_layer_norm_with_zeros_on_new_dims_is_the_old_layer_norm():
    torch.manual_seed(3)
    ln = LayerNorm(6).double()
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.normal_()
    x = torch.randn(3, 6, dtype=torch.float64)
    m = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    old = torch.nn.functional.layer_norm(x[:, :4], (4,), ln.weight[:4], ln.bias[:4], ln.eps)
    y = ln(x, mask=m)
    torch.testing.assert_close(y[:, :4], old, rtol=0, atol=1e-12)
    assert torch.equal(y[:, 4:], torch.zeros(3, 2, dtype=torch.float64))


def test_mask_buffers_are_persistent_and_ramp_linearly():
    _, plan, big = grown_pair()
    keys = set(big.state_dict())
    assert {"growth_mask_hidden", "growth_mask_attn", "growth_mask_ffn", "growth_gate_layer"} <= keys
    assert big.growth_gate_layer.tolist() == [1.0, 1.0, 0.0]  # stacked copy at the end, gate 0
    assert big.set_growth_step(4) == pytest.approx(0.4)
    assert big.growth_mask_ffn[-1].item() == pytest.approx(0.4) and big.growth_mask_ffn[0].item() == 1.0
    assert big.growth_gate_layer[2].item() == pytest.approx(0.4)


def test_masks_at_one_equal_the_plain_model():
    _, plan, big = grown_pair()
    x = tokens(big.config)
    plan_spec = big.growth_masks
    big.set_growth_step(9)
    for name in ("growth_mask_hidden", "growth_mask_attn", "growth_mask_ffn", "growth_gate_layer"):
        getattr(big, name).fill_(1.0)
    with_masks = big(x)
    big.remove_growth_masks()
    assert big.growth_masks is None and not list(big.buffers())
    torch.testing.assert_close(big(x), with_masks, rtol=0, atol=1e-5)
    assert plan_spec is plan.masks


def test_resume_mid_ramp_from_config_and_spec():
    _, plan, big = grown_pair()
    big.set_growth_step(6)
    x = tokens(big.config)
    saved = {k: v.clone() for k, v in big.state_dict().items()}
    spec = MaskSpec.from_dict(big.growth_masks.to_dict())  # what a checkpoint records
    resumed = GPT(big.config, masks=spec).eval()
    resumed.load_state_dict(saved)  # strict: the mask buffers exist and are restored
    torch.testing.assert_close(resumed(x), big(x), rtol=0, atol=0)
    assert resumed.set_growth_step(7) == pytest.approx(0.7)


def test_ramp_end_removes_masks_and_exports_to_hf():
    _, plan, big = grown_pair()
    with pytest.raises(ValueError, match="masks"):
        to_hf(big)
    assert big.set_growth_step(10) == 1.0
    x = tokens(big.config)
    hf = to_hf(big)
    torch.testing.assert_close(hf(x).logits, big(x), rtol=0, atol=1e-5)


def test_spec_checks_against_config():
    with pytest.raises(ValueError, match="does not fit"):
        MaskSpec(old_n_embd=64, old_n_head=2, old_head_dim=4, old_ffn_dim=8).check(small_cfg())
    with pytest.raises(ValueError, match="ramp_steps"):
        MaskSpec(old_n_embd=8, old_n_head=2, old_head_dim=4, old_ffn_dim=8, ramp_steps=0)
