"""Saving and resuming DeepSpeed checkpoints with growlm's training state, atomically.

A checkpoint is DeepSpeed's own tag folder (``engine.save_checkpoint``: module, ZeRO optimizer partitions, LR
scheduler, loss scaler) plus two growlm files inside it:

* ``growlm_state.json``: the training state DeepSpeed does not know (model config, global step, consumed samples,
  sequence length, world size, ZeRO stage, precision, data identity). The same dict is DeepSpeed's client state.
* ``rng_state_rank{r}.pt``: per-rank RNG states (python, numpy, torch CPU and accelerator).

Nothing is ever overwritten or half-written: ranks write into ``.tmp-<tag>``, rank 0 renames it to ``<tag>`` once
every rank has finished, and only then replaces the ``latest`` pointer (itself written to a temporary file and
renamed). A crash leaves at most a ``.tmp-*`` folder, which loading ignores.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from growth.manifest import ManifestError, verify_manifest, write_manifest

STATE_FILE = "growlm_state.json"
STATE_FORMAT = "growlm-checkpoint-v1"
LATEST = "latest"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used as asked; the message names the path and the fix."""


def tag_for(global_step: int) -> str:
    """DeepSpeed-style tag of the checkpoint taken after ``global_step`` optimizer steps."""
    return f"global_step{global_step}"


def resolve(path: str | os.PathLike) -> tuple[Path, str]:
    """(checkpoint folder, tag) named by ``path``: a folder with a ``latest`` file, or a tag folder itself.

    Raises:
        CheckpointError: nothing there, no ``latest`` pointer, the tag it names is missing, or the tag folder has no
            ``growlm_state.json`` (not a growlm checkpoint, or an unfinished save).
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"--resume {p}: no such file or folder; give a checkpoint folder or one of its tags")
    if (p / STATE_FILE).is_file():
        return p.parent, p.name
    if not (p / LATEST).is_file():
        tags = sorted(q.name for q in p.iterdir() if (q / STATE_FILE).is_file()) if p.is_dir() else []
        hint = f"; tags found: {', '.join(tags)} (pass one of them, e.g. {p / tags[-1]})" if tags else ""
        raise CheckpointError(f"--resume {p}: no '{LATEST}' file and no {STATE_FILE} here, so nothing to load{hint}")
    tag = (p / LATEST).read_text().strip()
    if not (p / tag / STATE_FILE).is_file():
        raise CheckpointError(f"--resume {p}: '{LATEST}' names tag {tag!r} but {p / tag / STATE_FILE} is missing")
    return p, tag


def read_state(ckpt_dir: Path, tag: str, *, verify: bool = True) -> dict[str, Any]:
    """The growlm training state stored with a checkpoint.

    Raises:
        CheckpointError: the file is missing, not JSON, or of another format.
    """
    path = Path(ckpt_dir) / tag / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise CheckpointError(f"{path} is missing; this folder is not a finished growlm checkpoint") from e
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is not valid JSON ({e}); the checkpoint is damaged") from e
    if state.get("format") != STATE_FORMAT:
        raise CheckpointError(f"{path}: format {state.get('format')!r}, expected {STATE_FORMAT!r}")
    if verify:  # growlm_manifest.json (sizes + sha256): a truncated, missing or mixed-in file fails here
        try:
            verify_manifest(Path(ckpt_dir) / tag)
        except ManifestError as e:
            raise CheckpointError(str(e)) from e
    return state


def rng_state() -> dict[str, Any]:
    """This process's RNG states: python ``random``, numpy, torch CPU and (if present) CUDA."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(text)
    os.replace(tmp, path)


def existing_tags(save_dir: str | os.PathLike) -> list[str]:
    """Finished checkpoint tags in ``save_dir`` (folders holding growlm_state.json)."""
    p = Path(save_dir)
    return sorted(q.name for q in p.iterdir() if (q / STATE_FILE).is_file()) if p.is_dir() else []


