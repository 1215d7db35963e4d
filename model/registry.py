"""The model families growlm builds, one line each: a config's ``arch`` and a transformers ``model_type`` name the
family, which holds its config class, module, transformers adapter, presets and growth operators. Every place that
needs a family's part looks it up here; nothing outside this file branches on the family. ``model_type_problem`` is
the one check of a transformers ``config.json`` against the families (train.py --init_from and growlm-eval refuse
any other with its message).

Adding a family (torchtitan's ``models/<name>/`` is the pattern): a folder ``model/<name>/`` with ``config.py`` (its
config class, with ``arch`` and the methods model.config calls, and ``PRESETS``), ``model.py`` (a
``model.layers.CausalLM``) and ``hf.py`` (``HF_CLASS``, ``to_hf``, ``config_from_dict``, ``config_json``, and
``CONFIG_FIELDS`` with ``config_problem``: the kinds of value its config.json fields hold and what follows from them,
model.hf_folder's check before transformers reads the file); its operators file under growth/ops/ (``make_rules``);
and one ``Family`` line below.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from growlm.model.gpt2 import config as gpt2_config
from growlm.model.gpt2 import hf as gpt2_hf
from growlm.model.gpt2.model import GPT
from growlm.model.llama import config as llama_config
from growlm.model.llama import hf as llama_hf
from growlm.model.llama.model import Llama
from growlm.model.masks import MaskSpec
from growlm.model.qwen2 import config as qwen2_config
from growlm.model.qwen2 import hf as qwen2_hf
from growlm.model.qwen2.model import Qwen2


@dataclass(frozen=True)
class Family:
    """One model family.

    arch: the config's ``arch`` (saved in checkpoints); name: for messages ("GPT-2"); config: its config class;
    model: its ``CausalLM`` class; hf: its transformers adapter module (model/<name>/hf.py); model_type: the
    ``model_type`` of its transformers config.json; operators: the module of its growth operators (imported by
    growth.ops, which sits above model/ in the layers, so it is named here, not imported); presets: name ->
    config.
    """

    arch: str
    name: str
    config: type
    model: type
    hf: ModuleType
    model_type: str
    operators: str
    presets: dict[str, Any] = field(default_factory=dict)

    @property
    def hf_class(self) -> str:
        """The transformers class the family reads and writes (e.g. "LlamaForCausalLM")."""
        return self.hf.HF_CLASS


FAMILIES: dict[str, Family] = {f.arch: f for f in (
    Family("gpt2", "GPT-2", gpt2_config.GPTConfig, GPT, gpt2_hf, "gpt2", "growlm.growth.ops.gpt2",
           gpt2_config.PRESETS),
    Family("llama", "Llama", llama_config.LlamaConfig, Llama, llama_hf, "llama", "growlm.growth.ops.llama",
           llama_config.PRESETS),
    Family("qwen2", "Qwen 2", qwen2_config.Qwen2Config, Qwen2, qwen2_hf, "qwen2", "growlm.growth.ops.llama",
           qwen2_config.PRESETS),
)}  # fmt: skip


def family(arch_or_config: str | Any) -> Family:
    """The family of an ``arch`` string or of a config (its ``arch``).

    Raises:
        ValueError: an unknown arch.
    """
    arch = arch_or_config if isinstance(arch_or_config, str) else arch_or_config.arch
    if arch not in FAMILIES:
        raise ValueError(f"unknown model arch {arch!r}; growlm builds {sorted(FAMILIES)}")
    return FAMILIES[arch]


def family_of_model_type(model_type: str | None) -> Family | None:
    """The family whose transformers ``model_type`` is ``model_type``, or None."""
    return next((f for f in FAMILIES.values() if f.model_type == model_type), None)


def model_type_problem(config: Any) -> str | None:
    """What is wrong with a transformers ``config.json`` (its parsed value) for growlm, as the problem and the fix of
    a one-line refusal, or None when it describes a family growlm reads (``FAMILIES``: ``model_type`` "gpt2",
    GPT2LMHeadModel; "llama", LlamaForCausalLM; "qwen2", Qwen2ForCausalLM), with that class among its
    ``architectures`` when it lists any. E.g. "config.json says model_type 'mistral'; growlm reads GPT-2, Llama and
    Qwen 2 folders (...)"."""
    names = [f.name for f in FAMILIES.values()]
    types = "; ".join(f"{f.model_type!r}, {f.hf_class}" for f in FAMILIES.values())
    fix = f"growlm reads {', '.join(names[:-1])} and {names[-1]} folders (model_type {types})"
    if not isinstance(config, dict):
        return f"config.json is not a JSON object; {fix}"
    kind = config.get("model_type")
    fam = family_of_model_type(kind) if isinstance(kind, str) else None
    if fam is None:
        return f"config.json says {f'model_type {kind!r}' if kind else 'no model_type'}; {fix}"
    archs = config.get("architectures")
    if isinstance(archs, list) and archs and fam.hf_class not in archs:
        return f"config.json says architectures {', '.join(map(str, archs))}, not {fam.hf_class}; {fix}"
    return None


def build_model(cfg: Any, masks: MaskSpec | None = None, *, activation_checkpointing: bool = False) -> Any:
    """The model of ``cfg``'s family, freshly initialised, with the mask buffers of ``masks`` when given.

    Raises:
        ValueError: an unknown arch, or ``masks`` does not fit ``cfg``.
    """
    return family(cfg).model(cfg, masks, activation_checkpointing=activation_checkpointing)


@contextlib.contextmanager
def init_skipped() -> Iterator[None]:
    """Build models without drawing their initial weights: the ``reset_parameters`` of every family's model class
    and of ``torch.nn.Linear``, ``Embedding`` and ``LayerNorm`` do nothing inside this block (restored on exit), so
    a parameter holds whatever ``torch.empty`` gave it. For a model whose weights are written next, or whose shapes
    only are wanted (on the meta device torch's init functions would import torch._dynamo, seconds of a command's
    start; growth.ops.rules.param_shapes)."""
    models = [c for f in FAMILIES.values() for c in f.model.__mro__ if "reset_parameters" in c.__dict__]
    targets = [*dict.fromkeys(models), torch.nn.Linear, torch.nn.Embedding, torch.nn.LayerNorm]
    saved = [(cls, cls.__dict__["reset_parameters"]) for cls in targets]
    for cls, _ in saved:
        cls.reset_parameters = lambda self: None
    try:
        yield
    finally:
        for cls, fn in saved:
            cls.reset_parameters = fn
