"""A pre-LN GPT-2 whose parameter names and layouts are those of ``transformers.GPT2LMHeadModel``.

Linear layers keep HF's Conv1D layout: weight (in, out), y = x @ W + b, so a state dict converts to HF by name
alone. The LM head is tied to ``transformer.wte``. Attention is PyTorch SDPA (causal). GELU is the tanh form
(HF ``gelu_new``). This module imports torch only: no DeepSpeed, no files, no ranks.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.config import GPTConfig
from model.masks import MASK_BUFFERS, MaskSpec, mask_values, masked_forward_hidden, new_unit_flags


class Conv1D(nn.Module):
    """Affine map with HF GPT-2's weight layout: weight (in, out), bias (out,); (..., in) -> (..., out)."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x: Tensor) -> Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class Attention(nn.Module):
    """Causal multi-head self-attention: c_attn (d, 3d) packs q, k, v in that order; c_proj (d, d)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.c_attn = Conv1D(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = Conv1D(cfg.n_embd, cfg.n_embd)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape  # (B, T, d)
        q, k, v = self.c_attn(x).split(d, dim=-1)  # each (B, T, d)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))  # (B, H, T, Q)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).reshape(b, t, d)  # (B, T, d)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """c_fc (d, F) -> GELU (tanh form) -> c_proj (F, d)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = Conv1D(cfg.n_embd, cfg.ffn_dim)
        self.c_proj = Conv1D(cfg.ffn_dim, cfg.n_embd)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 language model (pre-LN, learned positions, tied LM head).

    Parameter names equal ``GPT2LMHeadModel``'s: ``transformer.wte.weight`` (V, d), ``transformer.wpe.weight``
    (P, d), ``transformer.h.{i}.ln_1/attn.c_attn/attn.c_proj/ln_2/mlp.c_fc/mlp.c_proj``, ``transformer.ln_f``;
    ``lm_head.weight`` is the same Parameter as ``transformer.wte.weight`` (``named_parameters`` lists it once).

    Initialisation follows GPT-2 (Radford et al. 2019): N(0, 0.02) weights, zero biases, unit LayerNorm gains,
    and residual output projections (``*.c_proj.weight``) scaled by 1/sqrt(2 L).

    Growth masks (``model/masks.py``): ``GPT(cfg, masks=spec)`` builds a model with the mask buffers of a
    ``MaskSpec`` (at ramp value 0), e.g. to load a checkpoint saved mid-ramp; ``set_growth_step(step)`` moves the
    ramp after each optimizer step and drops the masks when it reaches 1. Without masks the forward pass is the
    plain GPT-2 one.
    """

    def __init__(self, cfg: GPTConfig, masks: MaskSpec | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.growth_masks: MaskSpec | None = None
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
                wpe=nn.Embedding(cfg.n_positions, cfg.n_embd),
                drop=nn.Dropout(cfg.dropout),
                h=nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer)),
                ln_f=nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon),
            )
        )
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied: (V, d)
        self.reset_parameters()
        if masks is not None:
            self.add_growth_masks(masks)

    def add_growth_masks(self, spec: MaskSpec, step: int | None = None) -> None:
        """Register the mask buffers of ``spec`` (persistent: in ``state_dict``), at the ramp value of ``step``
        (default: spec.start_step, i.e. 0 on new units).

        Raises:
            ValueError: the model already has masks, or the spec does not fit this config.
        """
        if self.growth_masks is not None:
            raise ValueError("model already has growth masks; remove_growth_masks() or finish the ramp first")
        spec.check(self.config)
        r = spec.value(spec.start_step if step is None else step)
        device = self.transformer.wte.weight.device
        dtype = self.transformer.wte.weight.dtype
        for name, is_new in new_unit_flags(spec, self.config).items():
            self.register_buffer(name, mask_values(is_new, r).to(device=device, dtype=dtype), persistent=True)
        self.growth_masks = spec

    def set_growth_step(self, step: int) -> float:
        """Set every mask to the ramp value at ``step`` optimizer steps; at 1 remove the masks. Call after each
        optimizer step (and after loading a checkpoint). Returns the ramp value (1.0 when there are no masks)."""
        spec = self.growth_masks
        if spec is None:
            return 1.0
        r = spec.value(step)
        if r >= 1.0:
            self.remove_growth_masks()
            return 1.0
        for name, is_new in new_unit_flags(spec, self.config).items():
            buf = getattr(self, name)
            buf.copy_(mask_values(is_new, r).to(buf.dtype))
        return r

    def remove_growth_masks(self) -> None:
        """Drop the mask buffers: the model becomes a plain GPT-2 (exact when the ramp has reached 1)."""
        for name in MASK_BUFFERS:
            if name in self._buffers:
                del self._buffers[name]
        self.growth_masks = None

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2 initialisation of every parameter (see the class docstring)."""
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                p.normal_(0.0, residual_std)
            elif name.endswith(".weight") and p.dim() == 2:
                p.normal_(0.0, 0.02)
            elif name.endswith(".weight"):  # LayerNorm gain
                p.fill_(1.0)
            else:  # biases
                p.zero_()

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> Tensor:
        """Next-token logits, or the loss against ``targets``.

        Args:
            idx: token ids (B, T), int64, T <= n_positions.
            targets: optional next-token ids (B, T), int64; -100 marks positions to ignore.

        Returns:
            logits (B, T, V) in the parameters' dtype when ``targets`` is None, else the mean cross-entropy over
            the non-ignored positions as a scalar fp32 tensor (nats per token).

        Raises:
            ValueError: T exceeds n_positions.
        """
        t = idx.shape[1]
        if t > self.config.n_positions:
            raise ValueError(f"sequence length {t} exceeds n_positions={self.config.n_positions}")
        tr = self.transformer
        if self.growth_masks is not None:
            logits = self.lm_head(masked_forward_hidden(self, idx))  # (B, T, V)
        else:
            pos = torch.arange(t, device=idx.device)
            x = tr.drop(tr.wte(idx) + tr.wpe(pos))  # (B, T, d)
            for block in tr.h:
                x = block(x)
            logits = self.lm_head(tr.ln_f(x))  # (B, T, V)
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100)
