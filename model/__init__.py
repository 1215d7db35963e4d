"""The growth-aware GPT-2: its shape (config), the module, HF conversion and growth masks."""

from growlm.model.config import PRESETS, GPTConfig, flops_per_token, from_preset, param_count
from growlm.model.gpt import GPT

__all__ = ["GPT", "GPTConfig", "PRESETS", "flops_per_token", "from_preset", "param_count"]
