"""Opening, saving and resuming DeepSpeed checkpoints with growlm's run state, atomically and without unsafe pickles.

A checkpoint is DeepSpeed's own tag folder (``engine.save_checkpoint``: module, ZeRO optimizer partitions, LR
scheduler, loss scaler) plus growlm's files inside it:

* ``growlm_state.json``: the run state DeepSpeed does not know (runtime.run_state.RunState). The same object is
  DeepSpeed's client state.
* ``rng_state_rank{r}.pt``: per-rank RNG states (python, numpy, torch CPU and accelerator), tensors and numbers only
  (runtime.rng).
* ``growlm_manifest.json``: size and sha256 of every other file (runtime.manifest), hashed by the ranks in
  parallel, each its share (runtime.checkpoint_shares), and written by rank 0.

Nothing is ever overwritten or half-written: ranks write into ``.tmp-<tag>``, rank 0 renames it to ``<tag>`` once
every rank has finished (runtime.atomic.commit_dir), and only then replaces the ``latest`` pointer. A crash leaves at
most a ``.tmp-*`` folder, which is never listed as a tag nor opened (``resolve`` refuses it), and which the next
save of that tag replaces; tests/distributed/test_crash_safety.py kills saves with SIGKILL at runtime.crash_points.

Every ``*.pt`` file growlm reads, and every one it hands to DeepSpeed's own loaders (``engine.load_checkpoint``,
``zero_to_fp32``, ``ds_to_universal``, which unpickle without restriction), is first unpickled here with
``torch.load(weights_only=True)`` and an allow-list of the few DeepSpeed and numpy types genuine checkpoints hold
(``SAFE_GLOBALS``), memory-mapped so tensor data is not read: a file that would run code when unpickled is refused
before anything executes it. ``open_checkpoint`` is the one way a checkpoint is opened by one process
(growlm-grow, growlm-eval); a resume opens it with ``open_for_resume`` before the ranks join (sizes only) and
checks it with ``verify_shares`` after, each rank the files it loads.
"""

from __future__ import annotations

import copyreg
import enum
import functools
import os
import pickle
import re
import shlex
import shutil
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from growlm.runtime import collectives, peers
from growlm.runtime.atomic import (
    TMP_PREFIX,
    atomic_path,
    commit_dir,
    failure_reason,
    fix_mode,
    fresh_dir,
    unfinished,
    write_error,
    write_text,
)
from growlm.runtime.checkpoint_shares import VERIFY_MARGIN_S, share_timeout_s, split_files, tag_files
from growlm.runtime.crash_points import hold_point
from growlm.runtime.manifest import (
    ManifestError,
    Verification,
    check_sizes,
    hash_files,
    read_manifest,
    verify_files,
    verify_manifest,
    write_manifest,
)
from growlm.runtime.rng import rng_file, rng_state, set_rng_state
from growlm.runtime.run_state import STATE_FILE, STATE_FORMAT, RunState, RunStateError

__all__ = [
    "STATE_FILE",
    "STATE_FORMAT",
    "LATEST",
    "CheckpointError",
    "CheckpointSaveError",
    "OpenCheckpoint",
    "open_checkpoint",
]

