"""The Qwen 2 family's shape (``Qwen2Config``; Qwen 2 and 2.5, Yang et al. 2024, arXiv 2407.10671): a Llama shape
whose q_proj, k_proj and v_proj carry biases (o_proj and the FFN do not), with Qwen's defaults (rotary base 1e6,
RMSNorm epsilon 1e-6), and the released shapes as presets. Everything else a shape implies (parameter count with
the biases, growth shapes, where old heads sit) is the Llama family's (model/llama/config.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from growlm.model.llama.config import LlamaConfig


@dataclass(frozen=True)
class Qwen2Config(LlamaConfig):
    """Shape of a Qwen 2 / 2.5 model: ``LlamaConfig``'s fields (names beside transformers' ``Qwen2Config`` there)
    with q/k/v biases; the defaults are Qwen2.5-0.5B's. Sliding-window attention (``use_sliding_window``, off in
    every released Qwen 2.5 config) is not implemented: ``model.qwen2.hf`` refuses it.

    Raises:
        ValueError: as ``LlamaConfig``.
    """

    arch: ClassVar[str] = "qwen2"
    qkv_bias: ClassVar[bool] = True

    n_layer: int = 24
    n_embd: int = 896
    n_head: int = 14
    n_kv_head: int = 2
    n_inner: int | None = 4864
    n_positions: int = 32768
    vocab_size: int = 151936
    rope_theta: float = 1000000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True


PRESETS: dict[str, Qwen2Config] = {
    # tests: GQA with 2 query heads per key/value head, tied, Qwen's rotary base
    "qwen2-tiny": Qwen2Config(n_layer=2, n_embd=64, n_head=4, n_kv_head=2, n_inner=128, n_positions=128,
                              vocab_size=50257),
    # Qwen's releases (their config.json files): 151,936-token vocabulary, rope_theta 1e6, tied embeddings
    "qwen2.5-0.5b": Qwen2Config(),
    "qwen2.5-1.5b": Qwen2Config(n_layer=28, n_embd=1536, n_head=12, n_kv_head=2, n_inner=8960, n_positions=131072),
}  # fmt: skip
