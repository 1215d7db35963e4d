"""Offline growth: grow a saved ZeRO-1/2/3 checkpoint into one that resumes at any world size, or only reshard it.

How (DESIGN.md, "Architecture"): one pass over the parameters. Each old parameter is read whole, straight out of the
native ZeRO shards (growth.offline.shards.ZeroShardStore: the merge DeepSpeed's ``ds_to_universal`` performs, without
its temporary files) or out of a universal checkpoint's per-parameter files; the stage's growth plan expands it
(growth.ops.apply.apply_rules; an identity copy when only resharding) and it is written as the universal checkpoint's
per-parameter files (growth.offline.universal.UniversalStore), hashed while written for the manifest. Memory: a few full
tensors of the largest parameter, never the model. The small metadata files are written for the grown model (LR
placement, Adam step, loss scaler, param shapes) and growlm_state.json records the grown config, masks, consumed
samples, the schedule and the growth history. Every check runs before anything is written (growth.ops.preparation.
prepare_growth, the same checks as a live growth); the output is built in a temporary sibling folder with a sha256
manifest and renamed into place only when complete (runtime.atomic); the input is never modified. The command line
is growth/offline/cli.py.
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm import tqdm

from growlm.growth.errors import GrowthError
from growlm.growth.offline.shards import ZeroShardStore
from growlm.growth.offline.universal import (
    LATEST_UNIVERSAL,
    UniversalStore,
    Written,
    adam_step,
    check_numel,
    copy_rng_files,
    lr_scheduler_state,
    model_states_files,
    read_optimizer_state,
    write_model_states,
    write_optimizer_state,
)
from growlm.growth.ops.apply import apply_rules
from growlm.growth.ops.preparation import GrowthPrep, prepare_growth, same_shape
from growlm.growth.ops.rules import param_shapes
from growlm.growth.ops.stores import ParamState
from growlm.model.config import ModelConfig, largest_param_numel, param_count
from growlm.model.masks import MaskSpec, mask_values, new_unit_flags
from growlm.runtime import atomic, checkpoint, memory
from growlm.runtime.atomic import atomic_dir
from growlm.runtime.checkpoint import CheckpointError
from growlm.runtime.crash_points import hold_point
from growlm.runtime.lock import LockHeldError, output_held_message, output_lock
from growlm.runtime.manifest import Verification, write_manifest
from growlm.runtime.run_state import RunState, RunStateError
from growlm.runtime.schedule import checkpoint_schedule

if TYPE_CHECKING:  # the annotations only: a reshard needs no plan (its pydantic and yaml imports)
    from growlm.growth.stages.plan import Stage

SUPPORTED_STAGES = (1, 2, 3)


@dataclass(frozen=True)
class Source:
    """A checked input checkpoint: where it is, its growlm state and its layout."""

    ckpt_dir: Path
    tag: str
    state: RunState
    config: ModelConfig
    universal: bool  # already in universal layout (an output of growlm-grow)

    @property
    def tag_dir(self) -> Path:
        return self.ckpt_dir / self.tag

    @property
    def zero_stage(self) -> int:
        return self.state.zero_stage


def open_source(path: str | os.PathLike, verifying: Verification | None = None) -> Source:
    """Resolve and check an input checkpoint (manifest, growlm state, ZeRO stage, shard files). ``verifying``: the
    manifest check already started (runtime.manifest.Verification, see runtime.checkpoint.open_checkpoint).

    Raises:
        CheckpointError: nothing there, no such tag, not a growlm checkpoint, a stage universal checkpoints do not
            support (0), or shard files missing.
    """
    p = Path(path)
    if p.is_dir() and not (p / checkpoint.STATE_FILE).is_file() and not (p / checkpoint.LATEST).is_file():
        if any(p.glob("*optim_states.pt")) or any(p.glob("*model_states.pt")):
            raise CheckpointError(
                f"{p} is a DeepSpeed checkpoint without growlm_state.json, so its model config is unknown; "
                "growlm-grow needs a checkpoint written by growlm's train.py (for a plain DeepSpeed checkpoint use "
                f"`python -m deepspeed.checkpoint.ds_to_universal --input_folder {p} --output_folder OUT "
                "--inject_missing_state`)"
            )
    ckpt = checkpoint.open_checkpoint(p, verifying=verifying)  # the manifest, the RunState and every pickle checked
    state = ckpt.state
    src = Source(ckpt.ckpt_dir, ckpt.tag, state, state.model_config, state.universal)
    if src.universal:
        if not (src.tag_dir / "zero").is_dir():
            raise CheckpointError(f"{src.tag_dir} is marked universal but has no zero/ folder; it is incomplete")
        return src
    if src.zero_stage not in SUPPORTED_STAGES:
        raise CheckpointError(
            f"{src.tag_dir} was saved at ZeRO stage {src.zero_stage}; growlm-grow supports ZeRO stages "
            f"{', '.join(map(str, SUPPORTED_STAGES))} only (DeepSpeed's universal checkpoints do not support stage 0, "
            "DeepSpeed #7200). Resume it at its own world size and save it again with a ZeRO-1/2/3 config"
        )
    world = state.world_size
    missing = []
    for r in range(world):
        optim = list(src.tag_dir.glob(f"*zero_pp_rank_{r}_mp_rank_*_optim_states.pt"))
        if not optim:
            missing.append(f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
    if not list(src.tag_dir.glob("*model_states.pt")):
        missing.append("mp_rank_00_model_states.pt")
    if missing:
        raise CheckpointError(
            f"{src.tag_dir} was written by {world} ranks but lacks {', '.join(missing)}; the checkpoint is incomplete"
        )
    return src


def check_overlap(out: Path, src: Source) -> None:
    """Refuse an output that is the input, an ancestor of it, or lies inside its tag folder (replacing it, or the
    writer lock beside it, would touch the input).

    Raises:
        CheckpointError: names both folders.
    """
    out_r, tag_r, ck_r = out.resolve(), src.tag_dir.resolve(), src.ckpt_dir.resolve()
    for inp in (tag_r, ck_r):  # replacing out must not touch the input: not the input, an ancestor, or inside a tag
        if out_r == inp or out_r in inp.parents or tag_r in out_r.parents:
            raise CheckpointError(f"output {out} overlaps the input checkpoint {inp}; choose a folder outside it")


@contextmanager
def one_writer(out: Path, what: str) -> Iterator[None]:
    """Hold ``out``'s writer lock (runtime.lock.output_lock) for the block: a second growlm-grow or export of the same
    output is refused before it reads, deletes or writes anything there.

    Raises:
        CheckpointError: another process holds the lock (``output_held_message``: pid, host, start time), or the
            lock file cannot be created beside ``out``.
    """
    try:
        with output_lock(out):
            yield
    except LockHeldError as e:
        raise CheckpointError(output_held_message(what, out, e)) from None


def check_output(out: Path, src: Source, overwrite: bool, replaceable: Callable[[Path], None] | None = None) -> None:
    """Refuse an output that exists (unless ``overwrite``, and then only one growlm-grow wrote: ``replaceable(out)``,
    by default ``check_replaceable`` for a grown checkpoint) or that overlaps the input.

    Raises:
        CheckpointError: names the folder and the fix.
    """
    check_overlap(out, src)
    if out.exists() and not overwrite:
        raise CheckpointError(f"output {out} already exists; choose another folder or pass --overwrite to replace it")
    if overwrite:
        (replaceable or check_replaceable)(out)


def _grown_entry(entry: Path) -> bool:
    """Whether ``entry`` of an output folder is growlm-grow's: ``latest``, ``latest_universal`` or the tag folder of
    a universal growlm checkpoint."""
    if entry.name in (checkpoint.LATEST, LATEST_UNIVERSAL):
        return True
    try:
        return entry.is_dir() and RunState.from_json((entry / checkpoint.STATE_FILE).read_text()).universal
    except (OSError, RunStateError):
        return False


def check_replaceable(out: Path) -> None:
    """Refuse to let ``--overwrite`` replace ``out`` unless growlm-grow wrote it: missing, an empty folder, or a
    checkpoint folder with growlm-grow's ``latest_universal`` marker holding nothing but ``latest``,
    ``latest_universal`` and tag folders of universal growlm checkpoints. A user's folder, a training run's
    checkpoints or an output a user added files to is never deleted (the rule: runtime.atomic.check_replaceable).

    Raises:
        CheckpointError: ``out`` is a file or a link, or a folder that is not (only) a growlm-grow output.
    """
    atomic.check_replaceable(
        out,
        what="a growlm-grow output",
        marker=LATEST_UNIVERSAL,
        owned=_grown_entry,
        foreign="entries growlm-grow did not write",
        fix="choose another output folder, or move it away yourself",
        error=CheckpointError,
    )


def check_target_stage(src: Source, target_zero_stage: int | None) -> None:
    """Refuse a ZeRO stage the resuming job cannot load ``src``'s universal checkpoint at (None: no check).

    Raises:
        CheckpointError: the target stage is not 1-3, or crosses between stages 1/2 and 3.
    """
    if target_zero_stage is not None and (
        target_zero_stage not in SUPPORTED_STAGES or (target_zero_stage == 3) != (src.zero_stage == 3)
    ):
        raise CheckpointError(
            f"{src.tag_dir} was saved at ZeRO stage {src.zero_stage}; its universal checkpoint loads at ZeRO stage "
            f"{'3' if src.zero_stage == 3 else '1 or 2'} only, not {target_zero_stage} (DeepSpeed's universal "
            "loaders do not cross between stages 1/2 and 3, and stage 0 has none)"
        )


def check_fits_machine(src: Source, target: ModelConfig, out: Path) -> None:
    """Refuse, before any tensor is read or anything written, a growth (or reshard: ``target`` is ``src.config``) that
    cannot fit this machine: its host working set (runtime.memory.offline_growth_host_bytes: the largest old and
    grown parameters' fp32 state, as the one-parameter-at-a-time pass holds them) against the host memory free now,
    and the output checkpoint's size (runtime.memory.universal_checkpoint_bytes; ZeRO-1/2 add the tied
    ``lm_head.weight`` alias of a tied head) against the free space of ``out``'s filesystem.

    Raises:
        GrowthError: names the figures in GiB and the fix.
    """
    what = f"growing {src.config.shape_str()} into {target.shape_str()} offline"
    if same_shape(src.config, target):
        what = f"resharding {src.config.shape_str()}"
    need = memory.offline_growth_host_bytes(largest_param_numel(src.config), largest_param_numel(target))
    have = memory.rank_memory_bytes(torch.device("cpu"), free=True)
    if need > have:
        raise GrowthError(
            f"{what} needs about {need / memory.GIB:,.1f} GiB of host memory (the largest parameter's fp32 weight "
            f"and Adam moments, old and grown), and this machine has {have / memory.GIB:,.1f} GiB free: choose a "
            "smaller target, or free memory"
        )
    tied = target.vocab_size * target.n_embd if src.zero_stage != 3 and target.tied_head else 0
    msg = memory.disk_shortfall(
        memory.universal_checkpoint_bytes(param_count(target), tied),
        out,
        f"{what} writes a checkpoint that",
        "choose a smaller target, or an output folder on a disk with room",
    )
    if msg:
        raise GrowthError(msg)


def prepare_offline(src: Source, stage: Stage, seed: int) -> GrowthPrep:
    """The growth preparation (growth.ops.preparation.prepare_growth) of ``stage`` applied to checkpoint ``src``: its
    shape,
    masks and LR schedule (position read from the saved LR scheduler state) at its global step.

    Raises:
        GrowthError: see ``prepare_growth``.
        CheckpointError: the checkpoint has no model-states file.
    """
    state, step = src.state, src.state.global_step
    stage = replace(stage, target=replace(stage.target, dropout=src.config.dropout))
    masks = state.growth_masks
    lbi = (lr_scheduler_state(src.tag_dir) or {}).get("last_batch_iteration")
    saved = asdict(state.schedule) if state.schedule is not None else None
    sched = checkpoint_schedule(saved, state.ds_config, lbi) if lbi is not None else None
    return prepare_growth(
        stage.rules(src.config, seed),
        src.config,
        step,
        masks=masks,
        schedule=sched,
        rule=stage.schedule,
        ramp_steps=stage.ramp_steps or None,
    )


def mask_buffers(masks: MaskSpec | None, cfg: ModelConfig, step: int) -> dict[str, torch.Tensor]:
    """The grown model's mask buffers at ``step`` (what ``build_model(cfg, masks).set_growth_step(step)`` holds)."""
    if masks is None or masks.value(step) >= 1.0:
        return {}
    return {name: mask_values(is_new, masks.value(step)) for name, is_new in new_unit_flags(masks, cfg).items()}