LATEST = "latest"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used as asked; the message names the path and the fix."""


class CheckpointSaveError(CheckpointError):
    """A save that failed while writing (disk full, quota, permissions); nothing of it is left behind."""


def tag_for(global_step: int) -> str:
    """DeepSpeed-style tag of the checkpoint taken after ``global_step`` optimizer steps."""
    return f"global_step{global_step}"


def existing_tags(save_dir: str | os.PathLike) -> list[str]:
    """Finished checkpoint tags in ``save_dir`` (folders holding growlm_state.json; not the ``.tmp-``/``.old-``
    folders of an unfinished or interrupted save), in step order: a tag's trailing number counts as a number
    (``global_step9`` before ``global_step11``), ties and other names by name."""
    p = Path(save_dir)
    if not p.is_dir():
        return []
    return sorted((q.name for q in p.iterdir() if (q / STATE_FILE).is_file() and not unfinished(q)), key=_tag_order)


def _tag_order(name: str) -> tuple[str, int, str]:
    """Sort key of a tag: (its text before a trailing number, that number or -1, the name)."""
    m = re.fullmatch(r"(.*?)(\d+)", name)
    return (m.group(1), int(m.group(2)), name) if m else (name, -1, name)


def resolve(path: str | os.PathLike) -> tuple[Path, str]:
    """(checkpoint folder, tag) named by ``path``: a tag folder, a checkpoint folder with a ``latest`` file, or a
    run folder whose ``checkpoints/`` is one.

    Raises:
        CheckpointError: nothing there, no ``latest`` pointer, the tag it names is missing, or the tag folder has no
            ``growlm_state.json`` (not a growlm checkpoint, or an unfinished save), or it is (inside) a ``.tmp-``
            or ``.old-`` folder (``unfinished``).
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{p}: no such file or folder; give a checkpoint folder or one of its tags")
    for q in (p, *p.resolve().parents[:2]):  # the tag, its checkpoint folder, the run folder
        if unfinished(q):
            raise CheckpointError(
                f"{p}: {q.name} is the temporary folder of a save that did not finish (the process writing it "
                "stopped before renaming it into place); it is never loaded: use the checkpoint's 'latest' or a "
                "finished tag, or run the command that wrote it again"
            )
    if (p / STATE_FILE).is_file():
        return p.parent, p.name
    if not (p / LATEST).is_file() and (p / "checkpoints").is_dir():
        return resolve(p / "checkpoints")
    if not (p / LATEST).is_file():
        tags = existing_tags(p)
        hint = f"; tags found: {', '.join(tags)} (pass one of them, e.g. {p / tags[-1]})" if tags else ""
        raise CheckpointError(
            f"{p}: no '{LATEST}' file and no {STATE_FILE} here, so nothing to load: not a growlm checkpoint{hint}"
        )
    tag = (p / LATEST).read_text().strip()
    if not (p / tag / STATE_FILE).is_file():
        raise CheckpointError(f"{p}: '{LATEST}' names tag {tag!r} but {p / tag / STATE_FILE} is missing")
    return p, tag


# ----- safe unpickling --------------------------------------------------------------------------------------------


@functools.cache
def deepspeed_stand_ins() -> dict[type, str]:
    """Stand-in class -> the DeepSpeed type it replaces in weights-only unpickling (the dotted name a pickle holds):
    the loss scalers, the ZeRO stage enum and the fragment addresses that DeepSpeed's optimizer states hold.

    Importing DeepSpeed for the real types took about half a second of every growlm-grow; a stand-in gets the same
    state (BUILD sets its ``__dict__``; the enum's value), so readers use the attributes as they would the real
    object's (``frag.start``, ``scaler.cur_scale``, ``int(stage)``). The classes are made here, inside a function,
    so the plain pickler refuses them ("Can't pickle local object"): a file that holds one is written with
    ``save_with_deepspeed_names``, under DeepSpeed's names, as DeepSpeed itself would have written the real
    object (tests/unit/test_offline_startup.py compares the bytes)."""

    class LossScaler:
        """Stands in for deepspeed.runtime.fp16.loss_scaler.LossScaler (see ``deepspeed_stand_ins``)."""

    class DynamicLossScaler:
        """Stands in for deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler (see ``deepspeed_stand_ins``)."""

    class fragment_address:  # noqa: N801 (DeepSpeed's own name)
        """Stands in for deepspeed.utils.tensor_fragment.fragment_address (see ``deepspeed_stand_ins``)."""

    members = {"disabled": 0, "optimizer_states": 1, "gradients": 2, "weights": 3, "max_stage": 3}
    zero_stage = enum.IntEnum("ZeroStageEnum", members, module=__name__, qualname="deepspeed_stand_ins.ZeroStageEnum")
    return {
        LossScaler: "deepspeed.runtime.fp16.loss_scaler.LossScaler",
        DynamicLossScaler: "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
        zero_stage: "deepspeed.runtime.zero.config.ZeroStageEnum",
        fragment_address: "deepspeed.utils.tensor_fragment.fragment_address",
    }


