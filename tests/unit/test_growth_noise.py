"""Symmetry-breaking noise (growth.ops.rules.seeded_normal): drawn in float32 slices from one CPU generator, so its
values depend on the parameter name and seed only (not on the dtype, the device or the global RNG) and the host
never holds the whole tensor; the operators that add it make no float64 copy of a weight."""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from growlm.growth.ops import make_rules
from growlm.growth.ops import rules as rules_module
from growlm.growth.ops.apply import OptimizerPolicy, grow_param
from growlm.growth.ops.rules import param_shapes, rms, seeded_normal
from growlm.growth.ops.stores import ParamState
from growlm.model.config import GPTConfig, LlamaConfig


def test_noise_is_drawn_in_float32_slices_and_does_not_depend_on_dtype_or_global_rng(monkeypatch):
    monkeypatch.setattr(rules_module, "NOISE_SLICE", 1000)
    draws = []
    randn = torch.randn

    def recording_randn(*args, **kw):
        out = randn(*args, **kw)
        draws.append((out.dtype, out.numel(), out.device.type))
        return out

    monkeypatch.setattr(torch, "randn", recording_randn)
    shape = (37, 101)  # 3737 elements: three whole slices and a part
    torch.manual_seed(0)
    wide = seeded_normal(shape, 0.02, "h.0.w", 7, torch.empty(0, dtype=torch.float64))
    assert draws == [(torch.float32, 1000, "cpu")] * 3 + [(torch.float32, 737, "cpu")]
    torch.manual_seed(123)  # the global RNG plays no part
    narrow = seeded_normal(shape, 0.02, "h.0.w", 7, torch.empty(0, dtype=torch.bfloat16))
    as_fp32 = seeded_normal(shape, 0.02, "h.0.w", 7, torch.empty(0, dtype=torch.bfloat16), dtype=torch.float32)
    assert wide.dtype == torch.float64 and narrow.dtype == torch.bfloat16 and as_fp32.dtype == torch.float32
    # float32 values, scaled in float32, then rounded to the dtype asked for
    assert torch.equal(wide, as_fp32.double())
    assert torch.equal(narrow, as_fp32.bfloat16())
    assert abs(wide.std().item() - 0.02) < 0.002 and abs(wide.mean().item()) < 0.002
    other = seeded_normal(shape, 0.02, "h.1.w", 7, wide)
    assert not torch.equal(other, wide)  # another parameter name, other noise
    assert torch.equal(seeded_normal(shape, 0.0, "h.0.w", 7, wide), torch.zeros(shape, dtype=torch.float64))


def test_rms_matches_the_float64_reference_without_a_float64_copy():
    x = torch.randn(300, 70, generator=torch.Generator().manual_seed(1)) * 3
    ref = x.double().square().mean().sqrt().item()
    assert rms(x) == pytest.approx(ref, rel=1e-5)  # a float32 reduction
    assert rms(x.bfloat16()) == pytest.approx(x.bfloat16().double().square().mean().sqrt().item(), rel=1e-5)
    assert rms(torch.empty(0)) == 0.0


class _Float64Outputs(TorchDispatchMode):
    """Records the element count of every float64 tensor an op returns."""

    def __init__(self):
        super().__init__()
        self.sizes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
                self.sizes.append(t.numel())
        return out


GPT = dict(n_layer=1, n_embd=32, n_head=4, vocab_size=96, n_positions=16)
LLAMA = dict(n_layer=1, n_embd=32, n_head=4, n_kv_head=2, n_inner=48, vocab_size=96, n_positions=16)
CASES = {  # family config, old, target overrides
    "gpt2 width x2": (GPTConfig, GPT, dict(n_embd=64, n_head=8)),
    "llama width x2": (LlamaConfig, LLAMA, dict(n_embd=64, n_head=8, n_kv_head=4, n_inner=96)),
    "llama heads": (LlamaConfig, LLAMA, dict(n_head=8, n_kv_head=4, head_dim=8)),
    "llama ffn": (LlamaConfig, LLAMA, dict(n_inner=80)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_noise_operators_make_no_float64_copy_of_a_weight(case):
    cls, old_kw, over = CASES[case]
    old, new = cls(**old_kw), cls(**{**old_kw, **over})
    plan = make_rules(old, new, "duplicate", symmetry="noise", noise_std=0.5)
    shapes, new_shapes = param_shapes(old), param_shapes(new)
    g = torch.Generator().manual_seed(0)
    noisy = 0
    for name, rule in plan.rules.items():
        src = shapes[rule.source or name]
        st = ParamState(torch.randn(src, generator=g), torch.randn(src, generator=g), torch.rand(src, generator=g))
        mode = _Float64Outputs()
        with mode:
            grown = grow_param(rule, st, OptimizerPolicy())
        assert grown.weight.dtype == torch.float32 and tuple(grown.weight.shape) == new_shapes[name]
        # only small float64 tensors: the (k, k) moment patterns, replica counts, scalars
        assert all(n <= max(new_shapes[name]) for n in mode.sizes), (name, mode.sizes)
        noisy += math.prod(new_shapes[name]) > 0
    assert noisy > 0