class ProgressStore:
    """The grown checkpoint's store, with a terminal progress bar (tqdm, on stderr) advanced by every parameter
    written: bytes written of all (weight and both Adam moments, fp32), the rate, the time left, and parameters done
    of all. A context manager (the bar closes on exit); every other call goes to ``store``.

    Args:
        store: the store written (growth.offline.universal.UniversalStore).
        show: show the bar; None: only when stderr is a terminal, as the training bar.
    """

    def __init__(self, store: UniversalStore, show: bool | None = None) -> None:
        self.store = store
        self.total = len(store.names())
        self.done = 0
        nbytes = sum(12 * math.prod(shape) for shape in store.shapes.values())
        self.bar = tqdm(total=nbytes, unit="B", unit_scale=True, unit_divisor=1024, desc="growlm-grow",
                        disable=not (sys.stderr.isatty() if show is None else show), file=sys.stderr,
                        dynamic_ncols=True, mininterval=0.5, postfix=f"0/{self.total} parameters")  # fmt: skip

    def __enter__(self) -> ProgressStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()

    def names(self) -> list[str]:
        return self.store.names()

    def read(self, name: str) -> ParamState:
        return self.store.read(name)

    def write(self, name: str, state: ParamState) -> None:
        self.store.write(name, state)
        self.done += 1
        self.bar.set_postfix_str(f"{self.done}/{self.total} parameters", refresh=False)
        self.bar.update(sum(4 * t.numel() for t in state))

    def release(self, name: str) -> None:
        self.store.release(name)