class _DeepSpeedNamesPickler(pickle._Pickler):
    """The pickler of ``save_with_deepspeed_names``: Python's own (protocol 2, as torch.save), except that a
    stand-in of ``deepspeed_stand_ins`` is written as the DeepSpeed object it stands for: its class as DeepSpeed's
    global, its state as ``object.__reduce_ex__`` (or the enum's value) gives it."""

    def reducer_override(self, obj: Any) -> Any:
        cls = type(obj)
        if cls not in deepspeed_stand_ins():
            return NotImplemented
        if issubclass(cls, enum.Enum):
            return cls, (obj._value_,)
        return copyreg.__newobj__, (cls,), obj.__dict__ or None

    def save_global(self, obj: Any, name: str | None = None) -> None:
        dotted = deepspeed_stand_ins().get(obj)
        if dotted is None:
            super().save_global(obj, name)
            return
        module, _, qualname = dotted.rpartition(".")
        self.write(pickle.GLOBAL + module.encode("ascii") + b"\n" + qualname.encode("ascii") + b"\n")
        self.memoize(obj)


_DEEPSPEED_NAMES = types.ModuleType("growlm_deepspeed_names")  # torch.save's pickle_module: its Pickler only
_DEEPSPEED_NAMES.Pickler = _DeepSpeedNamesPickler  # type: ignore[attr-defined]


def save_with_deepspeed_names(obj: Any, f: Any) -> None:
    """``torch.save(obj, f)`` (a path or a binary file), the stand-ins of ``deepspeed_stand_ins`` in ``obj`` written
    under DeepSpeed's names: the same bytes torch.save writes for the real DeepSpeed objects."""
    torch.save(obj, f, pickle_module=_DEEPSPEED_NAMES)


def _safe_globals() -> list[Any]:
    """The types a genuine checkpoint's pickles may build: DeepSpeed's loss scalers, ZeRO stage enum and fragment
    addresses (optimizer states), built as their stand-ins (``deepspeed_stand_ins``: DeepSpeed is not imported),
    and numpy's array reconstruction (RNG files written before this version)."""
    core = getattr(np, "_core", None) or np.core
    return [
        *deepspeed_stand_ins().items(),
        core.multiarray._reconstruct,
        np.ndarray,
        np.dtype,
        type(np.dtype(np.uint32)),
    ]


