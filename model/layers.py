"""The parts every model family is made of, written once: the causal language model's skeleton (``CausalLM``: the
embedding -> blocks -> final norm loop with growth masks and activation checkpointing, and the loss tail of
``forward``), the residual branch, RMSNorm, rotary position embeddings, and the choice of the attention kernel.
A family (``model/<family>/model.py``) supplies its embedding, its block and its final norm. Torch only.

Growth masks (Masked Structural Growth, Yao et al. 2023, arXiv 2305.02869; values and ramp in ``model/masks.py``)
reach every block as keyword inputs (DeepSpeed ZeRO-3's module hooks see positional inputs only):

    hidden_mask (d,)    multiplies the embedding output, every sublayer output and every norm output
    attn_mask   (H*Q,)  the attention units of new heads (what it multiplies is the family's: model/masks.py)
    ffn_mask    (F,)    the FFN units of new units
    gate        ()      a block's gate g on both residual branches: x <- x + g * f(x)
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from growlm.model.masks import GrowthMaskedModel

# ----- the causal language model -------------------------------------------------------------------------------------


class CausalLM(GrowthMaskedModel):
    """A decoder-only language model: ``embed`` (B, T) -> (B, T, d), the blocks, ``final_norm``, ``lm_head``.

    A family's subclass sets ``self.config``, ``self.activation_checkpointing``, ``self.growth_masks = None`` and
    ``self.lm_head`` and defines ``blocks`` (its ``nn.ModuleList``), ``embed``, ``final_norm`` and, where its blocks
    take more than the hidden states (Llama's rotary cos and sin), ``block_inputs``.

    Activation checkpointing (``activation_checkpointing=True``): while training with gradients enabled, each block's
    activations are not kept for backward but recomputed from its input (``torch.utils.checkpoint``, non-reentrant,
    RNG state preserved: the same losses and gradients as without it), so activation memory is one (B, T, d) tensor
    per block instead of every intermediate of every block, for about one extra forward pass of the blocks (Chen et
    al. 2016, arXiv 1604.06174).
    """

    activation_checkpointing: bool
    lm_head: nn.Module

    @property
    def blocks(self) -> nn.ModuleList:
        """The transformer blocks, in order."""
        raise NotImplementedError

    def embed(self, idx: Tensor) -> Tensor:
        """Token ids (B, T) int64 -> the residual stream's input (B, T, d)."""
        raise NotImplementedError

    def final_norm(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """The norm after the last block, (B, T, d) -> (B, T, d); ``mask`` the hidden mask (d,) or None."""
        raise NotImplementedError

    def block_inputs(self, t: int, x: Tensor) -> tuple[Tensor, ...]:
        """Positional inputs every block takes after the hidden states, for T = ``t`` positions (none here)."""
        return ()

    def hidden_states(self, idx: Tensor) -> Tensor:
        """The final hidden states after the last norm, (B, T, d) in the parameters' dtype, for token ids idx
        (B, T) int64.

        Raises:
            ValueError: T exceeds n_positions.
        """
        t = idx.shape[1]
        if t > self.config.n_positions:
            raise ValueError(f"sequence length {t} exceeds n_positions={self.config.n_positions}")
        hidden, attn, ffn, gate = self.mask_inputs()
        x = self.embed(idx)  # (B, T, d)
        if hidden is not None:
            x = x * hidden
        extra = self.block_inputs(t, x)
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for i, block in enumerate(self.blocks):
            kw: dict[str, Any] = dict(
                hidden_mask=hidden, attn_mask=attn, ffn_mask=ffn, gate=None if gate is None else gate[i]
            )
            if recompute:
                x = checkpoint(block, x, *extra, use_reentrant=False, **kw)
            else:
                x = block(x, *extra, **kw)
        return self.final_norm(x, hidden)

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


def residual_branch(y: Tensor, hidden_mask: Tensor | None, gate: Tensor | None) -> Tensor:
    """A sublayer output (B, T, d) as added to the residual stream: times hidden_mask (d,), then gate ()."""
    if hidden_mask is not None:
        y = y * hidden_mask
    return y if gate is None else gate * y


def residual_init(model: nn.Module, n_layer: int, residual: tuple[str, ...]) -> None:
    """GPT-2's initialisation (Radford et al. 2019) of every parameter of ``model``: matrices and embeddings
    N(0, 0.02), the residual output projections (names ending in one of ``residual``) N(0, 0.02 / sqrt(2 L)), norm
    gains 1, biases 0."""
    residual_std = 0.02 / math.sqrt(2 * n_layer)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(residual):
                p.normal_(0.0, residual_std)
            elif p.dim() == 2:
                p.normal_(0.0, 0.02)
            elif name.endswith(".bias"):
                p.zero_()
            else:  # norm gains
                p.fill_(1.0)


# ----- RMSNorm -------------------------------------------------------------------------------------------------------


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


# ----- rotary position embeddings ------------------------------------------------------------------------------------


def rope_inv_freq(cfg: Any, device: torch.device | None = None) -> Tensor:
    """The rotary frequencies (Q/2,) in fp32 of a config with rotary fields (head_dim, rope_theta, rope_type,
    rope_factor, ...): theta_i = rope_theta^(-2i/Q) (Su et al. 2021, arXiv 2104.09864, eq. 15), scaled as
    ``cfg.rope_type`` says:

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


def rotary_cos_sin(cfg: Any, t: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin (T, Q) of rotary position embeddings for positions 0..T-1 (Su et al. 2021, arXiv 2104.09864,
    eq. 34): angle p * theta_i for the frequencies of ``rope_inv_freq`` (the config's rotary scaling applied), each
    repeated for both halves of the head (transformers' rotate-half layout). Computed in fp32 every call (no buffer
    a precision cast could round), then cast to ``dtype``."""
    inv_freq = rope_inv_freq(cfg, device)
    angles = torch.arange(t, device=device, dtype=torch.int64).float()[:, None] * inv_freq[None, :]  # (T, Q/2)
    emb = torch.cat((angles, angles), dim=-1)  # (T, Q)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x * cos + rotate_half(x) * sin for x (B, heads, T, Q), with rotate_half([a, b]) = [-b, a]."""
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), dim=-1) * sin


