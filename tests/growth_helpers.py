"""Helpers shared by growlm's growth tests and the benchmark: small configs, models grown by a plan, random Adam
state. Torch only."""

from __future__ import annotations

import torch

from growlm.growth.ops.apply import OptimizerPolicy, apply_rules
from growlm.growth.ops.rules import RuleSet
from growlm.growth.ops.stores import DictStore, ModuleStore, ParamState
from growlm.model.config import GPTConfig
from growlm.model.gpt2.model import GPT


def small_cfg(n_layer: int = 2, n_head: int = 2, head_dim: int = 4, n_inner: int | None = None) -> GPTConfig:
    """A config small enough for property tests: vocab 97, 16 positions."""
    return GPTConfig(
        n_layer=n_layer, n_embd=n_head * head_dim, n_head=n_head, n_inner=n_inner, n_positions=16, vocab_size=97
    )


def random_model(cfg: GPTConfig, seed: int = 0, dtype: torch.dtype = torch.float32) -> GPT:
    """GPT(cfg) with GPT-2 init plus noise on biases and LayerNorms (so no parameter is trivially 0 or 1)."""
    torch.manual_seed(seed)
    model = GPT(cfg).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def random_params(model: GPT, seed: int = 0) -> dict[str, ParamState]:
    """The model's weights with random positive-looking Adam moments (fp32)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in model.named_parameters():
        w = p.detach().float().clone()
        out[name] = ParamState(w, 1e-3 * torch.randn(w.shape, generator=g), 1e-6 * torch.rand(w.shape, generator=g))
    return out


def grown_model(small: GPT, plan: RuleSet, policy: OptimizerPolicy | None = None) -> GPT:
    """A model of plan.new (with the plan's masks, at ramp 0) holding the plan applied to ``small``'s weights."""
    big = GPT(plan.new, masks=plan.masks).to(small.transformer.wte.weight.dtype).eval()
    apply_rules(plan, ModuleStore(small), ModuleStore(big), policy)
    return big


def tokens(cfg: GPTConfig, batch: int = 2, t: int = 12, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (batch, min(t, cfg.n_positions)), generator=g)


def as_store(params: dict[str, ParamState]) -> DictStore:
    return DictStore(params)