def safe_load(path: str | os.PathLike, what: str = "checkpoint file", *, mmap: bool = False) -> Any:
    """``torch.load(path, weights_only=True)`` on CPU with the allow-list of ``_safe_globals``.

    Args:
        path: a ``.pt`` file.
        what: what the file is, for the error message.
        mmap: memory-map tensor data instead of reading it (zip-format files; others are read normally).

    Raises:
        CheckpointError: the file is missing; it holds a pickled object outside the allow-list (nothing of it is
            executed: the message names the file and the object); or it is truncated or damaged.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: the checkpoint is incomplete ({what})")
    try:
        with torch.serialization.safe_globals(_safe_globals()):
            try:
                return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
            except RuntimeError as e:
                if not mmap or "mmap" not in str(e):
                    raise
                return torch.load(path, map_location="cpu", weights_only=True)  # a legacy (non-zip) file
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        if found:  # the weights-only unpickler met a callable or class outside the allow-list
            raise CheckpointError(
                f"{path}: refusing to load it: it holds a pickled object that is not plain tensor data "
                f"({found.group(1)}). growlm unpickles only tensors, numbers and a few known DeepSpeed types; use "
                "checkpoints only from a trusted source"
            ) from None
        why = re.search(r"WeightsUnpickler error:\s*(.+?)\n\n", str(e), re.S)
        raise CheckpointError(
            f"{path} cannot be read ({why.group(1).strip() if why else 'UnpicklingError'}); the file is truncated, "
            "damaged or not a plain tensor file, and was not unpickled"
        ) from None
    except Exception as e:  # torch raises RuntimeError, EOFError, ... for damaged files
        why = f"{type(e).__name__}: {e}"
        raise CheckpointError(f"{path} cannot be read ({why}); the file is truncated or damaged") from e


def check_pickles(tag_dir: str | os.PathLike) -> int:
    """Unpickle every ``*.pt`` file under ``tag_dir`` with ``safe_load`` (memory-mapped), so DeepSpeed's unrestricted
    loaders only ever see files that hold tensor data and allow-listed types. Returns the number of files checked.

    Raises:
        CheckpointError: a file is refused or damaged (see ``safe_load``).
    """
    files = sorted(p for p in Path(tag_dir).rglob("*.pt") if not p.name.startswith(TMP_PREFIX))
    for p in files:
        safe_load(p, "checkpoint file", mmap=True)
    return len(files)


# ----- opening ----------------------------------------------------------------------------------------------------


def read_state(
    ckpt_dir: str | os.PathLike, tag: str, *, verify: bool = True, verifying: Verification | None = None
) -> RunState:
    """The RunState stored with a checkpoint, after (``verify``) checking the tag folder against its manifest.
    ``verifying``: that check already started in the background (runtime.manifest.Verification); its verdict is
    taken when it is of this tag folder, else the folder is hashed here.

    Raises:
        CheckpointError: the file is missing, not JSON, not a growlm run state, or a file does not match the
            manifest (truncated, missing, mixed in from another checkpoint).
    """
    path = Path(ckpt_dir) / tag / STATE_FILE
    try:
        state = RunState.from_json(path.read_text())
    except FileNotFoundError as e:
        raise CheckpointError(f"{path} is missing; this folder is not a finished growlm checkpoint") from e
    except (RunStateError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} {e}") from e
    if verify:  # growlm_manifest.json (sizes + sha256): a truncated, missing or mixed-in file fails here
        try:
            tag_dir = Path(ckpt_dir) / tag
            if verifying is not None and verifying.covers(tag_dir):
                verifying.result()
            else:
                verify_manifest(tag_dir)
        except ManifestError as e:
            raise CheckpointError(str(e)) from e
    return state


@dataclass(frozen=True)
class OpenCheckpoint:
    """A checked checkpoint: its folder, tag and run state."""

    ckpt_dir: Path
    tag: str
    state: RunState

    @property
    def tag_dir(self) -> Path:
        """The tag folder ``ckpt_dir / tag``."""
        return self.ckpt_dir / self.tag


def open_checkpoint(
    path: str | os.PathLike,
    *,
    verify: bool = True,
    check_files: bool = True,
    verifying: Verification | None = None,
) -> OpenCheckpoint:
    """Open the checkpoint named by ``path`` (see ``resolve``): the one entry point of resume, growlm-grow and
    growlm-eval. Checks the manifest (``verify``; ``verifying``: that check started earlier, see ``read_state``),
    reads the RunState, and (``check_files``) refuses any ``*.pt`` file that is not plain tensor data
    (``check_pickles``), before anything else loads from it.

    Raises:
        CheckpointError: see ``resolve``, ``read_state`` and ``safe_load``.
    """
    ckpt_dir, tag = resolve(path)
    state = read_state(ckpt_dir, tag, verify=verify, verifying=verifying)
    if check_files:
        check_pickles(ckpt_dir / tag)
    return OpenCheckpoint(ckpt_dir, tag, state)


def open_for_resume(path: str | os.PathLike) -> OpenCheckpoint:
    """Open the checkpoint named by ``path`` for a resume, before the ranks have joined: ``resolve``, the RunState,
    and the manifest read and every file it lists present at its listed size (a stat each; no file's content is
    read). The contents (sha256) and the pickles are checked after the ranks join, each rank its share
    (``verify_shares``), so a job reads each file about once however many ranks it has.

    Raises:
        CheckpointError: see ``resolve`` and ``read_state``; the manifest is damaged, or a listed file is missing
            or of another size.
    """
    ckpt_dir, tag = resolve(path)
    state = read_state(ckpt_dir, tag, verify=False)
    try:
        files = read_manifest(ckpt_dir / tag)
        if files is not None:
            check_sizes(ckpt_dir / tag, files)
    except ManifestError as e:
        raise CheckpointError(str(e)) from e
    return OpenCheckpoint(ckpt_dir, tag, state)


def verify_shares(ckpt: OpenCheckpoint, *, rank: int, world_size: int) -> list[str]:
    """Check a checkpoint opened with ``open_for_resume`` before it is loaded, each rank its share of the files (a
    collective): the files this rank loads and only those (``split_files``: its own optimizer shard and RNG file at
    the saved world size) plus its part of the shared ones, by size and sha256 against the manifest and, for
    ``*.pt`` files, by the weights-only unpickling (``safe_load``, memory-mapped). The verdicts are exchanged
    (``collectives.all_gather_object_within``, with a limit from the largest share: ``share_timeout_s``), so no rank
    loads anything before every file has passed, and each rank reads its share only: the bytes a rank reads do not
    grow with the world size. A checkpoint without a manifest gets the pickle checks only.

    Returns:
        The files this rank checked (relative paths).

    Raises:
        CheckpointError: on every rank, naming the first failing rank's first bad file (missing, truncated,
            damaged, mixed in, or holding a pickled object outside the allow-list); or a rank did not report in
            time.
    """
    tag_dir = ckpt.tag_dir
    files = read_manifest(tag_dir)  # every rank reads the same small file (open_for_resume parsed it)
    if files is not None:
        sizes = {rel: int(f["bytes"]) for rel, f in files.items()}
    else:  # an old checkpoint: rank 0's listing, so that every rank splits the same list
        sizes = collectives.broadcast_object(tag_files(tag_dir) if rank == 0 else None, src=0)
    same_world = ckpt.state.world_size == world_size and not ckpt.state.universal
    shares = split_files(sizes, world_size, by_name=same_world)
    mine, problem = shares[rank], ""
    try:
        if files is not None:
            verify_files(tag_dir, files, mine)
        for rel in mine:
            if rel.endswith(".pt"):
                safe_load(tag_dir / rel, "checkpoint file", mmap=True)
    except (ManifestError, CheckpointError) as e:
        problem = str(e)
    except OSError as e:
        problem = f"{tag_dir}: cannot read it ({e.strerror or e})"
    try:
        verdicts = collectives.all_gather_object_within(
            problem, share_timeout_s(sizes, shares), f"checking checkpoint {tag_dir}"
        )
    except TimeoutError as e:
        raise CheckpointError(f"{e}; is the checkpoint on a filesystem every rank reads?") from None
    for r, verdict in enumerate(verdicts):
        if verdict:
            raise CheckpointError(verdict if r == rank else f"{verdict} (found by rank {r})")
    return mine


# ----- save and load ----------------------------------------------------------------------------------------------


def save(engine: Any, save_dir: str | os.PathLike, state: RunState, *, rank: int) -> Path:
    """Save a checkpoint of ``engine`` and ``state`` as tag ``tag_for(state.global_step)``; a collective.

    Every rank writes its files into ``.tmp-<tag>``, then hashes its share of the folder (``split_files``: the
    files named for it, and the shared ones split by size) while the others hash theirs; the digests are gathered
    with a limit derived from the largest share's bytes (``share_timeout_s``), rank 0 writes the manifest from them,
    renames the folder into place and points ``latest`` at it, and every rank learns the outcome within a margin.

    Args:
        engine: the DeepSpeed engine (every rank calls this, as ``save_checkpoint`` requires).
        save_dir: checkpoint folder (created if needed).
        state: the run state; stored as growlm_state.json and as DeepSpeed client state ``growlm``.
        rank: this process's global rank.

    Returns:
        The finished tag folder.

    Raises:
        CheckpointError: that tag already exists (checkpoints are never overwritten); ``save_dir`` is not on a
            filesystem shared by every rank.
        CheckpointSaveError: writing failed (disk full, ...: ``save_failed_message``; torch's writer's RuntimeError
            read as the OSError behind it, ``write_error``); the unfinished ``.tmp-<tag>`` is removed, the earlier
            tags and ``latest`` are left as they were; a rank whose collective failed because the failing rank
            left raises the failing rank's message (``runtime.peers.tell``), so rank 0 ends with the disk's line
            whichever rank's write failed first (the others too while rank 0's store still answers). Also (every
            rank) when a rank could not read its share back, or did not report within its limit.
    """
    save_dir = Path(save_dir)
    tag = tag_for(state.global_step)
    final, tmp_tag = save_dir / tag, f"{TMP_PREFIX}{tag}"
    tmp_dir = save_dir / tmp_tag
    world = collectives.world_size() if collectives.is_initialized() else 1
    # rank 0 decides and every rank learns it, so all refuse at once: a folder that some node sees differently (not
    # shared, NFS attribute caching) would otherwise leave the others waiting in the barrier below for the timeout
    exists = f"{final} already exists; refusing to overwrite it (use another output folder)" if final.exists() else ""
    if world > 1:
        exists = collectives.broadcast_object(exists, src=0)
    if exists:
        raise CheckpointError(exists)
    try:
        if rank == 0:
            fresh_dir(final)  # empty .tmp-<tag> (a crashed save may have left one), with the umask's mode
        collectives.barrier()
        doc = state.to_json()
        engine.save_checkpoint(str(save_dir), tag=tmp_tag, client_state={"growlm": doc}, save_latest=False)
        with atomic_path(rng_file(tmp_dir, rank), overwrite=True) as tmp:
            torch.save(rng_state(), tmp)
        if rank == 0:
            write_text(tmp_dir / STATE_FILE, state.dumps(), overwrite=True)
        hold_point(f"checkpoint.written:{tag}")  # test-only (runtime.crash_points): a rank lost mid-save
        collectives.barrier()
    except Exception as e:  # disk full, quota, permissions; or a rank lost meanwhile (the barrier failed)
        failed = write_error(e, save_dir)  # read before the half-written .tmp-<tag> goes (it holds the space)
        # the first rank whose write failed names the cause for all, before the folder goes (a rank still writing
        # there fails next) and before it leaves (a rank waiting in a collective fails next): runtime.peers.tell
        topic = f"checkpoint {tag}"
        message = peers.tell(topic, save_failed_message(failed, final)) if failed is not None else peers.told(topic)
        if not final.exists():  # every rank: one still writing when another's failure removed it makes it again
            shutil.rmtree(tmp_dir, ignore_errors=True)  # everything else stays
        if message is None:
            raise
        raise CheckpointSaveError(message) from None
    # every rank hashes the files it wrote (its shards and RNG file; the shared ones split by size), all at once;
    # rank 0 writes the manifest from the gathered digests (rank 0's listing: every rank splits the same list)
    listing: tuple[dict[str, int], str] = ({}, "")
    if rank == 0:
        try:
            listing = (tag_files(tmp_dir), "")
        except OSError as e:
            listing = ({}, f"rank 0 could not list {tmp_dir} ({e.strerror or e})")
    sizes, problem = collectives.broadcast_object(listing, src=0)
    shares = split_files(sizes, world)
    hashed: dict[str, tuple[int, str]] = {}
    try:
        hashed = hash_files(tmp_dir, shares[rank])
    except OSError as e:
        problem = problem or (
            f"rank {rank} could not read back {tmp_dir / Path(e.filename or '').name} ({e.strerror or e}) while "
            "hashing its share; if the ranks run on several nodes, put --out_dir on a filesystem all of them share"
        )
    try:
        digests = collectives.all_gather_object_within(
            (hashed, problem), share_timeout_s(sizes, shares), f"hashing checkpoint {tag}"
        )
    except TimeoutError as e:
        raise CheckpointSaveError(f"{e}; the unfinished save {tmp_dir} is left for the next save to replace") from None
    verdict = next((p for _, p in digests if p), "")
    if rank == 0 and not verdict:
        verdict = _commit(save_dir, tmp_dir, final, {rel: d for h, _ in digests for rel, d in h.items()})
    if verdict and rank == 0 and not final.exists():
        shutil.rmtree(tmp_dir, ignore_errors=True)
    try:  # rank 0's manifest and rename are its own small work: a margin, not the group's timeout
        verdict = collectives.all_gather_object_within(verdict, VERIFY_MARGIN_S, f"committing checkpoint {tag}")[0]
    except TimeoutError as e:
        raise CheckpointSaveError(f"{e}; {final} may be unfinished") from None
    if verdict.startswith("exists:"):
        raise CheckpointError(verdict.removeprefix("exists:"))
    if verdict:
        raise CheckpointSaveError(verdict)
    # DeepSpeed writes the module states on rank 0 only, so every rank must see rank 0's folder: a save_dir that is
    # not shared by all nodes cannot be resumed, and every rank says so (no rank waits for another that failed)
    seen = collectives.all_reduce(torch.tensor([int((final / STATE_FILE).is_file())]), op="min")
    if not int(seen):
        raise CheckpointError(
            f"{final} is not visible on every node: put --out_dir on a filesystem that all nodes share"
        )
    return final


def _commit(save_dir: Path, tmp_dir: Path, final: Path, known: dict[str, tuple[int, str]]) -> str:
    """Rank 0's end of a save: the manifest from the ranks' digests (``known``; a file none of them hashed is hashed
    here), then ``tmp_dir`` renamed to ``final`` and ``latest`` pointed at it. Returns "" when done, else the
    failure's one-line message ("exists:" first when ``final`` appeared meanwhile)."""
    try:
        write_manifest(tmp_dir, known)
        hold_point(f"checkpoint.commit:{final.name}")  # test-only (runtime.crash_points): a kill here loses nothing
        try:
            commit_dir(tmp_dir, final)
        except FileExistsError:
            return f"exists:{final} already exists; refusing to overwrite it (use another folder)"
        write_text(save_dir / LATEST, final.name, overwrite=True)
        for script in save_dir.glob("zero_to_*.py"):  # DeepSpeed's recovery scripts: 0744 -> the umask's 0755
            fix_mode(script)
    except OSError as e:
        return save_failed_message(e, final)
    return ""


