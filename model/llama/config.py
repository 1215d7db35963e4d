"""The Llama family's shape (``LlamaConfig``), its presets and what follows from a shape: parameter count, matmul
weights, the largest parameter, the shape a growth targets, and where a grown model's old query heads sit.

Symbols: V vocab, L n_layer, d n_embd, H n_head, K n_kv_head (key/value heads), g = H / K, Q head_dim, F n_inner,
P n_positions.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, ClassVar

import torch
from torch import Tensor


def default_llama_inner(n_embd: int) -> int:
    """The SwiGLU FFN width used when n_inner is not given: 8 d / 3 (the FFN of 4 d re-sized so that its three
    matrices hold as many weights as GPT-2's two; Shazeer 2020, arXiv 2002.05202, section 2), rounded up to a
    multiple of 64."""
    return 64 * math.ceil(8 * n_embd / 3 / 64)


ROPE_TYPES = ("default", "linear", "llama3")  # the rotary scalings growlm computes (model.layers.rope_inv_freq)


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of a Llama-family model: pre-norm RMSNorm without biases, SwiGLU FFN, rotary positions and grouped-query
    attention (Touvron et al. 2023, arXiv 2302.13971; GQA: Ainslie et al. 2023, arXiv 2305.13245).

    Field names follow growlm's GPT-2 names; ``transformers.LlamaConfig``'s are given beside each. ``head_dim`` and
    ``n_inner`` are stored resolved (None at construction means n_embd // n_head and ``default_llama_inner``), so a
    growth that keeps them keeps them exactly. Query head h reads key/value head h // (n_head // n_kv_head), as in
    transformers' ``repeat_kv``. Frozen: a growth makes a new config.

    Raises:
        ValueError: a size is not positive, n_head is not a multiple of n_kv_head, head_dim is odd (rotary
            embeddings rotate pairs), or dropout is outside [0, 1).
    """

    arch: ClassVar[str] = "llama"
    embedding_name: ClassVar[str] = "model.embed_tokens.weight"  # the token embedding (and a tied LM head)
    qkv_bias: ClassVar[bool] = False  # q_proj, k_proj and v_proj carry biases (Qwen 2: model/qwen2)
    grown_dims: ClassVar[tuple[tuple[str, str], ...]] = (
        ("n_layer", "n_layer"), ("n_embd", "n_embd"), ("n_head", "n_head"), ("ffn_dim", "n_inner (FFN width)"),
        ("n_kv_head", "n_kv_head"),
    )  # fmt: skip
    # fields a growth keeps (head_dim first: RoPE's frequencies theta_i = rope_theta^(-2i/Q) depend on it)
    kept_fields: ClassVar[tuple[str, ...]] = (
        "head_dim", "vocab_size", "n_positions", "rope_theta", "rms_norm_eps", "tie_word_embeddings", "rope_type",
        "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_positions",
    )  # fmt: skip

    n_layer: int = 22  # L, num_hidden_layers
    n_embd: int = 2048  # d, hidden_size
    n_head: int = 32  # H, num_attention_heads
    n_kv_head: int = 4  # K, num_key_value_heads; K = H is multi-head attention, K = 1 multi-query
    n_inner: int | None = None  # F, intermediate_size (SwiGLU units); None: default_llama_inner(d)
    head_dim: int | None = None  # Q, head_dim; None: d // H
    n_positions: int = 2048  # P, max_position_embeddings (rotary: no position parameters)
    vocab_size: int = 32000  # V
    rope_theta: float = 10000.0  # rotary base (Su et al. 2021, arXiv 2104.09864, eq. 15: theta_i = base^(-2i/Q))
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False  # lm_head shares embed_tokens' weight
    dropout: float = 0.0  # attention-probability dropout (attention_dropout); Llama has no other dropout
    # rotary scaling (rope_scaling / rope_parameters): "default" (none), "linear" (every frequency / factor) or
    # "llama3" (Llama 3.1's: long wavelengths / factor, short ones kept, a smooth blend between;
    # model.layers.rope_inv_freq)
    rope_type: str = "default"
    rope_factor: float = 1.0  # factor
    rope_low_freq_factor: float = 1.0  # low_freq_factor (llama3)
    rope_high_freq_factor: float = 4.0  # high_freq_factor (llama3)
    rope_original_positions: int = 8192  # original_max_position_embeddings (llama3): the context pretrained at

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_embd", "n_head", "n_kv_head", "n_positions", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if self.n_inner is None:
            object.__setattr__(self, "n_inner", default_llama_inner(self.n_embd))
        if self.head_dim is None:
            if self.n_embd % self.n_head:
                raise ValueError(
                    f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; set head_dim, or choose n_head "
                    f"among {[h for h in range(1, self.n_embd + 1) if self.n_embd % h == 0][:12]}..."
                )
            object.__setattr__(self, "head_dim", self.n_embd // self.n_head)
        for name in ("n_inner", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name}={value!r} must be a positive integer or None")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even (rotary embeddings rotate pairs of dims)")
        if self.n_head % self.n_kv_head:
            raise ValueError(
                f"n_head={self.n_head} is not a multiple of n_kv_head={self.n_kv_head}; every key/value head serves "
                f"the same number of query heads: choose n_kv_head among "
                f"{[k for k in range(1, self.n_head + 1) if self.n_head % k == 0]}"
            )
        for name in ("rope_theta", "rms_norm_eps", "dropout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                hint = " (YAML reads a number such as 5e5 without a decimal point as text: write 5.0e+5)"
                raise ValueError(f"{name}={value!r} must be a number" + (hint if isinstance(value, str) else ""))
        if not self.rope_theta > 0 or not self.rms_norm_eps > 0:
            raise ValueError(f"rope_theta={self.rope_theta} and rms_norm_eps={self.rms_norm_eps} must be positive")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout} must be in [0, 1)")
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(
                f"rope_type={self.rope_type!r}: growlm computes {', '.join(map(repr, ROPE_TYPES))} rotary embeddings"
            )
        for name in ("rope_factor", "rope_low_freq_factor", "rope_high_freq_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name}={value!r} must be a positive number")
        if self.rope_type == "llama3" and not self.rope_high_freq_factor > self.rope_low_freq_factor:
            raise ValueError(
                f"rope_high_freq_factor={self.rope_high_freq_factor} must exceed rope_low_freq_factor="
                f"{self.rope_low_freq_factor} (llama3 rotary scaling blends between them)"
            )
        if not isinstance(self.rope_original_positions, int) or self.rope_original_positions <= 0:
            raise ValueError(f"rope_original_positions={self.rope_original_positions!r} must be a positive integer")

    @property
    def ffn_dim(self) -> int:
        """F, the SwiGLU width (n_inner)."""
        return self.n_inner

    @property
    def group_size(self) -> int:
        """Query heads per key/value head, H // K."""
        return self.n_head // self.n_kv_head

    @property
    def tied_head(self) -> bool:
        """Whether the LM head is the token embedding (``tie_word_embeddings``)."""
        return self.tie_word_embeddings

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict with the family's ``"arch"`` (``config_from_dict`` reads it back)."""
        return {"arch": self.arch, **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Any:
        """Inverse of to_dict (an ``arch`` key, if present, must be the class's).

        Raises:
            ValueError: unknown fields, or another arch.
        """
        d = dict(d)
        arch = d.pop("arch", cls.arch)
        if arch != cls.arch:
            raise ValueError(f"config is for arch {arch!r}, not {cls.arch!r}")
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown {cls.__name__} fields {sorted(unknown)}; known fields are {sorted(known)}")
        return cls(**d)

    def shape_str(self) -> str:
        """Short human-readable shape with every field that changes the function (all but dropout), e.g.
        'llama L=22 d=2048 H=32 K=4 Q=64 F=5632 P=2048 V=32000 untied theta=1e4 eps=1e-5'."""
        c = self
        return (
            f"{c.arch} L={c.n_layer} d={c.n_embd} H={c.n_head} K={c.n_kv_head} Q={c.head_dim} F={c.ffn_dim} "
            f"P={c.n_positions} V={c.vocab_size} {'tied' if c.tie_word_embeddings else 'untied'} "
            f"theta={_short(c.rope_theta)} eps={_short(c.rms_norm_eps)}"
            + ("" if c.rope_type == "default" else f" rope={c.rope_type}x{c.rope_factor:g}")
        )

    @classmethod
    def preset_overrides(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        """``overrides`` of a preset as ``replace`` takes them: None values dropped; a changed n_embd or n_head
        re-derives head_dim (d // H) unless head_dim is given, and a changed n_embd re-derives n_inner
        (``default_llama_inner``) unless n_inner is given."""
        overrides = {k: v for k, v in overrides.items() if v is not None}
        if {"n_embd", "n_head"} & set(overrides) and "head_dim" not in overrides:
            overrides["head_dim"] = None
        if "n_embd" in overrides and "n_inner" not in overrides:
            overrides["n_inner"] = None
        return overrides

    def grown(self, changes: dict[str, Any]) -> Any:
        """The shape a growth targets when only ``changes`` are given (None values ignored), scaled as GPT-2's
        is rather than leaving parts behind (``model.config.grown_shape``):

        - ``n_inner`` scales with n_embd (x d'/d, rounded), e.g. 128 -> 256 at width x2;
        - ``n_kv_head`` keeps the query heads per key/value head (n_head / n_kv_head) when n_head changes, e.g.
          4 / 2 -> 8 / 4;
        - ``head_dim`` stays when n_head is given (more heads of the same size), and scales with n_embd when only
          n_embd is (as many heads, each wider: GPT-2's d // H).
        """
        changes = {k: v for k, v in changes.items() if v is not None}
        d_old, d_new = self.n_embd, changes.get("n_embd", self.n_embd)
        if "n_inner" not in changes and d_new != d_old:
            changes["n_inner"] = max(1, round(self.n_inner * d_new / d_old))
        h_new = changes.get("n_head", self.n_head)
        if "n_kv_head" not in changes and h_new != self.n_head and h_new % self.group_size == 0:
            changes["n_kv_head"] = h_new // self.group_size
        if "head_dim" not in changes and "n_head" not in changes and d_new != d_old:
            changes["head_dim"] = max(2, round(self.head_dim * d_new / d_old))
        return replace(self, **changes)

    def param_count(self, *, include_position_embeddings: bool = True) -> int:
        """Trainable parameters (a tied LM head counted once). Per block: two RMSNorm gains 2d, q_proj d*H*Q, k_proj
        and v_proj d*K*Q each (with ``qkv_bias``, their biases H*Q + 2*K*Q), o_proj H*Q*d, gate_proj, up_proj and
        down_proj d*F each; plus embed_tokens V*d, the final norm d and an untied lm_head V*d. Rotary positions have
        no parameters (``include_position_embeddings`` changes nothing)."""
        d, f = self.n_embd, self.ffn_dim
        q, k = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        block = 2 * d + d * q + 2 * d * k + q * d + 3 * d * f + ((q + 2 * k) if self.qkv_bias else 0)
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.n_layer * block + self.vocab_size * d + d + head

    def matmul_params(self) -> int:
        """The parameters that take part in a matmul: all but an untied embed_tokens (a lookup; the untied lm_head
        is the matmul), so GQA's smaller k_proj and v_proj and SwiGLU's three matrices enter as they are."""
        return self.param_count() - (0 if self.tie_word_embeddings else self.vocab_size * self.n_embd)

    def largest_param_numel(self) -> int:
        """Elements of the largest parameter: the embedding (and untied head) V*d, q_proj / o_proj d*H*Q, or a
        SwiGLU matrix d*F."""
        d = self.n_embd
        return max(self.vocab_size * d, d * self.n_head * self.head_dim, d * self.ffn_dim)

    def mask_problems(self, old_n_head: int, old_head_dim: int, old_n_kv_head: int | None) -> list[str]:
        """What in a growth-mask spec's old attention shape does not fit this (grown) shape (``MaskSpec.check``):
        no old key/value head count, an old group that would split (``llama_head_index``), another head_dim."""
        if old_n_kv_head is None:
            return [f"old_n_kv_head is not set: a {self.arch} mask spec needs it"]
        problems = []
        try:
            llama_head_index(old_n_head, old_n_kv_head, self.n_head, self.n_kv_head)
        except ValueError as e:
            problems.append(str(e))
        if old_head_dim != self.head_dim:
            problems.append(f"old head_dim {old_head_dim} != {self.head_dim}")
        return problems

    def old_attention_units(self, old_n_head: int, old_head_dim: int, old_n_kv_head: int | None) -> Tensor | None:
        """Positions (int64, (H Q,)) of the old query heads' output units in this grown model (each old head at
        ``llama_head_index``), or None when the query heads did not grow."""
        if self.n_head == old_n_head:
            return None
        heads = llama_head_index(old_n_head, old_n_kv_head, self.n_head, self.n_kv_head)
        return (heads[:, None] * self.head_dim + torch.arange(self.head_dim)[None, :]).flatten()


def llama_head_index(n_head: int, n_kv_head: int, new_n_head: int, new_n_kv_head: int) -> Tensor:
    """Positions (int64, (H,)) of a Llama model's old query heads among the grown model's H' heads, so that each
    keeps its key/value head: old head h of group j = h // g, slot s = h % g (g = H / K) goes to j * g' + s
    (g' = H' / K'); old key/value head j stays at j. Query head p reads key/value head p // g' (transformers'
    ``repeat_kv``), so old head h still reads j, and every new key/value head serves only new query heads.

    Raises:
        ValueError: K' < K or g' < g (an old group would have to split).
    """
    g, g_new = n_head // n_kv_head, new_n_head // new_n_kv_head
    if new_n_kv_head < n_kv_head or g_new < g:
        raise ValueError(
            f"heads {n_head} (kv {n_kv_head}, {g} per group) cannot grow to {new_n_head} (kv {new_n_kv_head}, "
            f"{g_new} per group) keeping each query head's key/value head: need n_kv_head >= {n_kv_head} and "
            f"n_head / n_kv_head >= {g}"
        )
    h = torch.arange(n_head)
    return (h // g) * g_new + h % g


def _short(x: float) -> str:
    """``x`` in short scientific notation with every significant digit: 10000.0 -> '1e4', 2.5e-06 -> '2.5e-6'."""
    mantissa, exponent = f"{x:.15e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


PRESETS: dict[str, LlamaConfig] = {
    # tests and the CPU main job: GQA with 2 query heads per key/value head, untied embeddings
    "llama-tiny": LlamaConfig(n_layer=2, n_embd=64, n_head=4, n_kv_head=2, n_inner=128, n_positions=128),
    "llama-cpu-small": LlamaConfig(n_layer=4, n_embd=128, n_head=4, n_kv_head=2, n_inner=352, n_positions=256),
    # released shapes (their config.json files): SmolLM (Allal et al. 2024) and TinyLlama (Zhang et al. 2024,
    # arXiv 2401.02385)
    "smollm-135m": LlamaConfig(
        n_layer=30, n_embd=576, n_head=9, n_kv_head=3, n_inner=1536, n_positions=2048, vocab_size=49152,
        tie_word_embeddings=True,
    ),
    "smollm-360m": LlamaConfig(
        n_layer=32, n_embd=960, n_head=15, n_kv_head=5, n_inner=2560, n_positions=2048, vocab_size=49152,
        tie_word_embeddings=True,
    ),
    "tinyllama-1.1b": LlamaConfig(
        n_layer=22, n_embd=2048, n_head=32, n_kv_head=4, n_inner=5632, n_positions=2048, vocab_size=32000,
    ),
    # Meta's Llama 3.1 / 3.2 releases (their config.json files): 128,256-token vocabulary, rope_theta 500,000,
    # "llama3" rotary scaling from an 8,192-token pretraining context to 131,072 positions
    "llama-3.2-1b": LlamaConfig(
        n_layer=16, n_embd=2048, n_head=32, n_kv_head=8, n_inner=8192, head_dim=64, n_positions=131072,
        vocab_size=128256, rope_theta=500000.0, tie_word_embeddings=True, rope_type="llama3", rope_factor=32.0,
    ),
    "llama-3.2-3b": LlamaConfig(
        n_layer=28, n_embd=3072, n_head=24, n_kv_head=8, n_inner=8192, head_dim=128, n_positions=131072,
        vocab_size=128256, rope_theta=500000.0, tie_word_embeddings=True, rope_type="llama3", rope_factor=32.0,
    ),
    "llama-3.1-8b": LlamaConfig(
        n_layer=32, n_embd=4096, n_head=32, n_kv_head=8, n_inner=14336, head_dim=128, n_positions=131072,
        vocab_size=128256, rope_theta=500000.0, rope_type="llama3", rope_factor=8.0,
    ),
}  # fmt: skip
