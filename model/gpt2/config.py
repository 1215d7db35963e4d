"""The GPT-2 family's shape (``GPTConfig``), its presets and what follows from a shape: parameter count, matmul
weights, the largest parameter, the shape a growth targets, and which attention units of a grown model are new.

Shape symbols used across growlm: B batch, T tokens in a sequence, V vocab, L n_layer, d n_embd, H n_head,
Q head dim (d // H), F n_inner (FFN width), P n_positions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, ClassVar

import torch
from torch import Tensor


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a GPT-2 style model. Field names follow ``transformers.GPT2Config``.

    Frozen: a growth makes a new config and never edits the old one.

    Raises:
        ValueError: a field is not positive, n_embd is not divisible by n_head, or a dropout is outside [0, 1).
    """

    arch: ClassVar[str] = "gpt2"  # the model family (not a field: GPT-2 configs saved before Llama lack it)
    embedding_name: ClassVar[str] = "transformer.wte.weight"  # the token embedding (and the tied LM head)
    tied_head: ClassVar[bool] = True  # the LM head is the token embedding
    # dimensions a growth may only grow (field or property, label) and fields it keeps
    grown_dims: ClassVar[tuple[tuple[str, str], ...]] = (
        ("n_layer", "n_layer"), ("n_embd", "n_embd"), ("n_head", "n_head"), ("ffn_dim", "n_inner (FFN width)"),
    )  # fmt: skip
    kept_fields: ClassVar[tuple[str, ...]] = ("vocab_size", "n_positions")

    n_layer: int = 12  # L, transformer blocks
    n_embd: int = 768  # d, width of the residual stream
    n_head: int = 12  # H, attention heads; head dim Q = d // H
    n_inner: int | None = None  # F, FFN width; None means 4 * d
    n_positions: int = 1024  # P, longest context (learned position embeddings)
    vocab_size: int = 50257  # V, GPT-2 BPE
    dropout: float = 0.0  # embedding, attention-probability and residual dropout (HF embd/attn/resid_pdrop)
    layer_norm_epsilon: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_embd", "n_head", "n_positions", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if self.n_inner is not None and (not isinstance(self.n_inner, int) or self.n_inner <= 0):
            raise ValueError(f"n_inner={self.n_inner!r} must be a positive integer or None (meaning 4 * n_embd)")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; "
                f"choose n_head among {[h for h in range(1, self.n_embd + 1) if self.n_embd % h == 0][:12]}..."
                " or change n_embd"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout} must be in [0, 1)")

    @property
    def head_dim(self) -> int:
        """Q = n_embd // n_head."""
        return self.n_embd // self.n_head

    @property
    def ffn_dim(self) -> int:
        """F, the FFN width actually used (n_inner, or 4 * n_embd when n_inner is None)."""
        return self.n_inner if self.n_inner is not None else 4 * self.n_embd

    @property
    def n_kv_head(self) -> int:
        """K, key/value heads: GPT-2 has one per query head."""
        return self.n_head

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-safe), e.g. for checkpoints' client state."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GPTConfig:
        """Inverse of to_dict.

        Raises:
            ValueError: the dict has keys GPTConfig does not know (e.g. a config from another program).
        """
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown GPTConfig fields {sorted(unknown)}; known fields are {sorted(known)}")
        return cls(**d)

    def shape_str(self) -> str:
        """Short human-readable shape, e.g. 'L=12 d=768 H=12 F=3072 P=1024 V=50257'."""
        c = self
        return f"L={c.n_layer} d={c.n_embd} H={c.n_head} F={c.ffn_dim} P={c.n_positions} V={c.vocab_size}"

    @classmethod
    def preset_overrides(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        """``overrides`` of a preset as ``replace`` takes them: None values dropped, except ``n_inner`` (None there
        means 4 * n_embd), so CLI arguments can be passed straight through."""
        return {k: v for k, v in overrides.items() if v is not None or k == "n_inner"}

    def grown(self, changes: dict[str, Any]) -> GPTConfig:
        """The shape a growth targets when only ``changes`` are given (None values ignored): n_inner None stays
        4 x n_embd, the head dim is d // H (``model.config.grown_shape``)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def param_count(self, *, include_position_embeddings: bool = True) -> int:
        """Trainable parameters (the tied LM head counted once, as in ``GPT2LMHeadModel``). Per block: ln_1 2d,
        c_attn d*3d + 3d, attn c_proj d*d + d, ln_2 2d, c_fc d*F + F, mlp c_proj F*d + d; plus wte V*d, wpe P*d
        (when ``include_position_embeddings``), ln_f 2d."""
        d, f = self.n_embd, self.ffn_dim
        block = 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + 2 * d + (d * f + f) + (f * d + d)
        n = self.n_layer * block + self.vocab_size * d + 2 * d
        return n + (self.n_positions * d if include_position_embeddings else 0)

    def matmul_params(self) -> int:
        """The parameters that take part in a matmul: all but the position embeddings (only added); the tied
        embedding counted once, as the LM head's matmul."""
        return self.param_count(include_position_embeddings=False)

    def largest_param_numel(self) -> int:
        """Elements of the largest parameter: wte V*d, wpe P*d, a block's c_attn d*3d or c_fc / mlp c_proj d*F."""
        d = self.n_embd
        return max(self.vocab_size * d, self.n_positions * d, 3 * d * d, d * self.ffn_dim)

    def mask_problems(self, old_n_head: int, old_head_dim: int, old_n_kv_head: int | None) -> list[str]:
        """What in a growth-mask spec's old attention shape does not fit this (grown) shape (``MaskSpec.check``)."""
        return [] if old_n_kv_head is None else [f"old_n_kv_head={old_n_kv_head}: a GPT-2 has no key/value heads"]

    def old_attention_units(self, old_n_head: int, old_head_dim: int, old_n_kv_head: int | None) -> Tensor | None:
        """Positions (int64, (H Q,)) of the old model's q/k/v units in this grown model's attention layout (head
        h, dim r -> h Q' + r: ``attn_index``), or None when the attention did not grow."""
        if (self.n_head, self.head_dim) == (old_n_head, old_head_dim):
            return None
        return attn_index(old_n_head, old_head_dim, self.head_dim)


def attn_index(n_head: int, head_dim: int, new_head_dim: int) -> Tensor:
    """Positions (int64, (H*Q,)) of the old attention units in a layout with head dim Q' >= Q: h*Q + r -> h*Q' + r."""
    return (torch.arange(n_head)[:, None] * new_head_dim + torch.arange(head_dim)[None, :]).flatten()


def _staged_presets() -> dict[str, GPTConfig]:
    """Staged-training shapes (Shen et al. 2022, arXiv 2203.06211, section 5): GPT2_base 12x768 and
    GPT2_large 24x1536, with head dim 96 so that every width fraction has a whole number of heads, and their
    1/2 and 1/4 width and depth variants, e.g. GPT2_large_div2_width (24 x 768), GPT2_base_div4_depth (3 x 768)."""
    out = {}
    for base, (n_layer, n_embd) in {"base": (12, 768), "large": (24, 1536)}.items():
        for wdiv in (1, 2, 4):
            for ddiv in (1, 2, 4):
                name = (
                    f"GPT2_{base}"
                    + (f"_div{wdiv}_width" if wdiv > 1 else "")
                    + (f"_div{ddiv}_depth" if ddiv > 1 else "")
                )
                d = n_embd // wdiv
                out[name] = GPTConfig(n_layer=n_layer // ddiv, n_embd=d, n_head=d // 96)
    return out


PRESETS: dict[str, GPTConfig] = {
    # tests: a forward + backward in milliseconds on one CPU core
    "tiny": GPTConfig(n_layer=2, n_embd=64, n_head=4, n_positions=128),
    # the main job on a 2-core CPU (README quick start): ~7.2M parameters, 6.4M of them the tied embedding
    "cpu-small": GPTConfig(n_layer=4, n_embd=128, n_head=4, n_positions=256),
    "cpu-medium": GPTConfig(n_layer=6, n_embd=256, n_head=8, n_positions=256),
    # OpenAI GPT-2 shapes (Radford et al. 2019), head dim 64
    "gpt2": GPTConfig(n_layer=12, n_embd=768, n_head=12),
    "gpt2-medium": GPTConfig(n_layer=24, n_embd=1024, n_head=16),
    "gpt2-large": GPTConfig(n_layer=36, n_embd=1280, n_head=20),
    "gpt2-xl": GPTConfig(n_layer=48, n_embd=1600, n_head=25),
    **_staged_presets(),
}