# ----- the attention kernel ------------------------------------------------------------------------------------------


def attention_kernel(
    head_dim: int, dtype: torch.dtype, device: torch.device | str, n_rep: int = 1, enable_gqa: bool = False
) -> str:
    """The SDPA kernel PyTorch picks for growlm's causal attention (no attention mask, no dropout) at this head size
    Q, dtype and device: "flash", "efficient" (memory-efficient), or "math" (the unfused reference, which keeps the
    (T, T) score matrix). Probed in the dispatcher's order (flash, efficient, math; cuDNN comes after math) with one
    call per kernel allowed alone: queries (1, n_rep, 8, Q) and one key/value head shared with ``enable_gqa`` when
    it is set (grouped-query attention with n_rep = H / K query heads per key/value head that passes the flag), else
    keys and values of the queries' shape.

    On CUDA in bf16/fp16 with Q <= 256 it is "flash" (FlashAttention-2, Dao 2023, arXiv 2307.08691); "math" there
    means a head size or dtype the fused kernels refuse, and attention memory then grows as T^2.
    """
    q = torch.zeros(1, n_rep, 8, head_dim, dtype=dtype, device=device)
    kv = q[:, :1] if enable_gqa else q
    order = (
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
        ("math", SDPBackend.MATH),
    )
    for name, backend in order:
        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=enable_gqa)
            return name
        except RuntimeError:
            continue
    return "none"


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


def grouped_kv(k: Tensor, v: Tensor, n_rep: int, *, native: bool) -> tuple[Tensor, Tensor, bool]:
    """Keys and values (B, K, T, Q) as SDPA takes them, and its ``enable_gqa`` flag: unchanged with the flag set
    when ``native`` (and n_rep > 1), else each key/value head repeated n_rep times in place, (B, K * n_rep, T, Q),
    so query head h meets key/value head h // n_rep either way (transformers' ``repeat_kv``)."""
    if n_rep == 1:
        return k, v, False
    if native:
        return k, v, True
    return k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1), False


def causal_attention(q: Tensor, k: Tensor, v: Tensor, dropout: float) -> Tensor:
    """Causal SDPA of queries (B, H, T, Q) over keys and values (B, K, T, Q), K dividing H (query head h reads
    key/value head h // (H / K)), with the kernel choice of ``flash_takes_gqa``. Returns (B, H, T, Q)."""
    k, v, gqa = grouped_kv(k, v, q.shape[1] // k.shape[1], native=flash_takes_gqa(q.device, q.dtype, q.shape[-1]))
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, enable_gqa=gqa)
