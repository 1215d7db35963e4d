"""A Llama-family language model whose parameter names and layouts are those of ``transformers.LlamaForCausalLM``:
pre-norm RMSNorm, SwiGLU FFN, rotary position embeddings and grouped-query attention (Touvron et al. 2023, arXiv
2302.13971; Ainslie et al. 2023, arXiv 2305.13245), with growth masks as optional inputs of the blocks. A config
with ``qkv_bias`` (Qwen 2's, model/qwen2) gives q_proj, k_proj and v_proj biases; o_proj and the FFN never have one.

Linear layers are ``nn.Linear``: weight (out, in), y = x @ W^T + b, as in transformers, so a state dict converts by
name alone (``model/llama/hf.py``). Attention is PyTorch SDPA (causal; ``model.layers.causal_attention`` shares each
key/value head between n_head // n_kv_head query heads). This module imports torch only.

Growth masks (``model/layers.py``; values and ramp in ``model/masks.py``): the hidden mask multiplies the embedding
output, every sublayer output and every RMSNorm output (whose mean square becomes mask-weighted); the attention mask
(H*Q,) multiplies each query head's attention output before o_proj (new heads); the FFN mask (F,) the SwiGLU product
silu(gate(x)) * up(x) (new units); the gate a new block's two residual branches. Unlike GPT-2's, the attention mask
acts on head outputs, not on q, k and v: a new query head in an old key/value group would attend with q = 0 (uniform
weights) and return the mean of the old values, not 0.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from growlm.model.layers import (
    CausalLM,
    RMSNorm,
    causal_attention,
    residual_branch,
    residual_init,
    rotary_cos_sin,
    rotate,
)
from growlm.model.llama.config import LlamaConfig
from growlm.model.masks import MaskSpec


class Attention(nn.Module):
    """Causal grouped-query attention: q_proj (H*Q, d), k_proj and v_proj (K*Q, d), o_proj (d, H*Q) (nn.Linear
    (out, in)); q/k/v biases (H*Q,), (K*Q,) with ``cfg.qkv_bias``; query head h reads key/value head h // (H / K)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim, self.dropout = cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.dropout
        bias = cfg.qkv_bias
        self.q_proj = nn.Linear(cfg.n_embd, cfg.n_head * cfg.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.n_embd, cfg.n_kv_head * cfg.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.n_embd, cfg.n_kv_head * cfg.head_dim, bias=bias)
        self.o_proj = nn.Linear(cfg.n_head * cfg.head_dim, cfg.n_embd, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        """(B, T, d) -> (B, T, d); cos, sin (T, Q); ``attn_mask`` (H*Q,) multiplies the heads' outputs when given."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, Q)
        k = self.k_proj(x).view(b, t, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, K, T, Q)
        v = self.v_proj(x).view(b, t, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, K, T, Q)
        y = causal_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(b, t, self.n_head * self.head_dim)  # (B, T, H*Q)
        if attn_mask is not None:
            y = y * attn_mask
        return self.o_proj(y)


class MLP(nn.Module):
    """SwiGLU (Shazeer 2020, arXiv 2002.05202, eq. 6): down_proj(silu(gate_proj(x)) * up_proj(x)); gate_proj and
    up_proj (F, d), down_proj (d, F)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.n_embd, cfg.ffn_dim, bias=False)
        self.up_proj = nn.Linear(cfg.n_embd, cfg.ffn_dim, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_dim, cfg.n_embd, bias=False)

    def forward(self, x: Tensor, ffn_mask: Tensor | None = None) -> Tensor:
        """(B, T, d) -> (B, T, d); ``ffn_mask`` (F,) multiplies silu(gate) * up when given."""
        h = F.silu(self.gate_proj(x)) * self.up_proj(x)  # (B, T, F)
        if ffn_mask is not None:
            h = h * ffn_mask
        return self.down_proj(h)


class Block(nn.Module):
    """Pre-norm block: x + self_attn(input_layernorm(x)), then + mlp(post_attention_layernorm(x))."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.n_embd, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.n_embd, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        *,
        hidden_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        ffn_mask: Tensor | None = None,
        gate: Tensor | None = None,
    ) -> Tensor:
        """(B, T, d) -> (B, T, d). cos, sin (T, Q); masks: hidden (d,), attn (H*Q,), ffn (F,), gate (); None leaves
        one out."""
        a = self.self_attn(self.input_layernorm(x, mask=hidden_mask), cos, sin, attn_mask=attn_mask)
        x = x + residual_branch(a, hidden_mask, gate)
        m = self.mlp(self.post_attention_layernorm(x, mask=hidden_mask), ffn_mask=ffn_mask)
        return x + residual_branch(m, hidden_mask, gate)


class Llama(CausalLM):
    """Llama-family causal language model.

    Parameter names equal ``LlamaForCausalLM``'s: ``model.embed_tokens.weight`` (V, d),
    ``model.layers.{i}.input_layernorm / self_attn.{q,k,v,o}_proj / post_attention_layernorm /
    mlp.{gate,up,down}_proj``, ``model.norm.weight`` (d,), ``lm_head.weight`` (V, d). With
    ``tie_word_embeddings`` the head is the same Parameter as the embedding (``named_parameters`` lists it once, as
    ``model.embed_tokens.weight``).

    Initialisation: N(0, 0.02) weights (transformers' ``initializer_range``), zero biases, unit RMSNorm gains, and
    the residual output projections (o_proj, down_proj) scaled by 1/sqrt(2 L) as growlm's GPT-2 does (Radford et al.
    2019).

    Growth masks and activation checkpointing: ``model.layers.CausalLM``.

    Raises:
        ValueError: ``masks`` does not fit ``cfg`` (see ``MaskSpec.check``).
    """

    def __init__(
        self, cfg: LlamaConfig, masks: MaskSpec | None = None, *, activation_checkpointing: bool = False
    ) -> None:
        super().__init__()
        self.config = cfg
        self.activation_checkpointing = activation_checkpointing
        self.growth_masks: MaskSpec | None = None
        self.model = nn.ModuleDict(
            dict(
                embed_tokens=nn.Embedding(cfg.vocab_size, cfg.n_embd),
                layers=nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer)),
                norm=RMSNorm(cfg.n_embd, cfg.rms_norm_eps),
            )
        )
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight  # tied: (V, d)
        self.reset_parameters()
        if masks is not None:
            self.add_growth_masks(masks)

    @property
    def mask_reference(self) -> Tensor:
        """The token embedding (V, d): the masks take its device and dtype."""
        return self.model.embed_tokens.weight

    @property
    def blocks(self) -> nn.ModuleList:
        """``model.layers``."""
        return self.model.layers

    def reset_parameters(self) -> None:
        """Initialise every parameter (see the class docstring)."""
        residual_init(self, self.config.n_layer, ("o_proj.weight", "down_proj.weight"))

    def embed(self, idx: Tensor) -> Tensor:
        """embed_tokens: (B, T) -> (B, T, d)."""
        return self.model.embed_tokens(idx)

    def block_inputs(self, t: int, x: Tensor) -> tuple[Tensor, ...]:
        """The rotary cos and sin (T, Q) of positions 0..T-1, in x's dtype."""
        return rotary_cos_sin(self.config, t, x.device, x.dtype)

    def final_norm(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """``model.norm`` (RMSNorm), mask-weighted when ``mask`` is given."""
        return self.model.norm(x, mask=mask)
