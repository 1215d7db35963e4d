"""The model families growlm builds, chosen by the config's ``arch``: "gpt2" (``GPTConfig`` -> ``model.gpt.GPT``)
and "llama" (``LlamaConfig`` -> ``model.llama.Llama``). Every place that makes a model from a config calls
``build_model``; nothing else branches on the family to construct one."""

from __future__ import annotations

from growlm.model.config import ModelConfig
from growlm.model.gpt import GPT
from growlm.model.llama import Llama
from growlm.model.masks import GrowthMaskedModel, MaskSpec

MODEL_CLASSES: dict[str, type[GrowthMaskedModel]] = {"gpt2": GPT, "llama": Llama}


def build_model(
    cfg: ModelConfig, masks: MaskSpec | None = None, *, activation_checkpointing: bool = False
) -> GrowthMaskedModel:
    """The model of ``cfg``'s family, freshly initialised (``GPT`` or ``Llama``), with the mask buffers of
    ``masks`` when given.

    Raises:
        ValueError: an unknown arch, or ``masks`` does not fit ``cfg``.
    """
    cls = MODEL_CLASSES.get(cfg.arch)
    if cls is None:
        raise ValueError(f"unknown model arch {cfg.arch!r}; growlm builds {sorted(MODEL_CLASSES)}")
    return cls(cfg, masks, activation_checkpointing=activation_checkpointing)


def embedding_name(cfg: ModelConfig) -> str:
    """The token embedding's parameter name (the tied LM head's too): ``transformer.wte.weight`` (GPT-2) or
    ``model.embed_tokens.weight`` (Llama)."""
    return "model.embed_tokens.weight" if cfg.arch == "llama" else "transformer.wte.weight"
