"""Read a native DeepSpeed ZeRO-1/2/3 checkpoint's optimizer shards directly, one full parameter at a time.

growlm-grow used to run DeepSpeed's ``ds_to_universal`` (which writes every parameter's fragments to a temporary
folder, merges them into per-parameter files, and copies the metadata) and then rewrote every file a second time
for the grown model. ``ZeroShardStore`` instead reads each parameter's fragments out of the rank files themselves and
hands full fp32 tensors to growth.ops.apply, so the grown (or only resharded) universal checkpoint is written in one
pass
(growth/offline/pipeline.py). The merge is the one ``ds_to_universal`` performs (DeepSpeed 0.19; DESIGN.md, "DeepSpeed
facts"), and tests/distributed/test_grow_checkpoint.py checks it against ``ds_to_universal`` tensor by tensor:

- ZeRO-1/2 (``*zero_pp_rank_R_mp_rank_00_optim_states.pt``): per parameter group, each rank holds a contiguous slice
  of the group's flat fp32 / exp_avg / exp_avg_sq buffer (``single_partition_of_fp32_groups``,
  ``base_optimizer_state``) and ``param_slice_mappings`` names the ``fragment_address(start, numel)`` of every
  parameter piece in it; a parameter is its pieces in rank order, reshaped to its shape.
- ZeRO-3: per sub-group, every parameter of ``param_shapes`` (model-states file) occupies ``ceil(numel / dp)``
  elements of each rank's flat buffers (``fp32_flat_groups``, ``optimizer_state_dict.state``), the last rank's piece
  padded; a parameter is the unpadded pieces in rank order, flat.

The rank files are memory-mapped (``safe_load(mmap=True)``: weights-only unpickling, nothing executed) and the pages
of each piece are handed back to the kernel once copied (``madvise(MADV_DONTNEED)`` on Linux; the mapping is never
written), so the resident memory stays at a few tensors of the largest parameter, not the checkpoint. A reshard
(``aliased``) does not copy a parameter that one rank holds whole: it hands on the mapped bytes themselves
(``mapped_alias``), whose pages go back once the file written from them is done with them.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from growlm.growth.ops.stores import ParamState
from growlm.runtime.checkpoint import CheckpointError, safe_load

MOMENT_KEYS = ("fp32", "exp_avg", "exp_avg_sq")
_MADV_DONTNEED = 4
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def drop_pages(t: Tensor) -> None:
    """Return the resident pages of a read-only memory-mapped tensor to the kernel (they are re-read from the file
    if touched again). Never call it on memory that was written: private pages would be discarded."""
    nbytes = t.numel() * t.element_size()
    if _LIBC is None or nbytes == 0:
        return
    start = t.data_ptr() // mmap.PAGESIZE * mmap.PAGESIZE
    _LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(t.data_ptr() + nbytes - start), _MADV_DONTNEED)


def mapped_alias(t: Tensor) -> Tensor:
    """A flat tensor over exactly the bytes of the contiguous, read-only memory-mapped ``t``, not copied: it has a
    storage of its own (torch.save writes a tensor's whole storage, and ``t`` is a slice of a rank's flat buffer),
    which does not own the memory. ``t`` (so the file's mapping) lives as long as that storage, whichever tensors
    (views, the alias itself) share it and whichever thread drops the last of them; then the pages go back to the
    kernel (``drop_pages``). The alias must never be written: the mapping is the file's."""
    nbytes = t.numel() * t.element_size()
    # the storage holds the buffer object until it is freed (torch.frombuffer), and the finalizer holds t until the
    # buffer object goes: a finalizer on the alias tensor instead would release t while a detached tensor sharing its
    # storage (what the universal writer saves) still reads it
    buffer = (ctypes.c_char * nbytes).from_address(t.data_ptr())
    weakref.finalize(buffer, drop_pages, t)
    return torch.frombuffer(buffer, dtype=t.dtype)


@dataclass(frozen=True)
class Piece:
    """One rank's contiguous piece of a parameter: elements [start, start + numel) of that rank's flat buffers of
    parameter group ``group``."""

    rank: int
    group: int
    start: int
    numel: int


def _rank_files(tag_dir: Path, world: int, kind: str) -> list[Path]:
    """``*zero_pp_rank_R_mp_rank_00_{kind}.pt`` of every rank R < ``world`` (bf16_ prefixed names included).

    Raises:
        CheckpointError: a rank's file is missing or present twice.
    """
    files = []
    for r in range(world):
        found = sorted(tag_dir.glob(f"*zero_pp_rank_{r}_mp_rank_00_{kind}.pt"))
        if len(found) != 1:
            raise CheckpointError(
                f"{tag_dir} was written by {world} ranks but holds {len(found)} files zero_pp_rank_{r}_mp_rank_00_"
                f"{kind}.pt; the checkpoint is incomplete or mixed"
            )
        files.append(found[0])
    return files


class ZeroShardStore:
    """Read-only ParamStore over a native ZeRO-1/2/3 tag folder saved by ``world`` ranks.

    Args:
        tag_dir: the tag folder (``global_stepN``).
        shapes: name -> shape of every parameter (growth.ops.rules.param_shapes of the checkpoint's config).
        zero_stage: 1, 2 or 3.
        world: the data-parallel world size it was saved with.
        aliased: a parameter held whole by one rank's fp32 buffers is read as ``mapped_alias`` of the file's
            bytes instead of copied (the resharding copy writes each parameter once and never changes it); False
            (default): every read is a new tensor the caller may change.

    ``read(name)`` returns fp32 tensors of ``shapes[name]``. Raises CheckpointError (at construction) when the
    shards do not hold exactly the parameters and element counts of ``shapes``: another model, or damaged files.
    """

    def __init__(
        self, tag_dir: Path, shapes: dict[str, tuple[int, ...]], *, zero_stage: int, world: int, aliased: bool = False
    ) -> None:
        self.tag_dir = Path(tag_dir)
        self.shapes = dict(shapes)
        self.zero_stage = zero_stage
        self.aliased = aliased
        files = _rank_files(self.tag_dir, world, "optim_states")
        self._osd = [safe_load(f, "optimizer states", mmap=True)["optimizer_state_dict"] for f in files]
        self._flat: list[dict[str, list[Tensor]]] = [self._flat_buffers(o) for o in self._osd]
        self.pieces = self._index_zero3(world) if zero_stage == 3 else self._index_zero12()
        self._check_index()

    # ----- layout -----------------------------------------------------------------------------------------------

    def _flat_buffers(self, osd: dict) -> dict[str, list[Tensor]]:
        """key -> one flat buffer per parameter group, of one rank."""
        try:
            if self.zero_stage == 3:
                state, fp32 = osd["optimizer_state_dict"]["state"], osd["fp32_flat_groups"]
            else:
                state, fp32 = osd["base_optimizer_state"]["state"], osd["single_partition_of_fp32_groups"]
            groups = range(len(fp32))
            return {
                "fp32": list(fp32),
                "exp_avg": [state[g]["exp_avg"] for g in groups],
                "exp_avg_sq": [state[g]["exp_avg_sq"] for g in groups],
            }
        except (KeyError, TypeError, IndexError) as e:
            raise CheckpointError(
                f"{self.tag_dir}: the ZeRO-{self.zero_stage} optimizer states lack {e}; the checkpoint holds no Adam "
                "state (saved without the optimizer?) or is damaged"
            ) from None

    def _index_zero12(self) -> dict[str, list[Piece]]:
        """name -> pieces, from every rank's ``param_slice_mappings``."""
        pieces: dict[str, list[Piece]] = {}
        for r, osd in enumerate(self._osd):
            for g, mapping in enumerate(osd.get("param_slice_mappings") or []):
                for name, frag in mapping.items():
                    pieces.setdefault(name, []).append(Piece(r, g, int(frag.start), int(frag.numel)))
        return pieces

    def _index_zero3(self, world: int) -> dict[str, list[Piece]]:
        """name -> pieces, from the sub-groups' ``param_shapes`` of rank 0's model-states file."""
        model_states = _rank_files(self.tag_dir, world, "model_states")[0]
        groups = safe_load(model_states, "model states", mmap=True).get("param_shapes") or []
        pieces: dict[str, list[Piece]] = {}
        for r, osd in enumerate(self._osd):
            meta = osd.get("ds_zero_partition_groups") or []
            for g, group_shapes in enumerate(groups):
                count = meta[g].get("partition_count", world) if g < len(meta) else world
                rank = meta[g].get("partition_rank", r) if g < len(meta) else r
                offset = 0
                for name, shape in group_shapes.items():
                    numel = math.prod(shape)
                    per_rank = math.ceil(numel / count)
                    keep = max(0, min(per_rank, numel - rank * per_rank))
                    pieces.setdefault(name, []).append(Piece(r, g, offset, keep))
                    offset += per_rank
        return pieces

    def _check_index(self) -> None:
        """Every parameter of ``shapes`` present with its element count, inside its rank's buffers; nothing else."""
        extra = sorted(set(self.pieces) - set(self.shapes))
        missing = sorted(set(self.shapes) - set(self.pieces))
        if extra or missing:
            raise CheckpointError(
                f"{self.tag_dir}: the optimizer shards hold parameters {extra[:3]} not in the checkpoint's model "
                f"config and lack {missing[:3]}: the shards belong to another model or are damaged"
            )
        for name, shape in self.shapes.items():
            total = sum(p.numel for p in self.pieces[name])
            for p in self.pieces[name]:
                size = self._flat[p.rank]["fp32"][p.group].numel() if p.group < len(self._flat[p.rank]["fp32"]) else -1
                if p.start < 0 or p.start + p.numel > size:
                    total = -1
            if total != math.prod(shape):
                raise CheckpointError(
                    f"{self.tag_dir}: the optimizer shards hold {total} elements of {name}, but its shape in the "
                    f"checkpoint's model config is {shape}: the shards belong to another model or are damaged"
                )

    # ----- ParamStore ---------------------------------------------------------------------------------------------

    def names(self) -> list[str]:
        return list(self.shapes)

    def read_tensor(self, name: str, key: str) -> Tensor:
        """One of fp32 / exp_avg / exp_avg_sq of ``name``: its pieces copied out in rank order, fp32, its shape (with
        ``aliased``, a parameter of one piece is the file's own bytes, ``mapped_alias``)."""
        pieces = self.pieces[name]
        if self.aliased and len(pieces) == 1:
            p = pieces[0]
            src = self._flat[p.rank][key][p.group].narrow(0, p.start, p.numel)
            if src.dtype == torch.float32 and src.is_contiguous() and src.numel() > 0:
                return mapped_alias(src.detach()).view(self.shapes[name])
        out = torch.empty(math.prod(self.shapes[name]), dtype=torch.float32)
        at = 0
        for p in self.pieces[name]:
            src = self._flat[p.rank][key][p.group].narrow(0, p.start, p.numel)
            out.narrow(0, at, p.numel).copy_(src)
            drop_pages(src)
            at += p.numel
        return out.view(self.shapes[name])

    def read(self, name: str) -> ParamState:
        if name not in self.shapes:
            raise KeyError(name)
        return ParamState(*(self.read_tensor(name, k) for k in MOMENT_KEYS))

    def write(self, name: str, state: ParamState) -> None:
        raise TypeError("ZeroShardStore is read-only: a native checkpoint is never modified")

    def release(self, name: str) -> None:
        pass

    # ----- global state -----------------------------------------------------------------------------------------

    def adam_step(self) -> Tensor:
        """The Adam step (bias-correction count) of rank 0's first parameter group.

        Raises:
            CheckpointError: no step was saved (an optimizer that never stepped).
        """
        state = self._osd[0]["optimizer_state_dict" if self.zero_stage == 3 else "base_optimizer_state"]["state"]
        try:
            return torch.as_tensor(state[0]["step"]).clone()
        except (KeyError, TypeError) as e:
            raise CheckpointError(f"{self.tag_dir}: the optimizer states hold no Adam step ({e})") from None

    def optimizer_state(self) -> dict[str, Any]:
        """The small ``zero/optimizer_state.pt`` of the universal checkpoint (what ds_to_universal writes, minus the
        rank-0 partition tensors that no universal loader reads): loss scaler, clip_grad, param_groups, and for
        ZeRO-3 ``optimizer_state_dict`` with the Adam step of every group."""
        osd = self._osd[0]
        if self.zero_stage == 3:
            groups = osd["optimizer_state_dict"]["param_groups"]
            out = {k: v for k, v in osd.items() if k not in ("optimizer_state_dict", "fp32_flat_groups")}
            out["optimizer_state_dict"] = {
                "state": {i: {"step": self.adam_step()} for i in range(len(groups))},
                "param_groups": groups,
            }
        else:
            sharded = ("base_optimizer_state", "param_slice_mappings", "single_partition_of_fp32_groups")
            groups = osd["base_optimizer_state"]["param_groups"]
            out = {k: v for k, v in osd.items() if k not in sharded}
        out["param_groups"] = groups
        return out

    def close(self) -> None:
        """Drop the memory maps (the rank files stay untouched)."""
        self._osd, self._flat = [], []
