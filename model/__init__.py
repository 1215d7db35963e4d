"""The growth-aware models, one folder per family (gpt2/, llama/, qwen2/: config, module, transformers adapter),
the registry that maps a config's ``arch`` or a transformers ``model_type`` to its family, the parts families share
(layers: the causal LM skeleton, RMSNorm, RoPE, attention kernel; masks: growth masks), and shape arithmetic
(config)."""

from growlm.model.config import (
    PRESETS,
    ModelConfig,
    config_from_dict,
    flops_per_token,
    from_preset,
    param_count,
)
from growlm.model.gpt2.config import GPTConfig
from growlm.model.gpt2.model import GPT
from growlm.model.llama.config import LlamaConfig
from growlm.model.llama.model import Llama
from growlm.model.qwen2.config import Qwen2Config
from growlm.model.qwen2.model import Qwen2
from growlm.model.registry import build_model

__all__ = [
    "GPT",
    "GPTConfig",
    "Llama",
    "LlamaConfig",
    "ModelConfig",
    "PRESETS",
    "Qwen2",
    "Qwen2Config",
    "build_model",
    "config_from_dict",
    "flops_per_token",
    "from_preset",
    "param_count",
]