def save(engine: Any, save_dir: str | os.PathLike, state: dict[str, Any], *, rank: int) -> Path:
    """Save a checkpoint of ``engine`` and ``state`` as tag ``tag_for(state['global_step'])``; a collective.

    Args:
        engine: the DeepSpeed engine (every rank calls this, as ``save_checkpoint`` requires).
        save_dir: checkpoint folder (created if needed).
        state: growlm training state; must hold ``global_step``; stored as growlm_state.json and client state.
        rank: this process's global rank.

    Returns:
        The finished tag folder.

    Raises:
        CheckpointError: that tag already exists (checkpoints are never overwritten), or ``save_dir`` is not on a
            filesystem shared by every rank.
    """
    save_dir = Path(save_dir)
    tag = tag_for(state["global_step"])
    final, tmp_tag = save_dir / tag, f".tmp-{tag}"
    if final.exists():
        raise CheckpointError(f"{final} already exists; refusing to overwrite it (use another output folder)")
    state = {"format": STATE_FORMAT, **state}
    if rank == 0 and (save_dir / tmp_tag).exists():
        shutil.rmtree(save_dir / tmp_tag)  # left by a crashed save
    dist.barrier()
    engine.save_checkpoint(str(save_dir), tag=tmp_tag, client_state={"growlm": state}, save_latest=False)
    rng_path = save_dir / tmp_tag / f"rng_state_rank{rank}.pt"
    torch.save(rng_state(), rng_path.with_name(".tmp-" + rng_path.name))
    os.replace(rng_path.with_name(".tmp-" + rng_path.name), rng_path)
    dist.barrier()
    if rank == 0:
        _atomic_write_text(save_dir / tmp_tag / STATE_FILE, json.dumps(state, indent=2))
        write_manifest(save_dir / tmp_tag)
        os.rename(save_dir / tmp_tag, final)
        _atomic_write_text(save_dir / LATEST, tag)
    dist.barrier()
    # DeepSpeed writes the module states on rank 0 only, so every rank must see rank 0's folder: a save_dir that is
    # not shared by all nodes cannot be resumed, and every rank says so (no rank waits for another that failed)
    seen = torch.tensor([int((final / STATE_FILE).is_file())])
    dist.all_reduce(seen, op=dist.ReduceOp.MIN)
    if not int(seen):
        raise CheckpointError(
            f"{final} is not visible on every node: put --out_dir on a filesystem that all nodes share"
        )
    return final


def load(engine: Any, ckpt_dir: Path, tag: str, *, rank: int, world_size: int) -> dict[str, Any]:
    """Load a checkpoint into ``engine`` (module, optimizer, LR scheduler, loss scaler) and restore this rank's RNG.

    The caller has already checked, with ``check_compatible``, that the checkpoint fits the engine.

    Returns:
        The growlm training state saved with the checkpoint.

    Raises:
        CheckpointError: DeepSpeed loaded nothing.
    """
    state = read_state(ckpt_dir, tag, verify=False)  # the caller's read_state verified the manifest
    groups = engine.optimizer.param_groups
    weight_decays = [g.get("weight_decay") for g in groups]
    path, _client = engine.load_checkpoint(
        str(ckpt_dir), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True
    )
    if path is None:
        raise CheckpointError(f"DeepSpeed loaded nothing from {Path(ckpt_dir) / tag}; the checkpoint is incomplete")
    # DeepSpeed's ZeRO-3 universal loader copies param group 0's hyperparameters onto every group, which would give
    # biases and LayerNorm gains group 0's weight decay; each group keeps its own
    for group, weight_decay in zip(engine.optimizer.param_groups, weight_decays, strict=True):
        if weight_decay is not None:
            group["weight_decay"] = weight_decay
    rng_path = Path(ckpt_dir) / tag / f"rng_state_rank{rank}.pt"
    if state["world_size"] == world_size and rng_path.is_file():
        set_rng_state(torch.load(rng_path, weights_only=False))
    return state


def check_compatible(
    state: dict[str, Any], *, model_config: dict, world_size: int, zero_stage: int, path: Path
) -> None:
    """Refuse a resume that DeepSpeed would get wrong or fail on, before any engine is built.

    Raises:
        CheckpointError: the model shape differs from the checkpoint's; or the data-parallel world size differs
            at ZeRO stage >= 1 (partitioned optimizer state cannot be loaded at another size); or the ZeRO stage
            crosses between 1/2 and 3.
    """
    diff = {
        k: (state["model_config"].get(k), model_config.get(k))
        for k in sorted(set(state["model_config"]) | set(model_config))
        if k != "dropout" and state["model_config"].get(k) != model_config.get(k)
    }
    if diff:
        raise CheckpointError(
            f"{path} holds a model of another shape; differing fields (checkpoint, requested): {diff}. "
            "Drop the shape flags to resume the checkpoint's own shape, or grow it first"
        )
    saved_stage = state["zero_stage"]
    if (saved_stage == 3) != (zero_stage == 3):
        raise CheckpointError(
            f"{path} was saved at ZeRO stage {saved_stage} and cannot be loaded at stage {zero_stage}: "
            "DeepSpeed does not convert between stages 1/2 and 3; use a config with the saved stage"
        )
    universal = bool(state.get("universal"))  # written by growlm-grow: DeepSpeed reshards it at load
    if universal and zero_stage == 0:
        raise CheckpointError(
            f"{path} is a universal checkpoint (growlm-grow), which DeepSpeed loads at ZeRO stage "
            f"{'3' if saved_stage == 3 else '1 or 2'} only, not 0; use a ZeRO-{saved_stage} config"
        )
    if state["world_size"] != world_size and max(saved_stage, zero_stage) >= 1 and not universal:
        raise CheckpointError(
            f"{path} was saved by {state['world_size']} ranks with ZeRO stage {saved_stage}, and this run has "
            f"{world_size}; partitioned optimizer state only loads at the same data-parallel size. Reshard it with "
            f"`growlm-grow {path} <new>` (DeepSpeed's ds_to_universal plus growlm's state; then --resume <new>) "
            "or run with the saved world size"
        )
