"""The growth-aware models (GPT-2 and Llama families): their shapes (config), the modules, transformers conversion
and growth masks."""

from growlm.model.config import (
    PRESETS,
    GPTConfig,
    LlamaConfig,
    ModelConfig,
    config_from_dict,
    flops_per_token,
    from_preset,
    param_count,
)
from growlm.model.families import build_model
from growlm.model.gpt import GPT
from growlm.model.llama import Llama

__all__ = [
    "GPT",
    "GPTConfig",
    "Llama",
    "LlamaConfig",
    "ModelConfig",
    "PRESETS",
    "build_model",
    "config_from_dict",
    "flops_per_token",
    "from_preset",
    "param_count",
]