@dataclass
class OldState:
    """What the rewrite reads from the input: its parameters (a ParamStore), the Adam step, and the global optimizer
    state (loss scaler, clip_grad, param_groups) of ``zero/optimizer_state.pt``."""

    store: Any
    step: torch.Tensor
    optimizer: dict[str, Any]


@contextmanager
def open_old(src: Source, *, aliased: bool = False) -> Iterator[OldState]:
    """The parameters and optimizer state of ``src``: its native ZeRO shards read directly (memory-mapped), or its
    universal files. Every tensor's element count is checked against ``src``'s config before anything is written.
    ``aliased``: shard reads may be the file's own bytes (ZeroShardStore's ``aliased``: for a reshard, which
    changes nothing it reads).

    Raises:
        CheckpointError: a shard or file is missing, damaged, of another model, or holds no Adam state.
    """
    shapes, flat = param_shapes(src.config), src.zero_stage == 3
    if not src.universal:
        store = ZeroShardStore(
            src.tag_dir, shapes, zero_stage=src.zero_stage, world=src.state.world_size, aliased=aliased
        )
        try:
            yield OldState(store, store.adam_step(), store.optimizer_state())
        finally:
            store.close()
        return
    zero = src.tag_dir / "zero"
    step = adam_step(zero, list(shapes), flat)  # raises when no Adam state was saved
    for name, shape in shapes.items():
        for key in ("fp32", "exp_avg", "exp_avg_sq"):
            check_numel(zero / name / f"{key}.pt", math.prod(shape), name)
    yield OldState(UniversalStore(zero, shapes, flat=flat), step, read_optimizer_state(zero))


