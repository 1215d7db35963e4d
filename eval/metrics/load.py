"""Load a model for evaluation, in one process: a growlm DeepSpeed checkpoint (any ZeRO stage, any world size) or
an exported ``transformers`` folder. Both give an eval-mode ``logits_fn`` (ids (B, T) int64 -> logits (B, T, V)).

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
from typing import Any

import torch
from safetensors import SafetensorError
from torch import Tensor

from growlm.data import tokenizer as tok
from growlm.data.tokenizer import Tokenizer, TokenizerError
from growlm.eval.metrics.errors import EvalInputError
from growlm.growth.offline.weights import fp32_model
from growlm.model.config import GPTConfig
from growlm.model.hf import from_hf_config, safetensors_problem
from growlm.runtime.checkpoint import STATE_FILE, CheckpointError, OpenCheckpoint, open_checkpoint


@dataclass
class LoadedModel:
    """A model ready to score text: ``logits_fn`` in eval mode, its shape, tokenizer and where it came from."""

    logits_fn: Callable[[Tensor], Tensor]
    config: GPTConfig
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


def choose_tokenizer(spec: str | None, own: Callable[[], Tokenizer | None], cfg: GPTConfig, source: str) -> Tokenizer:
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
    """A growlm DeepSpeed checkpoint (tag folder, checkpoints folder or run folder) as an eval-mode GPT (fp32).

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


def not_gpt2(config: Any) -> str | None:
    """What a transformers ``config.json`` (its parsed dict) describes when it is not a GPT-2, as the problem and the
    fix of a refusal (e.g. "a Llama model (LlamaForCausalLM), which growlm does not load yet; growlm loads GPT-2
    models (model_type 'gpt2', GPT2LMHeadModel)"), or None for a GPT-2."""
    kind = config.get("model_type") if isinstance(config, dict) else None
    if kind == "gpt2":
        return None
    archs = config.get("architectures") if isinstance(config, dict) else None
    arch = f" ({', '.join(map(str, archs))})" if isinstance(archs, list) and archs else ""
    what = (
        f"a {str(kind).replace('_', ' ').title()} model{arch}"
        if isinstance(kind, str) and kind
        else (f"no model_type{arch}")
    )
    return f"{what}, which growlm does not load yet; growlm loads GPT-2 models (model_type 'gpt2', GPT2LMHeadModel)"


WEIGHTS_FIX = "export the model again (growlm-grow CKPT --export_hf DIR) or copy the whole file again"


def load_transformers(path: str | Path, tokenizer: str | None = None) -> LoadedModel:
    """An exported ``transformers`` GPT-2 folder (config.json + model.safetensors, tokenizer.json when it has one),
    scored by HF's own forward pass.

    Raises:
        EvalInputError: not a loadable GPT-2 folder (another model type, e.g. a Llama, named as such; weights only as a
            pickle; a truncated or damaged model.safetensors, named with what is wrong), a config growlm's GPT does not
            implement, or no usable tokenizer (see ``choose_tokenizer``).
    """
    from transformers import GPT2LMHeadModel  # lazy: heavy (about 2 s), only for the transformers GPT-2

    path = Path(path)
    try:
        foreign = not_gpt2(json.loads((path / "config.json").read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EvalInputError(
            f"{path}: config.json cannot be read as JSON ({e}); give a transformers GPT-2 folder"
        ) from e
    if foreign is not None:
        raise EvalInputError(f"{path}: config.json describes {foreign}")
    weights = path / "model.safetensors"
    if weights.is_file():
        try:
            problem = safetensors_problem(weights)
        except OSError as e:
            problem = f"cannot be read ({e.strerror or e})"
        if problem is not None:
            raise EvalInputError(f"{weights} {problem}; {WEIGHTS_FIX}")
    try:
        # safetensors only: a pytorch_model.bin is a pickle, which growlm never unpickles from a foreign folder
        hf = GPT2LMHeadModel.from_pretrained(str(path), use_safetensors=True).float().eval()
    except SafetensorError as e:
        raise EvalInputError(f"{weights} is not a readable safetensors file ({e}); {WEIGHTS_FIX}") from None
    except (OSError, ValueError) as e:
        raise EvalInputError(f"{path}: cannot load it as a transformers GPT-2 folder ({e})") from e
    try:
        cfg = from_hf_config(hf.config)
    except ValueError as e:
        raise EvalInputError(f"{path}: {e}") from e
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
