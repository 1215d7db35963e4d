"""A pre-LN GPT-2 whose parameter names and layouts are those of ``transformers.GPT2LMHeadModel``: the one forward
pass of growlm, with growth masks as optional inputs of the same blocks.

Linear layers keep HF's Conv1D layout: weight (in, out), y = x @ W + b, so a state dict converts to HF by name
alone. The LM head is tied to ``transformer.wte``. Attention is PyTorch SDPA (causal). GELU is the tanh form
(HF ``gelu_new``). This module imports torch only: no DeepSpeed, no files, no ranks.

Growth masks (Masked Structural Growth, Yao et al. 2023, arXiv 2305.02869; the values and their ramp live in
``model/masks.py``, the mathematics in the repository's DESIGN.md, section "Model and growth masks") enter the
blocks as optional keyword inputs; every one that is None leaves its operation out, so without masks the forward
pass is exactly the plain GPT-2 one:

    hidden_mask (d,)    multiplies the embedding output, every sublayer output and every LayerNorm output;
                        LayerNorm statistics become mask-weighted (``LayerNorm``)
    attn_mask   (H*Q,)  multiplies q, k and v (new heads and new dims of old heads)
    ffn_mask    (F,)    multiplies the FFN pre-activation (GELU(0) = 0, so a masked unit adds nothing)
    gate        ()      a block's gate g on both residual branches: x <- x + g * f(x)

Masks are keyword arguments on purpose: DeepSpeed ZeRO-3's module hooks see positional inputs only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from growlm.model.gpt2.config import GPTConfig
from growlm.model.layers import CausalLM, residual_branch, residual_init
from growlm.model.masks import MaskSpec


class Conv1D(nn.Module):
    """Affine map with HF GPT-2's weight layout: weight (in, out), bias (out,); (..., in) -> (..., out)."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x: Tensor) -> Tensor:
        """y = x @ weight + bias: (..., in) -> (..., out), in the parameters' dtype."""
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` over the last axis (d,), with mask-weighted statistics when a hidden mask is given.

    Same parameters (``weight`` (d,), ``bias`` (d,)) and state-dict names as ``nn.LayerNorm``. With a mask m (d,):
    mu = sum(m x) / sum(m), var = sum(m (x - mu)^2) / sum(m), y = ((x - mu) / sqrt(var + eps) * weight + bias) * m
    (MSG, Yao et al. 2023, arXiv 2305.02869, section 3; DESIGN.md, section "Model and growth masks"). With m = 1
    everywhere this is ordinary LayerNorm; with m = 0 on new dims the old dims see exactly the old model's
    LayerNorm. Masked statistics are computed in fp32 at least, even for a bf16/fp16 model.
    """

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Normalise x (..., d); ``mask`` (d,) or None (plain LayerNorm). Returns (..., d) in x's dtype."""
        if mask is None:
            return super().forward(x)
        dtype = x.dtype
        stat = torch.promote_types(dtype, torch.float32)
        x, m = x.to(stat), mask.to(stat)
        s = m.sum()
        mu = (x * m).sum(-1, keepdim=True) / s
        xc = x - mu
        var = (xc.square() * m).sum(-1, keepdim=True) / s
        return ((xc * torch.rsqrt(var + self.eps) * self.weight.to(stat) + self.bias.to(stat)) * m).to(dtype)


class Attention(nn.Module):
    """Causal multi-head self-attention: c_attn (d, 3d) packs q, k, v in that order; c_proj (d, d)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.c_attn = Conv1D(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = Conv1D(cfg.n_embd, cfg.n_embd)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        """(B, T, d) -> (B, T, d); ``attn_mask`` (H*Q,) multiplies q, k and v when given."""
        b, t, d = x.shape  # (B, T, d)
        q, k, v = self.c_attn(x).split(d, dim=-1)  # each (B, T, d)
        if attn_mask is not None:
            q, k, v = q * attn_mask, k * attn_mask, v * attn_mask
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

    def forward(self, x: Tensor, ffn_mask: Tensor | None = None) -> Tensor:
        """(B, T, d) -> (B, T, d); ``ffn_mask`` (F,) multiplies the pre-activation c_fc(x) when given."""
        h = self.c_fc(x)  # (B, T, F)
        if ffn_mask is not None:
            h = h * ffn_mask
        return self.dropout(self.c_proj(F.gelu(h, approximate="tanh")))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x)); growth masks optional (module docstring)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.attn = Attention(cfg)
        self.ln_2 = LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.mlp = MLP(cfg)

    def forward(
        self,
        x: Tensor,
        *,
        hidden_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        ffn_mask: Tensor | None = None,
        gate: Tensor | None = None,
    ) -> Tensor:
        """(B, T, d) -> (B, T, d). Masks: hidden (d,), qkv (H*Q,), ffn (F,), gate () scalar; None leaves one out."""
        x = x + residual_branch(self.attn(self.ln_1(x, mask=hidden_mask), attn_mask=attn_mask), hidden_mask, gate)
        return x + residual_branch(self.mlp(self.ln_2(x, mask=hidden_mask), ffn_mask=ffn_mask), hidden_mask, gate)


class GPT(CausalLM):
    """GPT-2 language model (pre-LN, learned positions, tied LM head).

    Parameter names equal ``GPT2LMHeadModel``'s: ``transformer.wte.weight`` (V, d), ``transformer.wpe.weight``
    (P, d), ``transformer.h.{i}.ln_1/attn.c_attn/attn.c_proj/ln_2/mlp.c_fc/mlp.c_proj``, ``transformer.ln_f``;
    ``lm_head.weight`` is the same Parameter as ``transformer.wte.weight`` (``named_parameters`` lists it once).

    Initialisation follows GPT-2 (Radford et al. 2019): N(0, 0.02) weights, zero biases, unit LayerNorm gains,
    and residual output projections (``*.c_proj.weight``) scaled by 1/sqrt(2 L).

    Growth masks (``model/masks.py``, ``GrowthMaskedModel``): ``GPT(cfg, masks=spec)`` builds a model with the mask
    buffers of a ``MaskSpec`` (at ramp value 0), e.g. to load a checkpoint saved mid-ramp; ``set_growth_step(step)``
    moves the ramp after each optimizer step and drops the masks when it reaches 1. The buffers
    ``growth_mask_hidden`` (d,), ``growth_mask_attn`` (H*Q,), ``growth_mask_ffn`` (F,) and ``growth_gate_layer``
    (L,) are passed to the blocks as their optional mask inputs; without masks the forward pass is the plain GPT-2 one.

    Activation checkpointing: ``model.layers.CausalLM``.

    Raises:
        ValueError: ``masks`` does not fit ``cfg`` (see ``MaskSpec.check``).
    """

    def __init__(
        self, cfg: GPTConfig, masks: MaskSpec | None = None, *, activation_checkpointing: bool = False
    ) -> None:
        super().__init__()
        self.config = cfg
        self.activation_checkpointing = activation_checkpointing
        self.growth_masks: MaskSpec | None = None
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
                wpe=nn.Embedding(cfg.n_positions, cfg.n_embd),
                drop=nn.Dropout(cfg.dropout),
                h=nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer)),
                ln_f=LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon),
            )
        )
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied: (V, d)
        self.reset_parameters()
        if masks is not None:
            self.add_growth_masks(masks)

    @property
    def mask_reference(self) -> Tensor:
        """The token embedding (V, d): the masks take its device and dtype."""
        return self.transformer.wte.weight

    @property
    def blocks(self) -> nn.ModuleList:
        """``transformer.h``."""
        return self.transformer.h

    def reset_parameters(self) -> None:
        """GPT-2 initialisation of every parameter (see the class docstring)."""
        residual_init(self, self.config.n_layer, ("c_proj.weight",))

    def embed(self, idx: Tensor) -> Tensor:
        """drop(wte(idx) + wpe(positions)): (B, T) -> (B, T, d)."""
        tr = self.transformer
        return tr.drop(tr.wte(idx) + tr.wpe(torch.arange(idx.shape[1], device=idx.device)))

    def final_norm(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """``transformer.ln_f`` (LayerNorm), mask-weighted when ``mask`` is given."""
        return self.transformer.ln_f(x, mask=mask)
