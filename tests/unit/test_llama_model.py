"""growlm's Llama against transformers' LlamaForCausalLM (logits, both conversions), its config, presets, parameter
and FLOP counts, masked norms and activation checkpointing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from init_from_helpers import read_as_init_from

from growlm.model.config import PRESETS, LlamaConfig, config_from_dict, flops_per_token, from_preset, param_count
from growlm.model.layers import RMSNorm, grouped_kv
from growlm.model.llama.hf import from_hf_config, to_hf, to_hf_config
from growlm.model.llama.model import Llama
from growlm.model.registry import build_model

SHAPES = [
    # (n_head, n_kv_head, head_dim, tied, rope_theta): GQA 4:1, multi-query, multi-head, head_dim set apart from d / H
    (8, 2, None, False, 10000.0),
    (8, 2, None, True, 500000.0),
    (4, 1, None, False, 1e6),
    (4, 4, None, True, 10000.0),
    (4, 2, 32, False, 250000.0),
]


@pytest.mark.parametrize("n_head,n_kv_head,head_dim,tied,theta", SHAPES)
def test_logits_equal_transformers_on_its_random_weights(n_head, n_kv_head, head_dim, tied, theta, tmp_path):

    torch.manual_seed(0)
    cfg = LlamaConfig(
        n_layer=2, n_embd=64, n_head=n_head, n_kv_head=n_kv_head, n_inner=96, head_dim=head_dim, n_positions=48,
        vocab_size=131, rope_theta=theta, tie_word_embeddings=tied,
    )  # fmt: skip
    same_logits_both_ways(cfg, batch=3, folder=tmp_path / "hf")


def same_logits_both_ways(cfg: LlamaConfig, batch: int, folder: Path) -> tuple:
    """transformers' LlamaForCausalLM of ``cfg`` (its own init, then non-trivial norm gains and larger weights, so
    every term counts), saved into ``folder`` and read back as --init_from reads it, gives logits within 1e-5 of it,
    and so does its ``to_hf`` export, on ``batch`` sequences of n_positions tokens. Returns (transformers' model,
    ours, the ids, transformers' logits)."""
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM(to_hf_config(cfg)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.add_((0.1 if "norm" in name else 0.05) * torch.randn_like(p))
    ours = read_as_init_from(hf, folder)
    assert type(ours) is Llama and ours.config == cfg
    idx = torch.randint(0, cfg.vocab_size, (batch, cfg.n_positions))
    with torch.no_grad():
        theirs = hf(idx).logits
        assert (ours(idx) - theirs).abs().max().item() <= 1e-5
        assert (to_hf(ours)(idx).logits - theirs).abs().max().item() <= 1e-5
    return hf, ours, idx, theirs


ROPE_SCALINGS = [  # (rope_type, factor, low, high, original context): Llama 3.1 / 3.2's, and linear interpolation
    ("llama3", 8.0, 1.0, 4.0, 16),
    ("llama3", 32.0, 1.0, 4.0, 24),
    ("linear", 4.0, 1.0, 4.0, 8192),
]


@pytest.mark.parametrize("kind,factor,low,high,original", ROPE_SCALINGS)
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_scaled_rotary_logits_equal_transformers_past_the_original_context(
    kind, factor, low, high, original, tied, tmp_path
):
    """Llama 3.1 / 3.2's "llama3" rotary scaling (and "linear"): logits equal transformers' LlamaForCausalLM within
    1e-5 in fp32 at 96 positions, past the original context (16 / 24), both ways through the converters."""

    torch.manual_seed(1)
    cfg = LlamaConfig(
        n_layer=2, n_embd=64, n_head=8, n_kv_head=2, n_inner=96, n_positions=96, vocab_size=131, rope_theta=500000.0,
        tie_word_embeddings=tied, rope_type=kind, rope_factor=factor, rope_low_freq_factor=low,
        rope_high_freq_factor=high, rope_original_positions=original if kind == "llama3" else 8192,
    )  # fmt: skip
    hf, ours, idx, theirs = same_logits_both_ways(cfg, batch=2, folder=tmp_path / "hf")
    assert hf.config.rope_parameters["rope_type"] == kind and hf.config.rope_parameters["factor"] == factor
    plain = Llama(replace(cfg, rope_type="default")).eval()
    plain.load_state_dict(ours.state_dict())
    with torch.no_grad():  # the scaling is not a no-op: plain RoPE gives other logits
        assert (plain(idx) - theirs).abs().max().item() > 1e-3


@pytest.mark.bad_input
def test_a_rotary_scaling_growlm_does_not_compute_is_refused_at_the_config():
    with pytest.raises(ValueError, match="rope_type='yarn': growlm computes 'default', 'linear', 'llama3'"):
        LlamaConfig(rope_type="yarn")
    with pytest.raises(ValueError, match="rope_high_freq_factor=1.0 must exceed rope_low_freq_factor=2.0"):
        LlamaConfig(rope_type="llama3", rope_low_freq_factor=2.0, rope_high_freq_factor=1.0)
    with pytest.raises(ValueError, match="rope_factor=0 must be a positive number"):
        LlamaConfig(rope_type="linear", rope_factor=0)
    assert "rope=llama3x32" in PRESETS["llama-3.2-1b"].shape_str()


def test_names_shapes_and_tying_follow_transformers():
    cfg = LlamaConfig(n_layer=1, n_embd=32, n_head=4, n_kv_head=2, n_inner=48, n_positions=16, vocab_size=97)
    shapes = {k: tuple(v.shape) for k, v in Llama(cfg).named_parameters()}
    assert shapes == {
        "model.embed_tokens.weight": (97, 32),
        "model.layers.0.input_layernorm.weight": (32,),
        "model.layers.0.self_attn.q_proj.weight": (32, 32),
        "model.layers.0.self_attn.k_proj.weight": (16, 32),
        "model.layers.0.self_attn.v_proj.weight": (16, 32),
        "model.layers.0.self_attn.o_proj.weight": (32, 32),
        "model.layers.0.post_attention_layernorm.weight": (32,),
        "model.layers.0.mlp.gate_proj.weight": (48, 32),
        "model.layers.0.mlp.up_proj.weight": (48, 32),
        "model.layers.0.mlp.down_proj.weight": (32, 48),
        "model.norm.weight": (32,),
        "lm_head.weight": (97, 32),
    }
    tied = Llama(replace(cfg, tie_word_embeddings=True))
    assert "lm_head.weight" not in dict(tied.named_parameters())
    assert tied.lm_head.weight is tied.model.embed_tokens.weight


@pytest.mark.parametrize("name", ["llama-tiny", "llama-cpu-small", "smollm-135m", "smollm-360m", "tinyllama-1.1b",
                                  "llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b"])  # fmt: skip
def test_param_count_matches_the_module_and_published_sizes(name):
    cfg = PRESETS[name]
    with torch.device("meta"):
        model = build_model(cfg)
    assert param_count(cfg) == sum(p.numel() for p in model.parameters())
    published = {
        "smollm-135m": 134_515_008, "smollm-360m": 361_821_120, "tinyllama-1.1b": 1_100_048_384,
        "llama-3.2-1b": 1_235_814_400, "llama-3.2-3b": 3_212_749_824, "llama-3.1-8b": 8_030_261_248,
    }  # fmt: skip
    if name in published:  # the released checkpoints' parameter counts
        assert param_count(cfg) == published[name]


def test_flops_count_gqa_swiglu_and_the_untied_head_once():
    cfg = LlamaConfig(n_layer=2, n_embd=64, n_head=8, n_kv_head=2, n_inner=96, n_positions=32, vocab_size=100)
    d, q, k, f, v = 64, 64, 16, 96, 100
    matmul = 2 * (d * q + 2 * d * k + q * d + 3 * d * f + 2 * d) + d + v * d  # the embedding lookup is no matmul
    assert flops_per_token(cfg, 32) == 6 * matmul + 12 * 2 * 8 * 8 * 32
    tied = replace(cfg, tie_word_embeddings=True)
    assert flops_per_token(tied, 32) == flops_per_token(cfg, 32)  # the same matmuls either way


def test_config_round_trip_and_refusals():
    cfg = PRESETS["smollm-135m"]
    assert config_from_dict(cfg.to_dict()) == cfg
    assert config_from_dict(PRESETS["tiny"].to_dict()) == PRESETS["tiny"]  # GPT-2 dicts carry no arch
    with pytest.raises(ValueError, match="n_head=8 is not a multiple of n_kv_head=3"):
        LlamaConfig(n_embd=64, n_head=8, n_kv_head=3)
    with pytest.raises(ValueError, match="head_dim=15 must be even"):
        LlamaConfig(n_embd=60, n_head=4, n_kv_head=2)
    with pytest.raises(ValueError, match=r"rope_theta='5e5' must be a number \(YAML reads .* write 5.0e\+5\)"):
        LlamaConfig(rope_theta="5e5")  # what a plan file's 5e5 arrives as
    with pytest.raises(ValueError, match="rms_norm_eps=True must be a number"):
        LlamaConfig(rms_norm_eps=True)
    with pytest.raises(ValueError, match="unknown model arch 'mamba'"):
        config_from_dict({"arch": "mamba"})
    with pytest.raises(ValueError, match=r"unknown LlamaConfig fields \['n_kv_heads'\] for preset 'llama-tiny'"):
        from_preset("llama-tiny", n_kv_heads=2)


def test_preset_override_rederives_head_dim_and_ffn_unless_given():
    wide = from_preset("llama-tiny", n_embd=128, n_head=8)
    assert (wide.head_dim, wide.n_inner) == (16, 384)  # 8 d / 3 rounded up to a multiple of 64
    assert from_preset("llama-tiny", n_embd=128, head_dim=32, n_inner=200).head_dim == 32
    assert from_preset("llama-tiny", n_layer=3).n_inner == PRESETS["llama-tiny"].n_inner


@pytest.mark.bad_input
def test_transformers_configs_growlm_cannot_compute_are_refused():
    from transformers import LlamaConfig as HF

    base = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    with pytest.raises(ValueError, match="attention_bias / mlp_bias"):
        from_hf_config(HF(**base, attention_bias=True))
    with pytest.raises(ValueError, match="rope type 'yarn'"):
        scaled = {"rope_type": "yarn", "rope_theta": 5e5, "factor": 8.0, "original_max_position_embeddings": 8192}
        from_hf_config(HF(**base, max_position_embeddings=65536, rope_parameters=scaled))
    with pytest.raises(ValueError, match="hidden_act='gelu'"):
        from_hf_config(HF(**base, hidden_act="gelu"))


def test_masked_rmsnorm_sees_only_old_dims_and_plain_norm_at_full_mask():
    torch.manual_seed(3)
    norm = RMSNorm(6, 1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 6)
    m = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    small = RMSNorm(4, 1e-5)
    with torch.no_grad():
        small.weight.copy_(norm.weight[:4])
    y = norm(x, mask=m)
    torch.testing.assert_close(y[..., :4], small(x[..., :4]), rtol=0, atol=1e-6)
    assert torch.equal(y[..., 4:], torch.zeros(2, 3, 2))
    torch.testing.assert_close(norm(x, mask=torch.ones(6)), norm(x), rtol=0, atol=1e-6)


def test_activation_checkpointing_gives_the_same_loss_and_gradients():
    cfg = PRESETS["llama-tiny"]
    torch.manual_seed(4)
    a = Llama(cfg)
    b = Llama(cfg, activation_checkpointing=True)
    b.load_state_dict(a.state_dict())
    x, y = torch.randint(0, cfg.vocab_size, (2, 16)), torch.randint(0, cfg.vocab_size, (2, 16))
    la, lb = a(x, y), b(x, y)
    la.backward()
    lb.backward()
    assert la.item() == lb.item()
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-7, msg=name)


def test_expanded_key_value_heads_give_the_attention_of_native_gqa():
    # the CUDA fp32 path expands k, v instead of passing enable_gqa: both must compute the same attention
    torch.manual_seed(5)
    q, k, v = torch.randn(2, 8, 12, 16), torch.randn(2, 2, 12, 16), torch.randn(2, 2, 12, 16)
    outs = []
    for native in (True, False):
        kk, vv, flag = grouped_kv(k, v, 4, native=native)
        assert flag is native and kk.shape[1] == (2 if native else 8)
        outs.append(torch.nn.functional.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=flag))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-6)
    assert grouped_kv(k, v, 1, native=True)[2] is False


def test_gqa_is_left_to_sdpa_only_where_its_flash_kernel_runs(monkeypatch):
    from growlm.model import layers as llama
    from growlm.model.layers import attention_kernel

    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert llama.flash_takes_gqa(cpu, torch.float32, 64)  # the CPU's fused kernel takes the flag
    assert not llama.flash_takes_gqa(gpu, torch.float32, 64)  # fp32 on CUDA: no flash kernel
    assert not llama.flash_takes_gqa(gpu, torch.bfloat16, 320)  # flash stops at head_dim 256
    for capability, expected in (((7, 5), False), ((8, 0), True), ((9, 0), True)):  # flash needs sm80+
        llama._capability.cache_clear()
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index, c=capability: c)
        assert llama.flash_takes_gqa(gpu, torch.bfloat16, 128) is expected
    llama._capability.cache_clear()
    # the probe of shared key/value heads finds the kernel the CPU runs for plain attention
    assert attention_kernel(16, torch.float32, "cpu", n_rep=4, enable_gqa=True) == "flash"
