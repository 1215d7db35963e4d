"""Model shapes of the two families (GPTConfig: GPT-2; LlamaConfig: Llama), named presets, parameter counts and
FLOPs per token.

Shape symbols used across growlm: B batch, T tokens in a sequence, V vocab, L n_layer, d n_embd, H n_head,
Q head dim (d // H for GPT-2; Llama may set it), F n_inner (FFN width), P n_positions, K n_kv_head (Llama's
key/value heads; GPT-2 has K = H).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, ClassVar, TypeAlias


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a GPT-2 style model. Field names follow ``transformers.GPT2Config``.

    Frozen: a growth makes a new config and never edits the old one.

    Raises:
        ValueError: a field is not positive, n_embd is not divisible by n_head, or a dropout is outside [0, 1).
    """

    arch: ClassVar[str] = "gpt2"  # the model family (not a field: GPT-2 configs saved before Llama lack it)

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


def default_llama_inner(n_embd: int) -> int:
    """The SwiGLU FFN width used when n_inner is not given: 8 d / 3 (the FFN of 4 d re-sized so that its three
    matrices hold as many weights as GPT-2's two; Shazeer 2020, arXiv 2002.05202, section 2), rounded up to a
    multiple of 64."""
    return 64 * math.ceil(8 * n_embd / 3 / 64)


ROPE_TYPES = ("default", "linear", "llama3")  # the rotary scalings growlm's Llama computes (model.llama)


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
    # model.llama.rope_inv_freq)
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

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict with ``"arch": "llama"`` (``config_from_dict`` reads it back)."""
        return {"arch": self.arch, **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LlamaConfig:
        """Inverse of to_dict (an ``arch`` key, if present, must be "llama").

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
            raise ValueError(f"unknown LlamaConfig fields {sorted(unknown)}; known fields are {sorted(known)}")
        return cls(**d)

    def shape_str(self) -> str:
        """Short human-readable shape with every field that changes the function (all but dropout), e.g.
        'llama L=22 d=2048 H=32 K=4 Q=64 F=5632 P=2048 V=32000 untied theta=1e4 eps=1e-5'."""
        c = self
        return (
            f"llama L={c.n_layer} d={c.n_embd} H={c.n_head} K={c.n_kv_head} Q={c.head_dim} F={c.ffn_dim} "
            f"P={c.n_positions} V={c.vocab_size} {'tied' if c.tie_word_embeddings else 'untied'} "
            f"theta={_short(c.rope_theta)} eps={_short(c.rms_norm_eps)}"
            + ("" if c.rope_type == "default" else f" rope={c.rope_type}x{c.rope_factor:g}")
        )


def _short(x: float) -> str:
    """``x`` in short scientific notation with every significant digit: 10000.0 -> '1e4', 2.5e-06 -> '2.5e-6'."""
    mantissa, exponent = f"{x:.15e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


ModelConfig: TypeAlias = GPTConfig | LlamaConfig
CONFIG_CLASSES: dict[str, type] = {"gpt2": GPTConfig, "llama": LlamaConfig}


def config_from_dict(d: dict[str, Any]) -> ModelConfig:
    """The config a ``to_dict`` wrote, of either family: ``"arch": "llama"`` gives a LlamaConfig, no arch (or
    "gpt2") a GPTConfig.

    Raises:
        ValueError: an unknown arch or unknown fields.
    """
    arch = d.get("arch", "gpt2")
    if arch not in CONFIG_CLASSES:
        raise ValueError(f"unknown model arch {arch!r}; growlm builds {sorted(CONFIG_CLASSES)}")
    if arch == "gpt2":
        return GPTConfig.from_dict({k: v for k, v in d.items() if k != "arch"})
    return LlamaConfig.from_dict(d)


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


