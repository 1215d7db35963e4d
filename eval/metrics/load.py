"""Load a model for evaluation, in one process: a growlm DeepSpeed checkpoint (any ZeRO stage, any world size) or
a ``transformers`` folder of any family growlm reads (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM), checked
as train.py --init_from checks it (trainer.init_from.read_folder; anything else is refused in one line). Both give
an eval-mode ``logits_fn`` (ids (B, T) int64 -> logits (B, T, V)).

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
from growlm.model.hf_folder import FolderError
from growlm.model.registry import family as model_family
from growlm.runtime.checkpoint import STATE_FILE, CheckpointError, OpenCheckpoint, open_checkpoint
from growlm.runtime.quiet import quiet_transformers
from growlm.trainer.init_from import read_folder
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


def load_transformers(path: str | Path, tokenizer: str | None = None) -> LoadedModel:
    """A ``transformers`` folder (config.json + model.safetensors or a sharded model.safetensors.index.json,
    tokenizer.json when it has one) of a family growlm reads (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM),
    scored by transformers' own forward pass in fp32. The folder is checked first as train.py --init_from checks
    it, by the same function (trainer.init_from.read_folder: every config.json value, then every tensor against the
    config's shape), so growlm-eval scores only the model the folder holds, never one transformers completed with
    freshly initialised tensors (a missing bias, a layer the weights lack) or one it would run differently.

    Raises:
        EvalInputError: ``DIR: `` and the problem ``read_folder`` names (another model type; a malformed
            config.json value; a variant growlm's models do not implement, e.g. a Llama with yarn rope scaling or
            biases; weights only as a pickle; a truncated or damaged safetensors file; tensors missing, unexpected
            or of another shape; a tied config with an LM head of its own), a folder transformers cannot load, or
            no usable tokenizer (see ``choose_tokenizer``).
    """
    import transformers  # lazy: heavy (about 2 s), only for a transformers folder

    path = Path(path)
    try:
        folder = read_folder(path)
    except FolderError as e:
        raise EvalInputError(f"{path}: {e}") from None
    cfg = folder.config
    model_cls = getattr(transformers, model_family(cfg).hf_class)
    try:
        # safetensors only: a pytorch_model.bin is a pickle, which growlm never unpickles from a foreign folder
        with quiet_transformers():
            hf = model_cls.from_pretrained(str(path), use_safetensors=True, dtype=torch.float32).float().eval()
    except SafetensorError as e:
        raise EvalInputError(
            f"{path}: a weights file is not readable safetensors ({e}); export the model again or copy the whole file "
            "again"
        ) from None
    except (OSError, ValueError) as e:
        raise EvalInputError(
            f"{path}: cannot load it as a transformers {model_family(cfg).hf_class} folder ({e})"
        ) from e
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