def growth_record(src: Source, stage: Stage, prep: GrowthPrep, first_lr: float | None) -> dict[str, Any]:
    """The entry this growth adds to growlm_state.json's ``growth`` history."""
    return {
        "step": prep.step,
        "stage": stage.name,
        "family": prep.plan.family,
        "exact": prep.plan.exact,
        "from": src.config.to_dict(),
        "to": prep.plan.new.to_dict(),
        "optimizer": {"moments": stage.optimizer.moments, "fresh_exp_avg_sq": stage.optimizer.fresh_exp_avg_sq},
        "schedule": vars(stage.schedule).copy(),
        "first_lr": first_lr,
    }


def tied_aliases(src: Source) -> dict[str, str]:
    """alias -> parameter of the tied weights (``lm_head.weight`` -> the token embedding,
    the config's ``embedding_name``) that get a weights-only folder, as ds_to_universal writes them: ZeRO-1/2 and
    a tied head only."""
    if src.zero_stage == 3 or not src.config.tied_head:
        return {}
    if src.universal:
        has = (src.tag_dir / "zero" / "lm_head.weight").is_dir()
        return {"lm_head.weight": src.config.embedding_name} if has else {}
    shared = checkpoint.safe_load(model_states_files(src.tag_dir)[0], "model states", mmap=True).get("shared_params")
    return dict(shared or {})


