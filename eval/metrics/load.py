"""Load a model for evaluation, in one process: a growlm DeepSpeed checkpoint (any ZeRO stage, any world size) or
a ``transformers`` folder of either family (GPT2LMHeadModel, LlamaForCausalLM; another model_type is refused in one
line). Both give an eval-mode ``logits_fn`` (ids (B, T) int64 -> logits (B, T, V)).

DeepSpeed checkpoints: the fp32 weights of any ZeRO stage and world size, native or universal, come from
growth.offline.weights (the one checkpoint-weights reader, shared with the transformers export); the shape from
``growlm_state.json`` (``model_config``), checked against every tensor. A checkpoint saved mid mask ramp
(``growth_masks`` not null) is rebuilt with its masks at the saved step's ramp value.

The tokenizer is the model's own unless ``--tokenizer`` names one: an export's tokenizer.json (growth/offline/export.py
writes it), or the token folder a checkpoint's RunState names. When neither can tell (an export without
tokenizer.json, a checkpoint whose token folder is gone or rebuilt) the model is refused with a message naming
``--tokenizer``, as growlm-grow --export_hf refuses it (data.tokenizer.model_tokenizer, the one policy). A tokenizer
with more tokens than the model's vocab_size is refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from torch import Tensor

from growlm.data import tokenizer as tok
from growlm.data.tokenizer import Tokenizer, TokenizerError
from growlm.growth.offline.weights import fp32_model
from growlm.model.config import ModelConfig
from growlm.model.registry import family_of_model_type, model_type_problem
from growlm.model.weight_files import safetensors_problem
from growlm.runtime.checkpoint import STATE_FILE, CheckpointError, OpenCheckpoint, open_checkpoint
from growlm.runtime.quiet import quiet_transformers
from growlm.trainer.scoring import EvalInputError


@dataclass
class LoadedModel:
    """A model ready to score text: ``logits_fn`` in eval mode, its shape, tokenizer and where it came from."""

    logits_fn: Callable[[Tensor], Tensor]
    config: ModelConfig
    tokenizer: Tokenizer
    source: str
    kind: str  # "deepspeed" | "transformers"
    model: torch.nn.Module


def open_deepspeed(path: Path) -> OpenCheckpoint:
    """The growlm checkpoint named by ``path`` (tag folder, checkpoints folder or run folder), opened by
    ``runtime.checkpoint.open_checkpoint``: manifest verified, RunState read, every pickle checked.

    Raises:
        EvalInputError: not a growlm checkpoint, a damaged or inconsistent one, or a file that is not plain tensor data.
    """
    try:
        return open_checkpoint(path)
    except CheckpointError as e:
        hint = ""
        if "not a growlm checkpoint" in str(e):
            hint = (
                ". Give a tag folder (OUT/checkpoints/global_stepN), its checkpoints folder, or an exported "
                "transformers folder (config.json)"
            )
        raise EvalInputError(f"{e}{hint}") from None


def choose_tokenizer(spec: str | None, own: Callable[[], Tokenizer | None], cfg: ModelConfig, source: str) -> Tokenizer:
    """The tokenizer to score ``source`` with, by the one policy (data.tokenizer.model_tokenizer): ``spec``
    (``--tokenizer``) if given, else the model's own (``own()``).

    Raises:
        EvalInputError: the model's tokenizer is unknown (the message names --tokenizer), ``spec`` cannot be
            loaded, or the tokenizer has more tokens than the model's vocab_size.
    """
    try:
        return tok.model_tokenizer(spec, own, cfg.vocab_size, source)
    except TokenizerError as e:
        raise EvalInputError(str(e)) from None


def load_deepspeed(path: str | Path, tokenizer: str | None = None) -> LoadedModel:
    """A growlm DeepSpeed checkpoint (tag folder, checkpoints folder or run folder) as an eval-mode model of its
    family (GPT or Llama, fp32).

    Raises:
        EvalInputError: not a growlm checkpoint, or weights that are missing or do not fit its model_config.
    """
    ckpt = open_deepspeed(Path(path))
    try:
        model = fp32_model(ckpt)
    except CheckpointError as e:
        raise EvalInputError(str(e)) from None
    state, cfg = ckpt.state, ckpt.state.model_config
    t = choose_tokenizer(
        tokenizer, lambda: tok.from_run_data(state.data.dir, state.data.train_sha256), cfg, str(ckpt.tag_dir)
    )
    return LoadedModel(model, cfg, t, str(ckpt.tag_dir), "deepspeed", model)


WEIGHTS_FIX = "export the model again (growlm-grow CKPT --export_hf DIR) or copy the whole file again"
WEIGHTS_INDEX = "model.safetensors.index.json"


def _check_weight_files(path: Path) -> None:
    """Refuse a truncated or damaged model.safetensors, or shard of a model.safetensors.index.json, naming it and
    what is wrong (model.weight_files.safetensors_problem); files that are absent are left to the loader's message."""
    files = [path / "model.safetensors"]
    try:
        files += [path / n for n in sorted(set(json.loads((path / WEIGHTS_INDEX).read_text())["weight_map"].values()))]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # no index, or one the loader refuses with its own message
    for weights in files:
        if not weights.is_file():
            continue
        try:
            problem = safetensors_problem(weights)
        except OSError as e:
            problem = f"cannot be read ({e.strerror or e})"
        if problem is not None:
            raise EvalInputError(f"{weights} {problem}; {WEIGHTS_FIX}")


