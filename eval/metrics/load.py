"""Load a model for evaluation, in one process: a growlm DeepSpeed checkpoint (any ZeRO stage, any world size) or
an exported ``transformers`` folder. Both give an eval-mode ``logits_fn`` (ids (B, T) int64 -> logits (B, T, V)).

DeepSpeed checkpoints: the fp32 weights come from DeepSpeed's ``get_fp32_state_dict_from_zero_checkpoint``
(deepspeed.utils.zero_to_fp32; it merges the ZeRO 1/2/3 partitions of any number of ranks). Stage 0 writes no
ZeRO partitions; its weights are the module state in ``mp_rank_00_model_states.pt`` (fp32 runs: the exact
weights; bf16/fp16 runs: the working copy, since stage 0 keeps no separate fp32 master that zero_to_fp32 can read).
The shape comes from ``growlm_state.json`` (``model_config``) and is checked against every tensor. A checkpoint
saved mid mask ramp (``growth_masks`` not null) is rebuilt with its masks at the saved step's ramp value.

The tokenizer is the model's own unless ``--tokenizer`` names one: an export's tokenizer.json (growth/offline/export.py
writes it), or the token folder a checkpoint's RunState names. When neither can tell (an export without
tokenizer.json, a checkpoint whose token folder is gone or rebuilt), a model with GPT-2's vocabulary (V >= 50257) is
scored with GPT-2 BPE and any other model is refused with a message naming ``--tokenizer``. A tokenizer with more
tokens than the model's vocab_size is refused.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from growlm.data import tokenizer as tok
from growlm.data.tokenizer import GPT2_VOCAB_SIZE, Tokenizer, TokenizerError
from growlm.eval.metrics.errors import EvalInputError
from growlm.model.config import GPTConfig
from growlm.model.gpt import GPT
from growlm.model.hf import from_hf_config
from growlm.runtime.checkpoint import STATE_FILE, CheckpointError, OpenCheckpoint, open_checkpoint, safe_load
from growlm.runtime.dist import select_accelerator


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
    """The tokenizer to score ``source`` with: ``spec`` (``--tokenizer``) if given, else the model's own (``own()``;
    None or a TokenizerError: unknown), else GPT-2 BPE for a GPT-2-sized vocabulary (V >= 50257).

    Raises:
        EvalInputError: the model's tokenizer is unknown and V < 50257 (the message names --tokenizer), or the
            tokenizer has more tokens than the model's vocab_size.
        data.tokenizer.TokenizerError: ``spec`` cannot be loaded.
    """
    t = tok.resolve(spec) if spec is not None else None
    if t is None:
        try:
            t, why = own(), "it carries no tokenizer.json"
        except TokenizerError as e:
            t, why = None, str(e)
        if t is None and cfg.vocab_size < GPT2_VOCAB_SIZE:
            raise EvalInputError(
                f"{source}: cannot tell which tokenizer this model (vocab_size {cfg.vocab_size}) was trained with: "
                f"{why}; pass it with --tokenizer TOKENIZER.json or --tokenizer DATA_DIR (its token folder)"
            )
        if t is None:
            print(
                f"growlm-eval: note: {source}: {why}; scoring with GPT-2 BPE (vocab_size {cfg.vocab_size})",
                file=sys.stderr,
            )
            t = tok.gpt2()
    if t.vocab_size > cfg.vocab_size:
        raise EvalInputError(
            f"{source}: the tokenizer {t.name} has {t.vocab_size} tokens but the model's vocab_size is "
            f"{cfg.vocab_size}: tokenizer/model mismatch; pass the model's own tokenizer with --tokenizer"
        )
    return t


def _weights(tag_dir: Path, zero_stage: int | None) -> dict[str, Tensor]:
    """fp32 weights of a DeepSpeed tag folder, merged over ranks."""
    has_zero_shards = any(tag_dir.glob("*zero_pp_rank_*_optim_states.pt"))
    if has_zero_shards and zero_stage != 0:
        select_accelerator()
        from deepspeed.utils import zero_to_fp32  # lazy: deepspeed picks its accelerator at import

        with contextlib.redirect_stdout(io.StringIO()):  # it prints a line per parameter group
            sd = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(tag_dir.parent), tag=tag_dir.name)
        return {k: v.float() for k, v in sd.items()}
    model_file = tag_dir / "mp_rank_00_model_states.pt"
    if not model_file.is_file():
        raise EvalInputError(f"{tag_dir}: neither ZeRO partitions nor {model_file.name}; incomplete checkpoint")
    blob = safe_load(model_file, "module weights")
    return {k: v.float() for k, v in blob["module"].items()}


def load_deepspeed(path: str | Path, tokenizer: str | None = None) -> LoadedModel:
    """A growlm DeepSpeed checkpoint (tag folder, checkpoints folder or run folder) as an eval-mode GPT (fp32).

    Raises:
        EvalInputError: not a growlm checkpoint, config missing/invalid, or weights that do not fit the config.
    """

    ckpt = open_deepspeed(Path(path))
    tag_dir, state, cfg = ckpt.tag_dir, ckpt.state, ckpt.state.model_config
    masks = state.growth_masks
    model = GPT(cfg, masks=masks)
    sd = _weights(tag_dir, state.zero_stage)
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
        model.set_growth_step(state.global_step)
    model.eval()
    t = choose_tokenizer(
        tokenizer, lambda: tok.from_run_data(state.data.dir, state.data.train_sha256), cfg, str(tag_dir)
    )
    return LoadedModel(model, cfg, t, str(tag_dir), "deepspeed", model)


def load_transformers(path: str | Path, tokenizer: str | None = None) -> LoadedModel:
    """An exported ``transformers`` GPT-2 folder (config.json + model.safetensors, tokenizer.json when it has one),
    scored by HF's own forward pass.

    Raises:
        EvalInputError: not a loadable GPT-2 folder (or weights only as a pickle), a config growlm's GPT does not
            implement, or no usable tokenizer (see ``choose_tokenizer``).
    """
    from transformers import GPT2LMHeadModel  # lazy: heavy (about 2 s), only for the transformers GPT-2

    path = Path(path)
    try:
        # safetensors only: a pytorch_model.bin is a pickle, which growlm never unpickles from a foreign folder
        hf = GPT2LMHeadModel.from_pretrained(str(path), use_safetensors=True).float().eval()
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
