"""Load a model for evaluation, in one process: a growlm DeepSpeed checkpoint (any ZeRO stage, any world size) or
an exported ``transformers`` folder. Both give an eval-mode ``logits_fn`` (ids (B, T) int64 -> logits (B, T, V)).

DeepSpeed checkpoints: the fp32 weights come from DeepSpeed's ``get_fp32_state_dict_from_zero_checkpoint``
(deepspeed.utils.zero_to_fp32; it merges the ZeRO 1/2/3 partitions of any number of ranks). Stage 0 writes no
ZeRO partitions; its weights are the module state in ``mp_rank_00_model_states.pt`` (fp32 runs: the exact
weights; bf16/fp16 runs: the working copy, since stage 0 keeps no separate fp32 master that zero_to_fp32 can read).
The shape comes from ``growlm_state.json`` (``model_config``) and is checked against every tensor. A checkpoint
saved mid mask ramp (``growth_masks`` not null) is rebuilt with its masks at the saved step's ramp value.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from eval import tokenizer as tok
from eval.tokenizer import EvalInputError, Tokenizer
from model.config import GPTConfig

STATE_FILE = "growlm_state.json"


@dataclass
class LoadedModel:
    """A model ready to score text: ``logits_fn`` in eval mode, its shape, tokenizer and where it came from."""

    logits_fn: Callable[[Tensor], Tensor]
    config: GPTConfig
    tokenizer: Tokenizer
    source: str
    kind: str  # "deepspeed" | "transformers"
    model: torch.nn.Module


def _tag_folder(path: Path) -> Path:
    """The tag folder named by a checkpoint folder (its ``latest``) or a tag folder itself."""
    if (path / STATE_FILE).is_file():
        return path
    latest = path / "latest"
    if latest.is_file():
        tag = path / latest.read_text().strip()
        if (tag / STATE_FILE).is_file():
            return tag
        raise EvalInputError(f"{path}: 'latest' names {tag.name!r}, which has no {STATE_FILE}")
    if (path / "checkpoints").is_dir():
        return _tag_folder(path / "checkpoints")
    raise EvalInputError(
        f"{path}: no {STATE_FILE} and no 'latest' file: not a growlm checkpoint. Give a tag folder "
        "(OUT/checkpoints/global_stepN), its checkpoints folder, or an exported transformers folder (config.json)"
    )


def read_state(tag_dir: Path) -> tuple[dict, GPTConfig]:
    """growlm_state.json and its model config.

    Raises:
        EvalInputError: the file is not JSON, or its model_config is missing or invalid.
    """
    path = tag_dir / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise EvalInputError(f"{path} is not valid JSON ({e}); the checkpoint is damaged") from e
    if not isinstance(state, dict) or "model_config" not in state:
        raise EvalInputError(f"{path} has no 'model_config'; cannot tell the model's shape (damaged checkpoint?)")
    try:
        cfg = GPTConfig.from_dict(state["model_config"])
    except (ValueError, TypeError) as e:
        raise EvalInputError(f"{path}: invalid model_config ({e})") from e
    return state, cfg


def _weights(tag_dir: Path, zero_stage: int | None) -> dict[str, Tensor]:
    """fp32 weights of a DeepSpeed tag folder, merged over ranks."""
    has_zero_shards = any(tag_dir.glob("*zero_pp_rank_*_optim_states.pt"))
    if has_zero_shards and zero_stage != 0:
        from growth.ds_runtime import select_accelerator

        select_accelerator()
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        with contextlib.redirect_stdout(io.StringIO()):  # it prints a line per parameter group
            sd = get_fp32_state_dict_from_zero_checkpoint(str(tag_dir.parent), tag=tag_dir.name)
        return {k: v.float() for k, v in sd.items()}
    model_file = tag_dir / "mp_rank_00_model_states.pt"
    if not model_file.is_file():
        raise EvalInputError(f"{tag_dir}: neither ZeRO partitions nor {model_file.name}; incomplete checkpoint")
    blob = torch.load(model_file, map_location="cpu", weights_only=False)
    return {k: v.float() for k, v in blob["module"].items()}


def load_deepspeed(path: str | Path, tokenizer: str | None = None) -> LoadedModel:
    """A growlm DeepSpeed checkpoint (tag folder, checkpoints folder or run folder) as an eval-mode GPT (fp32).

    Raises:
        EvalInputError: not a growlm checkpoint, config missing/invalid, or weights that do not fit the config.
    """
    from model.gpt import GPT
    from model.masks import MaskSpec

    tag_dir = _tag_folder(Path(path))
    state, cfg = read_state(tag_dir)
    masks = state.get("growth_masks")
    model = GPT(cfg, masks=MaskSpec.from_dict(masks) if masks else None)
    sd = _weights(tag_dir, state.get("zero_stage"))
    expected = {k: v.shape for k, v in model.state_dict().items() if k != "lm_head.weight"}
    expected = {k: s for k, s in expected.items() if not k.startswith("growth_")}  # masks: recomputed below
    got = {k: v for k, v in sd.items() if k != "lm_head.weight" and not k.startswith("growth_")}
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    wrong = [
        f"{k}: {tuple(got[k].shape)} vs config {tuple(s)}"
        for k, s in expected.items()
        if k in got and got[k].shape != s
    ]
    if missing or extra or wrong:
        raise EvalInputError(
            f"{tag_dir}: the weights do not match model_config in {STATE_FILE} ({cfg.shape_str()}): "
            f"missing {missing[:4]}, unexpected {extra[:4]}, wrong shapes {wrong[:4]}; the checkpoint is inconsistent"
        )
    with torch.no_grad():
        model.load_state_dict(got, strict=False)
    if masks:
        model.set_growth_step(int(state.get("global_step", 0)))
    model.eval()
    default = None
    data_dir = (state.get("data") or {}).get("dir")
    if tokenizer is None and data_dir and Path(data_dir).is_dir():
        default = tok.from_data_dir(data_dir)
    return LoadedModel(model, cfg, tok.resolve(tokenizer, default), str(tag_dir), "deepspeed", model)


def load_transformers(path: str | Path, tokenizer: str | None = None) -> LoadedModel:
    """An exported ``transformers`` GPT-2 folder (config.json + weights), scored by HF's own forward pass."""
    from transformers import GPT2LMHeadModel

    from model.hf import from_hf_config

    path = Path(path)
    try:
        hf = GPT2LMHeadModel.from_pretrained(str(path)).float().eval()
    except (OSError, ValueError) as e:
        raise EvalInputError(f"{path}: cannot load it as a transformers GPT-2 folder ({e})") from e
    try:
        cfg = from_hf_config(hf.config)
    except ValueError as e:
        raise EvalInputError(f"{path}: {e}") from e
    default = tok.from_file(path / "tokenizer.json") if (path / "tokenizer.json").is_file() else None
    return LoadedModel(lambda x: hf(x).logits, cfg, tok.resolve(tokenizer, default), str(path), "transformers", hf)


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