def load_transformers(path: str | Path, tokenizer: str | None = None) -> LoadedModel:
    """A ``transformers`` folder (config.json + model.safetensors or a sharded model.safetensors.index.json,
    tokenizer.json when it has one) of a GPT-2 (GPT2LMHeadModel) or a Llama (LlamaForCausalLM), scored by
    transformers' own forward pass in fp32.

    Raises:
        EvalInputError: not a loadable folder (another model type, named as such; weights only as a pickle; a
            truncated or damaged safetensors file, named with what is wrong), a config growlm's models do not
            implement (e.g. a Llama with rope scaling or biases), or no usable tokenizer (see ``choose_tokenizer``).
    """
    import transformers  # lazy: heavy (about 2 s), only for a transformers folder

    path = Path(path)
    try:
        d = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EvalInputError(
            f"{path}: config.json cannot be read as JSON ({e}); give a transformers GPT-2 or Llama folder"
        ) from e
    problem = model_type_problem(d)
    if problem is not None:
        raise EvalInputError(f"{path}: {problem}")
    fam = family_of_model_type(d["model_type"])
    try:
        with quiet_transformers():
            cfg = fam.hf.config_from_dict(d)  # before the weights: an unsupported variant is refused unread
    except (TypeError, ValueError, KeyError) as e:
        raise EvalInputError(f"{path}: {e}") from None
    _check_weight_files(path)
    model_cls = getattr(transformers, fam.hf_class)
    try:
        # safetensors only: a pytorch_model.bin is a pickle, which growlm never unpickles from a foreign folder
        hf = model_cls.from_pretrained(str(path), use_safetensors=True, dtype=torch.float32).float().eval()
    except SafetensorError as e:
        raise EvalInputError(f"{path}: a weights file is not readable safetensors ({e}); {WEIGHTS_FIX}") from None
    except (OSError, ValueError) as e:
        raise EvalInputError(f"{path}: cannot load it as a transformers {fam.hf_class} folder ({e})") from e
    t = choose_tokenizer(tokenizer, lambda: tok.from_hf_dir(path), cfg, str(path))
    return LoadedModel(lambda x: hf(x).logits, cfg, t, str(path), "transformers", hf)


def load(path: str | Path, tokenizer: str | None = None) -> LoadedModel:
    """A growlm checkpoint or an exported transformers folder (it has config.json), chosen by what the folder holds.

    Raises:
        EvalInputError: the path does not exist or holds neither.
    """
    p = Path(path)
    if not p.exists():
        raise EvalInputError(f"{p}: no such checkpoint or model folder")
    if (p / "config.json").is_file() and not (p / STATE_FILE).is_file():
        return load_transformers(p, tokenizer)
    return load_deepspeed(p, tokenizer)
