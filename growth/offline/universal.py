"""DeepSpeed universal checkpoints on disk: a ParamStore over their per-parameter folders and the rewrite of their
small metadata files for a grown model.

Layout of a universal tag folder (DeepSpeed 0.19, ``deepspeed.checkpoint.ds_to_universal``; DESIGN.md, "DeepSpeed
facts"):

    <tag>/zero/<param name>/fp32.pt, exp_avg.pt, exp_avg_sq.pt (+ step.pt)   one folder per parameter
    <tag>/zero/optimizer_state.pt      loss scaler, clip_grad, param_groups (lr, betas, ...); ZeRO-3: the Adam step
    <tag>/*model_states.pt             lr_scheduler, global_steps, param_shapes, client state (module: unused)

ZeRO-1/2 store ``{"param": tensor of the parameter's shape, "cat_dim": 0}`` per file and the Adam step in
``step.pt``; ZeRO-3 stores bare flat 1-D tensors and keeps the step in optimizer_state.pt. DeepSpeed's universal
loaders never read the module weights of ``*model_states.pt`` (weights come from ``fp32.pt``), and the ZeRO-3 loader
does not check sizes, so this module checks every tensor's element count against the config itself.

Only this module, growth/offline/shards.py (the native ZeRO shards) and runtime/checkpoint.py know DeepSpeed's file
layout. growlm-grow writes universal checkpoints itself (growth/offline/pipeline.py), without DeepSpeed's
``ds_to_universal``, which only the tests and the benchmark that compare against it run. Every file written here can
be hashed while it is written (``Written``), so the checkpoint's manifest (runtime.manifest) does not read the files
a second time.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from growlm.growth.errors import GrowthError
from growlm.growth.ops.stores import ParamState
from growlm.runtime.checkpoint import CheckpointError, safe_load, save_with_deepspeed_names

MOMENT_KEYS = ("fp32", "exp_avg", "exp_avg_sq")
OPTIMIZER_STATE = "optimizer_state.pt"
LATEST_UNIVERSAL = "latest_universal"


def load_file(path: Path, what: str) -> Any:
    """A checkpoint file, memory-mapped, unpickled with ``weights_only=True`` (runtime.checkpoint.safe_load).

    Raises:
        CheckpointError: the file is missing, damaged, or holds a pickled object outside the allow-list.
    """
    return safe_load(path, what, mmap=True)


_MAX_OPEN = 64  # files written but not yet fsynced (open descriptors) at most
_MAX_QUEUED = 3  # files handed to the writer threads and not yet written (one parameter's fp32, exp_avg, exp_avg_sq)
_WRITERS = 2  # writer threads
_SYNCERS = 4  # fsync threads


class Written:
    """The files written into one tag folder, off the caller's thread: ``_WRITERS`` writer threads save the objects
    (while the caller computes the next parameter; torch ops, file writes and hashing release the GIL), then hash
    the file they just wrote, read back from the page cache, and record its size and sha256 (for
    runtime.manifest.write_manifest(known=...), which then does not read the files again; hashing inside the write
    path, through a wrapper of the file, was the slower way); ``_SYNCERS`` further threads fsync the written files
    (concurrent fsyncs share the disk's cache flushes), so the final sync of runtime.atomic.commit_dir finds them
    already on disk. At most ``_MAX_QUEUED`` objects wait for the writers (memory: a few tensors of the largest
    parameters). ``wait()`` before reading a written file or writing the manifest; it re-raises an error of any
    thread.

    Args:
        tag_dir: the tag folder the recorded paths are relative to.
    """

    def __init__(self, tag_dir: Path) -> None:
        self.tag_dir = Path(tag_dir)
        self.hashes: dict[str, tuple[int, str]] = {}
        self._writer = ThreadPoolExecutor(max_workers=_WRITERS, thread_name_prefix="growlm-write")
        self._syncer = ThreadPoolExecutor(max_workers=_SYNCERS, thread_name_prefix="growlm-fsync")
        self._queued: list[Future] = []
        self._syncing: list[Future] = []

    def save(self, obj: Any, path: Path) -> None:
        """Queue ``torch.save(obj, path)`` (hashed while written, then fsynced); ``obj`` must not change after."""
        self._queued.append(self._writer.submit(self._save_now, obj, Path(path)))
        while len(self._queued) > _MAX_QUEUED:
            self._queued.pop(0).result()

    def _save_now(self, obj: Any, path: Path) -> None:
        """Writer thread: save one file, hash it as written (read back from the page cache), then hand it to the
        fsync thread. Saved through a Python file object, so that a full disk or a write error is Python's OSError
        with its errno (torch's own path writer reports only "iostream error")."""
        f = open(path, "w+b")  # noqa: SIM115 (closed by the fsync thread)
        try:
            save_with_deepspeed_names(obj, f)  # the loss scaler and ZeRO stage read as stand-ins: DeepSpeed's names
            f.flush()
            f.seek(0)
            h = hashlib.sha256()
            nbytes = 0
            while chunk := f.read(1 << 22):
                h.update(chunk)
                nbytes += len(chunk)
        except BaseException:
            f.close()
            raise
        self.hashes[path.relative_to(self.tag_dir).as_posix()] = (nbytes, h.hexdigest())
        self._syncing.append(self._syncer.submit(_fsync_close, f))
        while len(self._syncing) > _MAX_OPEN:  # each pending fsync holds a file descriptor open
            self._syncing.pop(0).result()

    def wait(self) -> None:
        """Wait until every queued file is written and fsynced; raises the first error of the threads."""
        try:
            for fut in self._queued:
                fut.result()
        finally:
            self._queued.clear()
        try:
            for fut in list(self._syncing):
                fut.result()
        finally:
            self._syncing.clear()

    def close(self) -> None:
        """Wait for the writes and fsyncs and stop both threads."""
        try:
            self.wait()
        finally:
            self._writer.shutdown()
            self._syncer.shutdown()


def _fsync_close(f: Any) -> None:
    try:
        os.fsync(f.fileno())
    finally:
        f.close()


def save(obj: Any, path: Path, written: Written | None = None) -> None:
    """``torch.save(obj, path)``, through ``written`` (on its writer threads, hashed, fsynced in the background) if
    given; DeepSpeed objects read as stand-ins are written under DeepSpeed's names (runtime.checkpoint.
    save_with_deepspeed_names)."""
    if written is None:
        save_with_deepspeed_names(obj, path)
    else:
        written.save(obj, path)


def _owned(t: Tensor) -> Tensor:
    """``t`` detached, contiguous, and owning exactly its storage (torch.save writes a view's whole storage)."""
    t = t.detach().contiguous()
    if t.untyped_storage().nbytes() != t.numel() * t.element_size() or t.storage_offset():
        t = t.clone()
    return t


class UniversalStore:
    """ParamStore over ``<tag>/zero/`` of a universal checkpoint; holds no tensor between calls.

    Args:
        zero_dir: the ``zero`` folder.
        shapes: name -> shape of every parameter (growth.ops.rules.param_shapes of the config), in the model's order.
        flat: ZeRO-3 layout (bare flat tensors, no step.pt) instead of ZeRO-1/2 (dicts, step.pt).
        step: the Adam step tensor written as ``step.pt`` (ZeRO-1/2 writes).
        written: the output's ``Written`` (hash while writing, background fsync); None: plain torch.save.

    Reads return fp32 tensors of ``shapes[name]``; writes refuse another shape. Reading raises CheckpointError for
    a missing, unreadable or wrongly sized file (a checkpoint of another model, a truncated file).
    """

    def __init__(
        self,
        zero_dir: str | os.PathLike,
        shapes: dict[str, tuple[int, ...]],
        *,
        flat: bool,
        step: Tensor | None = None,
        written: Written | None = None,
    ) -> None:
        self.zero_dir = Path(zero_dir)
        self.shapes = dict(shapes)
        self.flat = flat
        self.step = step
        self.written = written

    def names(self) -> list[str]:
        return list(self.shapes)

    def read_tensor(self, name: str, key: str) -> Tensor:
        """One of fp32 / exp_avg / exp_avg_sq of ``name``, as an fp32 tensor of the parameter's shape."""
        shape = self.shapes[name]
        path = self.zero_dir / name / f"{key}.pt"
        if self.written is not None:
            self.written.wait()  # the file may still be queued for writing
        obj = load_file(path, f"{key} of {name}")
        t = obj.get("param") if isinstance(obj, dict) else obj
        if not isinstance(t, Tensor):
            raise CheckpointError(f"{path} holds no tensor; it is not a universal-checkpoint file")
        if t.numel() != math.prod(shape):
            raise CheckpointError(
                f"{path} holds {t.numel()} elements ({tuple(t.shape)}), but {name} of this model has shape {shape} "
                f"({math.prod(shape)}): the checkpoint belongs to another model config or is damaged"
            )
        return t.detach().reshape(shape).to(torch.float32, copy=True)

    def read(self, name: str) -> ParamState:
        if name not in self.shapes:
            raise KeyError(name)
        return ParamState(*(self.read_tensor(name, k) for k in MOMENT_KEYS))

    def write(self, name: str, state: ParamState) -> None:
        shape = self.shapes[name]
        for kind, t in zip(MOMENT_KEYS, state, strict=True):
            if tuple(t.shape) != shape:
                raise GrowthError(f"{name}: {kind} of shape {tuple(t.shape)}, the grown model needs {shape}")
        folder = self.zero_dir / name
        folder.mkdir(parents=True, exist_ok=True)
        for key, t in zip(MOMENT_KEYS, state, strict=True):
            t = _owned(t.to(torch.float32))
            self._save(t.reshape(-1) if self.flat else {"cat_dim": 0, "param": t}, folder / f"{key}.pt")
        if not self.flat:
            step = self.step if self.step is not None else torch.tensor(0.0)
            self._save(step.clone(), folder / "step.pt")

    def _save(self, obj: Any, path: Path) -> None:
        save(obj, path, self.written)

    def write_tied(self, name: str, weight: Tensor) -> None:
        """A weights-only folder for a tied alias (``lm_head.weight``), as ds_to_universal writes it."""
        folder = self.zero_dir / name
        folder.mkdir(parents=True, exist_ok=True)
        w = _owned(weight.to(torch.float32))
        self._save(w.reshape(-1) if self.flat else {"param": w}, folder / "fp32.pt")

    def release(self, name: str) -> None:
        pass


def check_numel(path: Path, numel: int, name: str) -> None:
    """Check the element count of a universal tensor file, read memory-mapped (nothing is loaded).

    Raises:
        CheckpointError: the file is missing, damaged, holds no tensor, or holds another number of elements.
    """
    obj = load_file(path, f"{path.stem} of {name}")
    t = obj.get("param") if isinstance(obj, dict) else obj
    if not isinstance(t, torch.Tensor) or t.numel() != numel:
        got = t.numel() if isinstance(t, torch.Tensor) else type(t).__name__
        raise CheckpointError(f"{path}: {got} elements, {name} of the checkpoint's model config has {numel}")


def copy_rng_files(src_tag: Path, dst_tag: Path) -> None:
    """Copy the per-rank RNG state files of a tag folder (a grown or resharded checkpoint keeps them)."""
    for rng in Path(src_tag).glob("rng_state_rank*"):
        shutil.copy2(rng, Path(dst_tag) / rng.name)


# ----- metadata -----------------------------------------------------------------------------------------------------


def model_states_files(tag_dir: Path) -> list[Path]:
    """The ``*model_states.pt`` files of a DeepSpeed tag folder (one, or one per rank at ZeRO-3)."""
    return sorted(Path(tag_dir).glob("*model_states.pt"))


def adam_step(zero_dir: Path, names: list[str], flat: bool) -> Tensor:
    """The Adam step (bias-correction count) saved in a universal checkpoint."""
    if flat:
        sd = load_file(zero_dir / OPTIMIZER_STATE, "optimizer global state")
        try:
            return torch.as_tensor(sd["optimizer_state_dict"]["state"][0]["step"]).clone()
        except (KeyError, TypeError) as e:
            raise CheckpointError(f"{zero_dir / OPTIMIZER_STATE} holds no Adam step ({e})") from e
    for name in names:
        if (zero_dir / name / "step.pt").is_file():
            return torch.as_tensor(load_file(zero_dir / name / "step.pt", "Adam step")).clone()
    raise CheckpointError(f"{zero_dir}: no step.pt in any parameter folder; the checkpoint holds no Adam state")


def lr_scheduler_state(tag_dir: Path) -> dict | None:
    """The LR scheduler state saved in a tag folder's model states, or None.

    Raises:
        CheckpointError: the folder has no model-states file."""
    files = model_states_files(tag_dir)
    if not files:
        raise CheckpointError(f"{tag_dir} holds no *model_states.pt file; the checkpoint is incomplete")
    return load_file(files[0], "model states").get("lr_scheduler")


def param_shape_groups(shapes: dict[str, tuple[int, ...]]) -> list[OrderedDict]:
    """DeepSpeed's ``param_shapes`` for growlm's two AdamW groups (train.param_groups): dim >= 2, then the rest."""
    return [
        OrderedDict((k, torch.Size(s)) for k, s in shapes.items() if len(s) >= 2),
        OrderedDict((k, torch.Size(s)) for k, s in shapes.items() if len(s) < 2),
    ]


def write_model_states(
    src_tag: Path,
    dst_tag: Path,
    *,
    shapes: dict[str, tuple[int, ...]],
    buffers: dict[str, Tensor] | None,
    last_batch_iteration: int | None,
    client_state: dict[str, Any],
    written: Written | None = None,
) -> None:
    """Copy every ``*model_states.pt`` of ``src_tag`` into ``dst_tag`` for the grown (or resharded) model: ``module``
    holds only the model's buffers (``buffers``, the growth masks; None keeps each file's own buffers): universal
    loading takes the weights from zero/; ``param_shapes`` the new shapes, ``lr_scheduler`` the placed position,
    ``growlm`` the new training state. Read memory-mapped, so the old module weights of ZeRO-1/2 files are never
    brought into memory (nor copied: a 51M-parameter fp32 model's 204 MB). ``written``: see ``save``."""
    for src in model_states_files(src_tag):
        sd = load_file(src, "model states")
        if buffers is None:
            own = {k: v for k, v in (sd.get("module") or {}).items() if k in set(sd.get("buffer_names") or [])}
        sd = {k: v for k, v in sd.items() if k != "module"}
        keep = own if buffers is None else buffers
        sd["module"] = OrderedDict((k, _owned(v)) for k, v in keep.items())
        sd["buffer_names"] = list(keep)
        sd["param_shapes"] = param_shape_groups(shapes)
        if last_batch_iteration is not None and isinstance(sd.get("lr_scheduler"), dict):
            sd["lr_scheduler"] = {**sd["lr_scheduler"], "last_batch_iteration": last_batch_iteration}
        sd["growlm"] = client_state
        save(sd, dst_tag / src.name, written)


def read_optimizer_state(zero_dir: Path) -> dict[str, Any]:
    """``zero/optimizer_state.pt`` of a universal checkpoint (loss scaler, clip_grad, param_groups, ...).

    Raises:
        CheckpointError: the file is missing or damaged."""
    return dict(load_file(Path(zero_dir) / OPTIMIZER_STATE, "optimizer global state"))


def write_optimizer_state(
    sd: dict[str, Any], dst_zero: Path, *, lr: float | None, flat: bool, step: Tensor, written: Written | None = None
) -> None:
    """``zero/optimizer_state.pt`` from the saved global optimizer state ``sd`` (``read_optimizer_state``, or
    growth.offline.shards.ZeroShardStore.optimizer_state): the loss scaler and hyperparameters carried, the LR of the
    first post-growth step set (``lr``; None keeps the saved one). For ZeRO-3 any old rank-0 partition tensors (old
    shapes) are dropped; only the Adam step the loader reads is kept. ``written``: see ``save``."""
    sd = dict(sd)

    def set_lr(groups: list[dict]) -> list[dict]:
        return [{**g, "lr": g["lr"] if lr is None else lr} for g in groups]

    if flat:
        osd = sd["optimizer_state_dict"]
        groups = set_lr(osd["param_groups"])
        sd.pop("fp32_flat_groups", None)
        sd["optimizer_state_dict"] = {
            "state": {i: {"step": step.clone()} for i in range(len(groups))},
            "param_groups": groups,
        }
    else:
        sd["param_groups"] = set_lr(sd["param_groups"])
    dst_zero.mkdir(parents=True, exist_ok=True)
    save(sd, dst_zero / OPTIMIZER_STATE, written)
