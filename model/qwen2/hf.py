"""Conversion between growlm's Qwen 2 and ``transformers.Qwen2ForCausalLM`` (the model out, the config in, as for
Llama), through the Llama family's shared conversion (model/llama/hf.py): same names and ``nn.Linear`` layout, plus
the q/k/v biases. This module imports ``transformers`` lazily."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from growlm.model.llama import hf as llama_hf
from growlm.model.qwen2.config import Qwen2Config
from growlm.model.qwen2.model import Qwen2

if TYPE_CHECKING:
    from transformers import Qwen2Config as HFQwen2Config
    from transformers import Qwen2ForCausalLM

HF_CLASS = "Qwen2ForCausalLM"  # the transformers class of the family (model.registry)
config_json = llama_hf.config_json  # rope_theta (and rope_scaling) at the top level too, for transformers 4
# the config.json fields Qwen 2 reads, with the kind of value each holds (model.hf_fields): Llama's and the window
CONFIG_FIELDS = {**llama_hf.CONFIG_FIELDS, "use_sliding_window": "boolean"}


def config_problem(d: dict[str, Any]) -> str | None:
    """What is malformed in a Qwen 2 ``config.json`` dict, as a one-line problem and fix, or None (Llama's checks,
    ``model.llama.hf.config_problem``, over ``CONFIG_FIELDS``)."""
    return llama_hf.config_problem(d, CONFIG_FIELDS)


def to_hf_config(cfg: Qwen2Config, bos_token_id: int | None = None, eos_token_id: int | None = None) -> HFQwen2Config:
    """The ``transformers.Qwen2Config`` describing the same model (no sliding window; token ids: the tokenizer's, or
    none)."""
    from transformers import Qwen2Config as HFQwen2Config  # lazy: heavy (about 2 s), only for transformers' Qwen 2

    return HFQwen2Config(**llama_hf.hf_config_kwargs(cfg, bos_token_id, eos_token_id), use_sliding_window=False)


def from_hf_config(hf_cfg: HFQwen2Config) -> Qwen2Config:
    """The Qwen2Config of a ``transformers.Qwen2Config``.

    Raises:
        ValueError: sliding-window attention (``use_sliding_window``), or what the Llama family refuses
            (``model.llama.hf.config_from_hf``: another activation, a rotary scaling other than "linear" and
            "llama3", such as "yarn"), or an invalid shape.
    """
    problems = []
    if getattr(hf_cfg, "use_sliding_window", False):
        problems.append("use_sliding_window=True (growlm's Qwen 2 attends to the whole context)")
    return llama_hf.config_from_hf(hf_cfg, Qwen2Config, problems)


def config_from_dict(d: dict[str, Any]) -> Qwen2Config:
    """The Qwen2Config of a ``config.json``'s dict (``model_type`` "qwen2").

    Raises:
        ValueError: see ``from_hf_config``.
    """
    import transformers  # lazy: heavy (about 2 s), only for a transformers folder

    return from_hf_config(transformers.Qwen2Config.from_dict(d))


def to_hf(model: Qwen2, bos_token_id: int | None = None, eos_token_id: int | None = None) -> Qwen2ForCausalLM:
    """A ``Qwen2ForCausalLM`` holding copies of ``model``'s weights (fp32), in eval mode.

    Raises:
        ValueError: the model still carries growth masks (finish the ramp first), or the names do not match.
    """
    from transformers import Qwen2ForCausalLM  # lazy: heavy (about 2 s), only for transformers' Qwen 2

    return llama_hf.copy_to_hf(model, Qwen2ForCausalLM(to_hf_config(model.config, bos_token_id, eos_token_id)))