def first_lr(src: Source, prep: GrowthPrep | None) -> float | None:
    """The LR of the first post-growth step when the growth places or re-warms the schedule; None leaves it to the
    resuming run's config."""
    if prep is None or not prep.schedule_changed:
        return None
    return float(src.state.ds_config["optimizer"]["params"]["lr"]) * prep.schedule.ratio(prep.step)


def write_params(
    src: Source,
    old: OldState,
    new_tag: Path,
    stage: Stage | None,
    prep: GrowthPrep | None,
    written: Written,
    log: Any,
    progress: bool | None = None,
) -> None:
    """The per-parameter files of ``new_tag/zero`` (grown by ``prep``'s plan, or copied when ``prep`` is None), the
    tied ``lm_head.weight`` alias ds_to_universal writes for ZeRO-1/2, and ``zero/optimizer_state.pt``.
    ``progress``: show a progress bar (``ProgressStore``; None: when stderr is a terminal)."""
    cfg = prep.plan.new if prep is not None else src.config
    flat = src.zero_stage == 3
    new_store = UniversalStore(new_tag / "zero", param_shapes(cfg), flat=flat, step=old.step, written=written)
    t = time.perf_counter()
    with ProgressStore(new_store, show=progress) as shown:
        if prep is not None:
            apply_rules(prep.plan, old.store, shown, stage.optimizer)
        else:
            for name in shown.names():
                shown.write(name, old.store.read(name))
    for alias, target in tied_aliases(src).items():  # what ds_to_universal writes for them (weights only)
        new_store.write_tied(alias, new_store.read_tensor(target, "fp32"))
    log(f"growlm-grow: wrote {len(new_store.names())} parameters ({time.perf_counter() - t:.1f} s)")
    lr = first_lr(src, prep)
    write_optimizer_state(old.optimizer, new_tag / "zero", lr=lr, flat=flat, step=old.step, written=written)


def new_run_state(src: Source, stage: Stage | None, prep: GrowthPrep | None, stages_done: int | None) -> RunState:
    """growlm_state.json of the output: universal, and when grown the new config, masks, schedule, history and
    (``stages_done`` not None) the plan stages done (``growth_stage``)."""
    state = replace(src.state, universal=True, zero_stage=src.zero_stage)
    if prep is None:
        return state
    if stages_done is not None:
        state = replace(state, growth_stage=stages_done)
    return replace(
        state,
        schedule=prep.schedule if prep.schedule_changed else state.schedule,
        model_config=prep.plan.new,
        growth_masks=prep.masks,
        growth=[*state.growth, growth_record(src, stage, prep, first_lr(src, prep))],
    )


