"""A Llama-family language model whose parameter names and layouts are those of ``transformers.LlamaForCausalLM``:
pre-norm RMSNorm without biases, SwiGLU FFN, rotary position embeddings and grouped-query attention (Touvron et al.
2023, arXiv 2302.13971; Ainslie et al. 2023, arXiv 2305.13245), with growth masks as optional inputs of the blocks.

Linear layers are ``nn.Linear`` without bias: weight (out, in), y = x @ W^T, as in transformers, so a state dict
converts by name alone (``model/llama_hf.py``). Attention is PyTorch SDPA (causal; ``enable_gqa`` shares each
key/value head between n_head // n_kv_head query heads). This module imports torch only.

Growth masks (Masked Structural Growth, Yao et al. 2023, arXiv 2305.02869; values and ramp in ``model/masks.py``):

    hidden_mask (d,)    multiplies the embedding output, every sublayer output and every RMSNorm output; RMSNorm's
                        mean square becomes mask-weighted (``RMSNorm``)
    head_mask   (H*Q,)  multiplies each query head's attention output before o_proj (new heads)
    ffn_mask    (F,)    multiplies the SwiGLU product silu(gate(x)) * up(x) (new units)
    gate        ()      a block's gate g on both residual branches: x <- x + g * f(x)

Unlike GPT-2's, the attention mask acts on head outputs, not on q, k and v: a new query head in an old key/value
group would attend with q = 0 (uniform weights) and return the mean of the old values, not 0.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from growlm.model.config import LlamaConfig
from growlm.model.masks import GrowthMaskedModel, MaskSpec


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last axis (Zhang and Sennrich 2019, arXiv 1910.07467, eq. 4), computed in fp32
    as transformers' ``LlamaRMSNorm``: y = weight * (x / sqrt(mean(x^2) + eps)), the product in x's dtype.

    With a mask m (d,): mean(x^2) becomes sum(m x^2) / sum(m) and y is multiplied by m (MSG's masked statistics,
    Yao et al. 2023, section 3). With m = 0 on new dims, the old dims see exactly the old model's norm; zero-padded
    dims without a mask would instead shrink the mean square by d / d' (DESIGN.md, "Llama growth").
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Normalise x (..., d); ``mask`` (d,) or None. Returns (..., d) in x's dtype."""
        dtype = x.dtype
        h = x.to(torch.float32)
        if mask is None:
            ms = h.square().mean(-1, keepdim=True)
        else:
            m = mask.to(torch.float32)
            ms = (h.square() * m).sum(-1, keepdim=True) / m.sum()
        y = self.weight * (h * torch.rsqrt(ms + self.eps)).to(dtype)
        return y if mask is None else y * mask.to(y.dtype)


def rope_inv_freq(cfg: LlamaConfig, device: torch.device | None = None) -> Tensor:
    """The rotary frequencies (Q/2,) in fp32: theta_i = rope_theta^(-2i/Q) (Su et al. 2021, arXiv 2104.09864,
    eq. 15), scaled as ``cfg.rope_type`` says:

    - "linear": theta_i / factor (position interpolation; Chen et al. 2023, arXiv 2306.15595, eq. 4);
    - "llama3" (Meta's Llama 3.1 release; Grattafiori et al. 2024, arXiv 2407.21783): with wavelength
      lambda_i = 2 pi / theta_i, original context C (rope_original_positions), factors s (rope_factor), l and h
      (rope_low_freq_factor, rope_high_freq_factor): theta_i / s where lambda_i > C / l (long wavelengths), theta_i
      where lambda_i < C / h (short ones), and between them (1 - a) theta_i / s + a theta_i with
      a = (C / lambda_i - l) / (h - l).
    """
    q = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, q, 2, device=device, dtype=torch.int64).float() / q))
    if cfg.rope_type == "linear":
        return inv / cfg.rope_factor
    if cfg.rope_type == "llama3":
        c, s, lo, hi = cfg.rope_original_positions, cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
        wavelen = 2 * math.pi / inv
        a = ((c / wavelen - lo) / (hi - lo)).clamp(0.0, 1.0)  # 0 past C / l, 1 below C / h
        return (1 - a) * inv / s + a * inv
    return inv


def rotary_cos_sin(cfg: LlamaConfig, t: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin (T, Q) of rotary position embeddings for positions 0..T-1 (Su et al. 2021, arXiv 2104.09864,
    eq. 34): angle p * theta_i for the frequencies of ``rope_inv_freq`` (the config's rotary scaling applied), each
    repeated for both halves of the head (transformers' rotate-half layout). Computed in fp32 every call (no buffer
    a precision cast could round), then cast to ``dtype``."""
    inv_freq = rope_inv_freq(cfg, device)
    angles = torch.arange(t, device=device, dtype=torch.int64).float()[:, None] * inv_freq[None, :]  # (T, Q/2)
    emb = torch.cat((angles, angles), dim=-1)  # (T, Q)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x * cos + rotate_half(x) * sin for x (B, heads, T, Q), with rotate_half([a, b]) = [-b, a]."""
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), dim=-1) * sin