PRESETS: dict[str, ModelConfig] = {
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
    # Llama family. Tests and the CPU main job: GQA with 2 query heads per key/value head, untied embeddings
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


def from_preset(name: str, **overrides: Any) -> ModelConfig:
    """A named preset with some fields replaced, e.g. ``from_preset("gpt2", n_layer=6)``.

    Overrides whose value is None are ignored, except ``n_inner`` (None there means 4 * n_embd), so CLI
    arguments can be passed straight through. For a Llama preset, a changed n_embd or n_head re-derives head_dim
    (d // H) unless head_dim is given, and a changed n_embd re-derives n_inner (``default_llama_inner``) unless
    n_inner is given.

    Raises:
        ValueError: unknown preset name, a field the preset's family does not have, or the resulting shape is
            invalid.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; use one of: {', '.join(PRESETS)}")
    base = PRESETS[name]
    known = {f.name for f in fields(base)}
    unknown = set(overrides) - known
    if unknown:
        raise ValueError(
            f"unknown {type(base).__name__} fields {sorted(unknown)} for preset {name!r}; known fields are "
            f"{sorted(known)}"
        )
    keep_none = {"n_inner"} if base.arch == "gpt2" else set()
    overrides = {k: v for k, v in overrides.items() if v is not None or k in keep_none}
    if base.arch == "llama":
        if {"n_embd", "n_head"} & set(overrides) and "head_dim" not in overrides:
            overrides["head_dim"] = None
        if "n_embd" in overrides and "n_inner" not in overrides:
            overrides["n_inner"] = None
    return replace(base, **overrides)


def grown_shape(base: ModelConfig, changes: dict[str, Any]) -> ModelConfig:
    """The shape a growth of ``base`` targets when only ``changes`` are given (a plan's target mapping, growlm-grow's
    shape flags): the fields given are taken as they are, and the ones that follow the width follow it unless given.
    GPT-2: n_inner None means 4 x n_embd, head_dim is d // H. Llama, so that a width growth scales the model as
    GPT-2's does rather than leaving parts of it behind:

    - ``n_inner`` scales with n_embd (x d'/d, rounded), e.g. 128 -> 256 at width x2;
    - ``n_kv_head`` keeps the query heads per key/value head (n_head / n_kv_head) when n_head changes, e.g. 4 / 2 ->
      8 / 4;
    - ``head_dim`` stays when n_head is given (more heads of the same size), and scales with n_embd when only n_embd
      is (as many heads, each wider: GPT-2's d // H).

    Raises:
        ValueError: the resulting shape is invalid (e.g. a width that the head count does not divide).
    """
    changes = {k: v for k, v in changes.items() if v is not None}
    if base.arch != "llama":
        return replace(base, **changes)
    d_old, d_new = base.n_embd, changes.get("n_embd", base.n_embd)
    if "n_inner" not in changes and d_new != d_old:
        changes["n_inner"] = max(1, round(base.n_inner * d_new / d_old))
    h_new = changes.get("n_head", base.n_head)
    if "n_kv_head" not in changes and h_new != base.n_head and h_new % (base.n_head // base.n_kv_head) == 0:
        changes["n_kv_head"] = h_new // (base.n_head // base.n_kv_head)
    if "head_dim" not in changes and "n_head" not in changes and d_new != d_old:
        changes["head_dim"] = max(2, round(base.head_dim * d_new / d_old))
    return replace(base, **changes)


def largest_param_numel(cfg: ModelConfig) -> int:
    """Elements of the model's largest parameter. GPT-2: the token embedding V*d, the position embedding P*d, a
    block's c_attn d*3d or its c_fc / mlp c_proj d*F. Llama: the embedding (and untied head) V*d, q_proj / o_proj
    d*H*Q, or a SwiGLU matrix d*F."""
    d = cfg.n_embd
    if cfg.arch == "llama":
        return max(cfg.vocab_size * d, d * cfg.n_head * cfg.head_dim, d * cfg.ffn_dim)
    return max(cfg.vocab_size * d, cfg.n_positions * d, 3 * d * d, d * cfg.ffn_dim)


def param_count(cfg: ModelConfig, *, include_position_embeddings: bool = True) -> int:
    """Number of trainable parameters (a tied LM head counted once, as in ``GPT2LMHeadModel``).

    GPT-2, per block: ln_1 2d, c_attn d*3d + 3d, attn c_proj d*d + d, ln_2 2d, c_fc d*F + F, mlp c_proj F*d + d;
    plus wte V*d, wpe P*d (when ``include_position_embeddings``), ln_f 2d.
    Llama, per block: two RMSNorm gains 2d, q_proj d*H*Q, k_proj and v_proj d*K*Q each, o_proj H*Q*d, gate_proj,
    up_proj and down_proj d*F each; plus embed_tokens V*d, the final norm d and an untied lm_head V*d (rotary
    positions have no parameters).
    """
    d, f = cfg.n_embd, cfg.ffn_dim
    if cfg.arch == "llama":
        q, k = cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim
        block = 2 * d + d * q + 2 * d * k + q * d + 3 * d * f
        head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * d
        return cfg.n_layer * block + cfg.vocab_size * d + d + head
    block = 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + 2 * d + (d * f + f) + (f * d + d)
    n = cfg.n_layer * block + cfg.vocab_size * d + 2 * d
    if include_position_embeddings:
        n += cfg.n_positions * d
    return n


def flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Training FLOPs per token (forward + backward, no activation recomputation): 6 N + 12 L H Q T.

    N counts every weight that takes part in a matmul. GPT-2: all parameters except the position embeddings
    (which are only added), with the tied embedding counted once because it is the LM head's matmul. Llama: all
    parameters except an untied embed_tokens (a lookup; the untied lm_head is the matmul), so GQA's smaller k_proj
    and v_proj (d*K*Q) and SwiGLU's three matrices (3 d F) enter as they are. The attention term 12 L H Q T covers
    QK^T and AV for a causal sequence of T tokens over the H query heads (GQA shares keys and values between
    heads but computes every head's scores), as in PaLM (Chowdhery et al. 2022, arXiv 2204.02311, appendix B) and
    nanoGPT's ``estimate_mfu``. Units: FLOPs per token.

    Raises:
        ValueError: seq_len is not in [1, n_positions].
    """
    if not 1 <= seq_len <= cfg.n_positions:
        raise ValueError(f"seq_len={seq_len} must be in [1, n_positions={cfg.n_positions}]")
    if cfg.arch == "llama":
        n = param_count(cfg) - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.n_embd)
    else:
        n = param_count(cfg, include_position_embeddings=False)
    return 6 * n + 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * seq_len