def write_tag(
    src: Source,
    new_tag: Path,
    stage: Stage | None,
    prep: GrowthPrep | None,
    log: Any,
    stages_done: int | None = None,
    progress: bool | None = None,
) -> RunState:
    """Write the whole universal tag folder ``new_tag`` (parameters, metadata, RNG files, growlm_state.json and the
    manifest) in one pass over the input; returns its run state. ``progress``: see ``write_params``."""
    new_tag.mkdir(parents=True)
    written = Written(new_tag)
    cfg = prep.plan.new if prep is not None else src.config
    new_state = new_run_state(src, stage, prep, stages_done)
    try:
        with open_old(src, aliased=prep is None) as old:  # a reshard copies each tensor as it is read
            write_params(src, old, new_tag, stage, prep, written, log, progress)
        write_model_states(
            src.tag_dir,
            new_tag,
            shapes=param_shapes(cfg),
            buffers=mask_buffers(prep.masks, cfg, prep.step) if prep is not None else None,
            last_batch_iteration=prep.schedule.last_batch_iteration if prep and prep.schedule is not None else None,
            client_state=new_state.to_json(),
            written=written,
        )
    finally:
        written.close()
    copy_rng_files(src.tag_dir, new_tag)
    hold_point("grow.commit")  # test-only (runtime.crash_points): killed here, no output may appear
    (new_tag / checkpoint.STATE_FILE).write_text(new_state.dumps())  # inside the uncommitted folder
    write_manifest(new_tag, known=written.hashes)
    return new_state


def grow_checkpoint(
    src: Source,
    out: Path,
    stage: Stage | None,
    *,
    seed: int = 0,
    overwrite: bool = False,
    target_zero_stage: int | None = None,
    log: Any = print,
    stages_done: int | None = None,
    progress: bool | None = None,
) -> Path:
    """Write the grown (``stage``) or only resharded (``stage`` None) checkpoint of ``src`` to ``out``.

    Returns:
        ``out`` (a checkpoint folder with ``latest``), loadable by ``train.py --resume out`` at any world size.
        With ``stages_done`` (the plan's stages done once ``stage`` is, as growlm-run passes) the grown
        growlm_state.json records it as ``growth_stage``, so ``train.py --growth_plan`` resumes at the next stage.

    Raises:
        CheckpointError, GrowthError, ManifestError: bad input, found before anything is written to ``out``; or
            another process is writing ``out`` (its writer lock, ``one_writer``: refused before ``out`` is looked at).
        GrowthError: the growth does not fit this machine's free host memory or ``out``'s free disk space
            (``check_fits_machine``: before any tensor is read).
    """
    t0 = time.perf_counter()
    check_target_stage(src, target_zero_stage)
    check_fits_machine(src, stage.target if stage is not None else src.config, out)
    prep = prepare_offline(src, stage, seed) if stage is not None else None
    check_overlap(out, src)  # before the lock: its file goes beside out
    with one_writer(out, "output"):
        check_output(out, src, overwrite)  # under the lock: no other writer changes out until we are done
        with atomic_dir(out, overwrite=overwrite) as tmp:
            new_tag = tmp / src.tag
            if prep is None and src.universal:  # reshard of a universal checkpoint: a copy
                shutil.copytree(src.tag_dir, new_tag, ignore=shutil.ignore_patterns("growlm_manifest.json", ".tmp-*"))
                hold_point("grow.commit")  # test-only (runtime.crash_points): killed here, no output may appear
                write_manifest(new_tag)
            else:
                write_tag(src, new_tag, stage, prep, log, stages_done, progress)
            (tmp / LATEST_UNIVERSAL).write_text(src.tag)
            (tmp / checkpoint.LATEST).write_text(src.tag)  # the pointer, last
    what = f"grown to {prep.plan.new.shape_str()}" if prep is not None else "resharded"
    # the source's own config (stage, precision): the default bf16 config would resume an fp32 run in bf16
    config = f" --ds_config ds_configs/zero{src.zero_stage}_{src.state.precision}.json" if src.state.precision else ""
    log(
        f"growlm-grow: wrote {out / src.tag} ({what}; {time.perf_counter() - t0:.1f} s); resume it with "
        f"`train.py --resume {shlex.quote(str(out))}{config}` at any world size, ZeRO stage "
        f"{'3' if src.zero_stage == 3 else '1 or 2'}"
    )
    return out
