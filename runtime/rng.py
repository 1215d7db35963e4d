"""A process's random number generators (python, numpy, torch CPU and CUDA) as tensors and numbers only, so a
checkpoint's ``rng_state_rank{r}.pt`` loads with ``torch.load(weights_only=True)``, and their restoration.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    """This process's RNG states as tensors and numbers only (loadable with ``weights_only=True``): python
    ``random`` (version, int64 key, gauss), numpy's legacy MT19937 (key, pos, has_gauss, cached_gaussian), torch CPU
    and (if present) CUDA."""
    version, key, gauss = random.getstate()
    kind, np_key, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state = {
        "python": {"version": version, "key": torch.tensor(key, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "kind": kind,
            "key": torch.from_numpy(np_key.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` returned (or the pickled tuples of files written before this version)."""
    py, npy = state["python"], state["numpy"]
    if isinstance(py, dict):
        py = (py["version"], tuple(int(v) for v in py["key"].tolist()), py["gauss"])
    if isinstance(npy, dict):
        key = npy["key"].numpy().astype(np.uint32)
        npy = (npy["kind"], key, npy["pos"], npy["has_gauss"], npy["cached_gaussian"])
    random.setstate(py)
    np.random.set_state(npy)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def rng_file(tag_dir: str | os.PathLike, rank: int) -> Path:
    """The RNG state file of rank ``rank`` in a checkpoint's tag folder."""
    return Path(tag_dir) / f"rng_state_rank{rank}.pt"