def save_failed_message(e: OSError, final: Path) -> str:
    """The one-line message of a save that failed with ``e`` while writing the tag folder ``final``."""
    why = failure_reason(e)
    earlier = (final.parent / LATEST).is_file()
    then = f"--resume {shlex.quote(str(final.parent))}" if earlier else "run again"
    return (
        f"{why} while saving checkpoint {final.name} into {final.parent}: the unfinished save was removed"
        f"{', the earlier checkpoints and ' + repr(LATEST) + ' are untouched' if earlier else ''}; free space there "
        f"(or use an --out_dir on another disk) and {then}"
    )


def load(engine: Any, ckpt: OpenCheckpoint, *, rank: int, world_size: int) -> RunState:
    """Load an opened checkpoint into ``engine`` (module, optimizer, LR scheduler, loss scaler) and restore this
    rank's RNG (when the world size is the saved one).

    The caller has opened it with ``open_checkpoint``, or ``open_for_resume`` and ``verify_shares`` (manifest and
    pickles checked) and checked, with ``runtime.resume_checks.check_compatible``, that it fits the engine. DeepSpeed's
    ``load_checkpoint`` unpickles its files without restriction: ``open_checkpoint`` has refused any that is not
    plain tensor data.

    Returns:
        The checkpoint's RunState.

    Raises:
        CheckpointError: DeepSpeed loaded nothing, or this rank's RNG file is refused (``safe_load``).
    """
    groups = engine.optimizer.param_groups
    weight_decays = [g.get("weight_decay") for g in groups]
    path, _client = engine.load_checkpoint(
        str(ckpt.ckpt_dir), tag=ckpt.tag, load_optimizer_states=True, load_lr_scheduler_states=True
    )
    if path is None:
        raise CheckpointError(f"DeepSpeed loaded nothing from {ckpt.tag_dir}; the checkpoint is incomplete")
    # DeepSpeed's ZeRO-3 universal loader copies param group 0's hyperparameters onto every group, which would give
    # biases and LayerNorm gains group 0's weight decay; each group keeps its own
    for group, weight_decay in zip(engine.optimizer.param_groups, weight_decays, strict=True):
        if weight_decay is not None:
            group["weight_decay"] = weight_decay
    from growlm.runtime.engine import repair_adam_steps  # lazy: process-group imports, a resume's only

    repair_adam_steps(engine)  # ZeRO-3 universal loads share one Adam step tensor between groups
    if ckpt.state.world_size == world_size:
        rng_path = rng_file(ckpt.tag_dir, rank)
        if rng_path.is_file() or not ckpt.state.universal:  # missing: refused by safe_load, naming the file
            set_rng_state(safe_load(rng_path, f"rank {rank}'s RNG state"))
    return ckpt.state
