"""Export a growlm checkpoint's weights to a transformers GPT-2 folder (``growlm-grow CKPT --export_hf DIR``):
``config.json`` + ``model.safetensors``, loadable by ``transformers.GPT2LMHeadModel.from_pretrained(DIR)``.

The weights are the fp32 masters of any ZeRO stage 1-3 checkpoint at any world size, read through its universal
form (growth.universal); the HF naming and Conv1D layout are model.hf's.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from growth.offline import Source, check_output
from growth.plan import param_shapes
from growth.universal import UniversalStore, convert
from runtime.atomic import atomic_dir
from runtime.checkpoint import CheckpointError


def export_hf(src: Source, out: Path, *, overwrite: bool = False, workers: int = 1, log: Any = print) -> Path:
    """Write ``config.json`` + ``model.safetensors`` of ``src``'s fp32 weights, loadable by
    ``transformers.GPT2LMHeadModel.from_pretrained(out)``.

    Raises:
        CheckpointError: the output exists (without ``overwrite``) or overlaps the input; the checkpoint's growth
            masks are still ramping (a masked model is not GPT-2).
    """
    from model.gpt import GPT
    from model.hf import to_hf

    step, masks = src.state.global_step, src.state.growth_masks
    if masks is not None and masks.value(step) < 1.0:
        raise CheckpointError(
            f"{src.tag_dir} still has growth masks ramping (value {masks.value(step):.3f} at step {step}, 1 at step "
            f"{masks.end_step()}); a masked model is not a GPT-2: export a checkpoint from step >= {masks.end_step()}"
        )
    check_output(out, src, overwrite)
    with atomic_dir(out, overwrite=overwrite) as tmp:
        conv = src.tag_dir
        if not src.universal:
            conv = tmp / ".convert" / src.tag
            convert(src.tag_dir, conv, workers)
        store = UniversalStore(conv / "zero", param_shapes(src.config), flat=src.zero_stage == 3)
        model = GPT(src.config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(store.read_tensor(name, "fp32"))
        hf = to_hf(model)
        shutil.rmtree(tmp / ".convert", ignore_errors=True)
        hf.save_pretrained(str(tmp), safe_serialization=True)
    log(f"growlm-grow: exported {src.tag_dir} ({src.config.shape_str()}) to {out} (transformers GPT2LMHeadModel)")
    return out