def flash_takes_gqa(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether SDPA should share key/value heads itself (``enable_gqa``) for queries of this device, dtype and head
    size. On the CPU always (its fused kernel takes the flag). On CUDA only the flash kernel takes it
    (FlashAttention-2, Dao 2023, arXiv 2307.08691), and PyTorch's flash kernel needs fp16 or bf16, head_dim <= 256 and
    a GPU of compute capability 8.0 or newer; anywhere else the flag would send attention to the unfused kernel and
    its T^2 memory, so the key/value heads are expanded instead (``grouped_kv``) and the memory-efficient kernel runs.
    """
    if device.type != "cuda":
        return True
    if dtype not in (torch.float16, torch.bfloat16) or head_dim > 256:
        return False
    return _capability(device.index if device.index is not None else torch.cuda.current_device()) >= (8, 0)


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    """The compute capability of CUDA device ``index`` (asked once per process)."""
    return tuple(torch.cuda.get_device_capability(index))


def native_gqa(q: Tensor) -> bool:
    """``flash_takes_gqa`` for queries ``q`` (B, H, T, Q)."""
    return flash_takes_gqa(q.device, q.dtype, q.shape[-1])


def grouped_kv(k: Tensor, v: Tensor, n_rep: int, *, native: bool) -> tuple[Tensor, Tensor, bool]:
    """Keys and values (B, K, T, Q) as SDPA takes them, and its ``enable_gqa`` flag: unchanged with the flag set
    when ``native`` (and n_rep > 1), else each key/value head repeated n_rep times in place, (B, K * n_rep, T, Q),
    so query head h meets key/value head h // n_rep either way (transformers' ``repeat_kv``)."""
    if n_rep == 1:
        return k, v, False
    if native:
        return k, v, True
    return k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1), False


class Attention(nn.Module):
    """Causal grouped-query attention: q_proj (H*Q, d), k_proj and v_proj (K*Q, d), o_proj (d, H*Q) (nn.Linear
    (out, in)); query head h reads key/value head h // (H / K)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim, self.dropout = cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.dropout
        self.q_proj = nn.Linear(cfg.n_embd, cfg.n_head * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.n_embd, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.n_embd, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_head * cfg.head_dim, cfg.n_embd, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, head_mask: Tensor | None = None) -> Tensor:
        """(B, T, d) -> (B, T, d); cos, sin (T, Q); ``head_mask`` (H*Q,) multiplies the heads' outputs when given."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, Q)
        k = self.k_proj(x).view(b, t, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, K, T, Q)
        v = self.v_proj(x).view(b, t, self.n_kv_head, self.head_dim).transpose(1, 2)  # (B, K, T, Q)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        k, v, gqa = grouped_kv(k, v, self.n_head // self.n_kv_head, native=native_gqa(q))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True, enable_gqa=gqa
        )  # (B, H, T, Q)
        y = y.transpose(1, 2).reshape(b, t, self.n_head * self.head_dim)  # (B, T, H*Q)
        if head_mask is not None:
            y = y * head_mask
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


def _branch(y: Tensor, hidden_mask: Tensor | None, gate: Tensor | None) -> Tensor:
    """A sublayer output (B, T, d) as added to the residual stream: times hidden_mask (d,), then gate ()."""
    if hidden_mask is not None:
        y = y * hidden_mask
    return y if gate is None else gate * y


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
        head_mask: Tensor | None = None,
        ffn_mask: Tensor | None = None,
        gate: Tensor | None = None,
    ) -> Tensor:
        """(B, T, d) -> (B, T, d). cos, sin (T, Q); masks: hidden (d,), head (H*Q,), ffn (F,), gate (); None leaves
        one out."""
        a = self.self_attn(self.input_layernorm(x, mask=hidden_mask), cos, sin, head_mask=head_mask)
        x = x + _branch(a, hidden_mask, gate)
        m = self.mlp(self.post_attention_layernorm(x, mask=hidden_mask), ffn_mask=ffn_mask)
        return x + _branch(m, hidden_mask, gate)


class Llama(GrowthMaskedModel):
    """Llama-family causal language model.

    Parameter names equal ``LlamaForCausalLM``'s: ``model.embed_tokens.weight`` (V, d),
    ``model.layers.{i}.input_layernorm / self_attn.{q,k,v,o}_proj / post_attention_layernorm /
    mlp.{gate,up,down}_proj``, ``model.norm.weight`` (d,), ``lm_head.weight`` (V, d). With
    ``tie_word_embeddings`` the head is the same Parameter as the embedding (``named_parameters`` lists it once, as
    ``model.embed_tokens.weight``).

    Initialisation: N(0, 0.02) weights (transformers' ``initializer_range``), unit RMSNorm gains, and the residual
    output projections (o_proj, down_proj) scaled by 1/sqrt(2 L) as growlm's GPT-2 does (Radford et al. 2019).

    Growth masks and activation checkpointing work as in ``model.gpt.GPT``.

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

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise every parameter (see the class docstring)."""
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, p in self.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.normal_(0.0, residual_std)
            elif p.dim() == 2:
                p.normal_(0.0, 0.02)
            else:  # RMSNorm gains
                p.fill_(1.0)

    def hidden_states(self, idx: Tensor) -> Tensor:
        """The final hidden states after the last norm, (B, T, d) in the parameters' dtype, for token ids idx
        (B, T) int64.

        Raises:
            ValueError: T exceeds n_positions.
        """
        t = idx.shape[1]
        if t > self.config.n_positions:
            raise ValueError(f"sequence length {t} exceeds n_positions={self.config.n_positions}")
        m = self.model
        hidden, heads, ffn, gate = self.mask_inputs()
        x = m.embed_tokens(idx)  # (B, T, d)
        if hidden is not None:
            x = x * hidden
        cos, sin = rotary_cos_sin(self.config, t, x.device, x.dtype)
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for i, block in enumerate(m.layers):
            g = None if gate is None else gate[i]
            kw = dict(hidden_mask=hidden, head_mask=heads, ffn_mask=ffn, gate=g)
            if recompute:
                x = checkpoint(block, x, cos, sin, use_reentrant=False, **kw)
            else:
                x = block(x, cos, sin, **kw)
        return m.norm(x, mask=hidden)

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
        logits = self.lm_head(self.hidden_states(idx))  # (B, T, V)
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100)
