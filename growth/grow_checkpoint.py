"""growlm-grow: grow a saved ZeRO checkpoint offline into one that resumes at any world size, or only reshard it, or
export its weights to a transformers GPT-2 folder.

    growlm-grow CKPT OUT --plan growth/plans/tiny_msg.yaml [--stage deeper]     grow by a plan file's stage
    growlm-grow CKPT OUT --family masked --n_layer 4 [--ramp_steps 100 ...]      grow by flags
    growlm-grow CKPT OUT                                                         reshard only (no growth)
    growlm-grow CKPT --export_hf HF_DIR                                          config.json + model.safetensors

CKPT is a checkpoint folder (its ``latest`` tag) or a tag folder written by train.py at ZeRO stage 1, 2 or 3 (or an
output of this command). OUT becomes a checkpoint folder ``OUT/<tag>`` + ``latest`` that ``train.py --resume OUT``
loads at any world size, at the saved ZeRO stage's family (1/2, or 3). How (DESIGN.md 4): DeepSpeed's
``ds_to_universal`` turns the native shards into one folder per parameter; the stage's growth plan then rewrites
them one parameter at a time (growth.apply.apply_plan over growth.universal.UniversalStore: memory about two full
tensors of the largest parameter, never the model); the small metadata files are rewritten for the grown model (LR
placement, Adam step, loss scaler, param shapes) and growlm_state.json records the grown config, masks, consumed
samples and the schedule. Everything is written under ``.tmp-<OUT name>`` beside OUT, with a sha256 manifest, and
renamed into place only when complete; bad input is refused before anything is written, and the input is never
modified.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from growth import ds_checkpoint
from growth.apply import OptimizerPolicy, apply_plan
from growth.ds_checkpoint import CheckpointError
from growth.errors import GrowthError
from growth.manifest import ManifestError, write_manifest
from growth.plan import GrowthPlan, check_plan, param_shapes
from growth.plan_file import Stage, Trigger, load_plan
from growth.schedule import ScheduleRule, ScheduleState, place_schedule
from growth.universal import (
    LATEST_UNIVERSAL,
    UniversalStore,
    adam_step,
    convert,
    load_file,
    lr_scheduler_state,
    write_model_states,
    write_optimizer_state,
)
from model.config import GPTConfig
from model.masks import MaskSpec, mask_values, new_unit_flags

SUPPORTED_STAGES = (1, 2, 3)
_SHAPE_FLAGS = ("n_layer", "n_embd", "n_head", "n_inner")


@dataclass(frozen=True)
class Source:
    """A checked input checkpoint: where it is, its growlm state and its layout."""

    ckpt_dir: Path
    tag: str
    state: dict[str, Any]
    config: GPTConfig
    universal: bool  # already in universal layout (an output of growlm-grow)

    @property
    def tag_dir(self) -> Path:
        return self.ckpt_dir / self.tag

    @property
    def zero_stage(self) -> int:
        return int(self.state["zero_stage"])


def _same_shape(a: GPTConfig, b: GPTConfig) -> bool:
    return replace(a, dropout=0.0) == replace(b, dropout=0.0)


def open_source(path: str | os.PathLike) -> Source:
    """Resolve and check an input checkpoint (manifest, growlm state, ZeRO stage, shard files).

    Raises:
        CheckpointError: nothing there, no such tag, not a growlm checkpoint, a stage universal checkpoints do not
            support (0), or shard files missing.
    """
    p = Path(path)
    if p.is_dir() and not (p / ds_checkpoint.STATE_FILE).is_file() and not (p / ds_checkpoint.LATEST).is_file():
        if any(p.glob("*optim_states.pt")) or any(p.glob("*model_states.pt")):
            raise CheckpointError(
                f"{p} is a DeepSpeed checkpoint without growlm_state.json, so its model config is unknown; "
                "growlm-grow needs a checkpoint written by growlm's train.py (for a plain DeepSpeed checkpoint use "
                f"`python -m deepspeed.checkpoint.ds_to_universal --input_folder {p} --output_folder OUT "
                "--inject_missing_state`)"
            )
    ckpt_dir, tag = ds_checkpoint.resolve(p)
    state = ds_checkpoint.read_state(ckpt_dir, tag)  # verifies the manifest when there is one
    try:
        cfg = GPTConfig.from_dict(state["model_config"])
    except (KeyError, ValueError, TypeError) as e:
        raise CheckpointError(f"{ckpt_dir / tag}/growlm_state.json has no valid model_config ({e})") from e
    src = Source(ckpt_dir, tag, state, cfg, bool(state.get("universal")))
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
    world = int(state["world_size"])
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


# ----- the growth stage ----------------------------------------------------------------------------------------------


def stage_from_plan_file(path: str, name: str | None, cfg: GPTConfig) -> tuple[Stage, int]:
    """The stage of a plan file that grows ``cfg`` (by ``name``, or the first whose start shape is ``cfg``), and
    the plan's seed.

    Raises:
        GrowthError: the file is invalid, has no such stage, or does not chain from ``cfg``.
    """
    try:
        sched = load_plan(path)
    except OSError as e:
        raise GrowthError(f"--plan {path}: {e.strerror}") from e
    current, starts = sched.start, []
    for stage in sched.stages:
        starts.append((stage.name, current))
        if (name is None or stage.name == name) and _same_shape(current, cfg):
            return stage, sched.seed
        if stage.name == name:
            raise GrowthError(
                f"stage {name!r} of {path} grows from {current.shape_str()}, but the checkpoint's model is "
                f"{cfg.shape_str()}; pick the stage that starts from the checkpoint's shape"
            )
        current = stage.target
    if name is not None:
        raise GrowthError(f"{path} has no stage {name!r}; its stages are {[s.name for s in sched.stages]}")
    raise GrowthError(
        f"{path} does not chain from the checkpoint's model {cfg.shape_str()}: its stages start from "
        + "; ".join(f"{n}: {c.shape_str()}" for n, c in starts)
    )


def stage_from_flags(args: argparse.Namespace, cfg: GPTConfig, step: int) -> Stage | None:
    """The stage described by the shape/family flags, or None when no shape flag is given (reshard only)."""
    given = {k: getattr(args, k) for k in _SHAPE_FLAGS if getattr(args, k) is not None}
    if not given:
        if args.family:
            raise GrowthError("--family needs a target shape (--n_layer / --n_embd / --n_head / --n_inner)")
        return None
    options: dict[str, Any] = {}
    for item in args.option or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise GrowthError(f"--option {item!r} must be KEY=VALUE, e.g. layer_order=stack")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    try:
        target = replace(cfg, **given)
        return Stage(
            name="cli",
            target=target,
            family=args.family or "masked",
            when=Trigger("step", float(step)),
            options=options,
            ramp_steps=args.ramp_steps or 0,
            optimizer=OptimizerPolicy(args.moments, args.fresh_exp_avg_sq),
            schedule=ScheduleRule(
                args.schedule, args.constant_op, args.rewarm_steps, args.total_num_steps, args.warmup_num_steps
            ),
        )
    except ValueError as e:
        raise GrowthError(str(e)) from e


def schedule_of(state: dict[str, Any], lbi: int) -> ScheduleState | None:
    """The WarmupCosineLR schedule of a checkpoint at position ``lbi`` (None for another or no scheduler)."""
    if state.get("schedule"):
        return replace(ScheduleState(**state["schedule"]), last_batch_iteration=lbi)
    sch = (state.get("ds_config") or {}).get("scheduler") or {}
    if sch.get("type") != "WarmupCosineLR":
        return None
    p = sch.get("params", {})
    keys = ("total_num_steps", "warmup_num_steps", "warmup_min_ratio", "cos_min_ratio", "warmup_type")
    kwargs = {k: p[k] for k in keys if k in p}
    if not all(isinstance(kwargs.get(k), int) for k in keys[:2]):
        return None
    return ScheduleState(**kwargs, last_batch_iteration=lbi)


def mask_buffers(masks: MaskSpec | None, cfg: GPTConfig, step: int) -> dict[str, torch.Tensor]:
    """The grown model's mask buffers at ``step`` (what GPT(cfg, masks).set_growth_step(step) holds)."""
    if masks is None or masks.value(step) >= 1.0:
        return {}
    return {name: mask_values(is_new, masks.value(step)) for name, is_new in new_unit_flags(masks, cfg).items()}


# ----- output folder -------------------------------------------------------------------------------------------------


def check_output(out: Path, src: Source, overwrite: bool) -> None:
    """Refuse an output that exists (unless ``overwrite``) or that overlaps the input."""
    out_r, tag_r, ck_r = out.resolve(), src.tag_dir.resolve(), src.ckpt_dir.resolve()
    for inp in (tag_r, ck_r):  # replacing out must not touch the input: not the input, an ancestor, or inside a tag
        if out_r == inp or out_r in inp.parents or tag_r in out_r.parents:
            raise CheckpointError(f"output {out} overlaps the input checkpoint {inp}; choose a folder outside it")
    if out.exists() and not overwrite:
        raise CheckpointError(f"output {out} already exists; choose another folder or pass --overwrite to replace it")


def commit(tmp: Path, out: Path) -> None:
    """Move the finished ``tmp`` folder to ``out``, replacing an old ``out`` only once ``tmp`` is complete."""
    if out.exists():
        old = out.with_name(f".old-{out.name}")
        if old.exists():
            shutil.rmtree(old)
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old)
    else:
        os.rename(tmp, out)


def _fresh_tmp(out: Path) -> Path:
    tmp = out.with_name(f".tmp-{out.name}")
    if tmp.exists():
        shutil.rmtree(tmp)  # left by a crashed run of this command
    tmp.mkdir(parents=True)
    return tmp


# ----- grow / reshard ------------------------------------------------------------------------------------------------


def grow_checkpoint(
    src: Source,
    out: Path,
    stage: Stage | None,
    *,
    seed: int = 0,
    overwrite: bool = False,
    target_zero_stage: int | None = None,
    workers: int = 1,
    log: Any = print,
) -> Path:
    """Write the grown (``stage``) or only resharded (``stage`` None) checkpoint of ``src`` to ``out``.

    Returns:
        ``out`` (a checkpoint folder with ``latest``).

    Raises:
        CheckpointError, GrowthError, ManifestError: bad input, found before anything is written to ``out``.
    """
    t0 = time.perf_counter()
    state, cfg, step = src.state, src.config, int(src.state["global_step"])
    if target_zero_stage is not None and (
        target_zero_stage not in SUPPORTED_STAGES or (target_zero_stage == 3) != (src.zero_stage == 3)
    ):
        raise CheckpointError(
            f"{src.tag_dir} was saved at ZeRO stage {src.zero_stage}; its universal checkpoint loads at ZeRO stage "
            f"{'3' if src.zero_stage == 3 else '1 or 2'} only, not {target_zero_stage} (DeepSpeed's universal "
            "loaders do not cross between stages 1/2 and 3, and stage 0 has none)"
        )
    old_masks = MaskSpec.from_dict(state["growth_masks"]) if state.get("growth_masks") else None
    plan: GrowthPlan | None = None
    if stage is not None:
        if old_masks is not None and old_masks.value(step) < 1.0:
            raise GrowthError(
                f"a mask ramp is still running in {src.tag_dir} (value {old_masks.value(step):.3f} at step {step}, "
                f"reaches 1 at step {old_masks.end_step()}); train to step >= {old_masks.end_step()} and grow that "
                "checkpoint"
            )
        stage = replace(stage, target=replace(stage.target, dropout=cfg.dropout))
        plan = stage.plan(cfg, seed)
        if not _same_shape(plan.old, cfg):
            raise GrowthError(f"the plan grows {plan.old.shape_str()}, the checkpoint is {cfg.shape_str()}")
        check_plan(plan)  # every grown parameter gets the grown config's shape (meta tensors, no memory)
    check_output(out, src, overwrite)

    tmp = _fresh_tmp(out)
    try:
        new_tag = tmp / src.tag
        flat = src.zero_stage == 3
        if src.universal:
            conv = src.tag_dir
        elif plan is None:
            conv = new_tag  # reshard only: DeepSpeed's conversion is the result
        else:
            conv = tmp / ".convert" / src.tag
        if not src.universal:
            t = time.perf_counter()
            convert(src.tag_dir, conv, workers)
            log(f"growlm-grow: ds_to_universal {src.tag_dir} ({time.perf_counter() - t:.1f} s)")
        old_shapes = param_shapes(cfg)
        step_t = adam_step(conv / "zero", list(old_shapes), flat)
        old_store = UniversalStore(conv / "zero", old_shapes, flat=flat)
        # every old tensor's element count is checked against the old config before the first write
        for name in old_shapes:
            for key in ("fp32", "exp_avg", "exp_avg_sq"):
                _check_numel(conv / "zero" / name / f"{key}.pt", math.prod(old_shapes[name]), name)

        new_state = dict(state)
        new_state.update(universal=True, world_size=int(state["world_size"]), zero_stage=src.zero_stage)
        lbi = (lr_scheduler_state(conv) or {}).get("last_batch_iteration")
        sched = schedule_of(state, lbi) if lbi is not None else None
        if plan is None:
            if src.universal:
                shutil.copytree(src.tag_dir, new_tag, ignore=shutil.ignore_patterns("growlm_manifest.json", ".tmp-*"))
        else:
            new_cfg = plan.new
            new_shapes = param_shapes(new_cfg)
            masks = None
            if plan.masks is not None:
                masks = replace(plan.masks, start_step=step, ramp_steps=stage.ramp_steps or plan.masks.ramp_steps)
                masks.check(new_cfg)
            new_store = UniversalStore(new_tag / "zero", new_shapes, flat=flat, step=step_t)
            t = time.perf_counter()
            apply_plan(plan, old_store, new_store, stage.optimizer)
            if (conv / "zero" / "lm_head.weight").is_dir():  # the tied alias ds_to_universal writes
                new_store.write_tied("lm_head.weight", new_store.read_tensor("transformer.wte.weight", "fp32"))
            log(f"growlm-grow: grew {len(plan.rules)} parameters ({time.perf_counter() - t:.1f} s)")
            lr = None
            rule = stage.schedule
            moves = rule.kind != "continue" or rule.rewarm_steps or rule.total_num_steps or rule.warmup_num_steps
            if sched is not None and moves:
                placed = place_schedule(sched, step, stage.schedule)
                if placed != sched or stage.schedule.rewarm_steps:  # else the resuming run's config decides
                    peak = float(state["ds_config"]["optimizer"]["params"]["lr"])
                    lr = peak * placed.ratio(step)
                    new_state["schedule"] = vars(placed).copy()
                sched = placed
            elif sched is None and moves:
                raise GrowthError(
                    f"schedule rule {stage.schedule.kind!r} with re-warm {stage.schedule.rewarm_steps} needs a "
                    "WarmupCosineLR scheduler in the checkpoint's DeepSpeed config; use kind 'continue'"
                )
            write_optimizer_state(conv / "zero", new_tag / "zero", lr=lr, flat=flat, step=step_t)
            new_state.update(
                model_config=new_cfg.to_dict(),
                growth_masks=masks.to_dict() if masks is not None else None,
                growth=[
                    *state.get("growth", []),
                    {
                        "step": step,
                        "stage": stage.name,
                        "family": plan.family,
                        "exact": plan.exact,
                        "from": cfg.to_dict(),
                        "to": new_cfg.to_dict(),
                        "optimizer": {
                            "moments": stage.optimizer.moments,
                            "fresh_exp_avg_sq": stage.optimizer.fresh_exp_avg_sq,
                        },
                        "schedule": vars(stage.schedule).copy(),
                        "first_lr": lr,
                    },
                ],
            )
            write_model_states(
                conv,
                new_tag,
                shapes=new_shapes,
                buffers=mask_buffers(masks, new_cfg, step),
                last_batch_iteration=sched.last_batch_iteration if sched is not None else None,
                client_state=new_state,
            )
            for rng in src.tag_dir.glob("rng_state_rank*.pt"):
                shutil.copy2(rng, new_tag / rng.name)
        if plan is None and not src.universal:
            for rng in src.tag_dir.glob("rng_state_rank*.pt"):
                shutil.copy2(rng, new_tag / rng.name)
        (new_tag / ds_checkpoint.STATE_FILE).write_text(json.dumps(new_state, indent=2))
        if (tmp / ".convert").exists():
            shutil.rmtree(tmp / ".convert")
        write_manifest(new_tag)
        (tmp / LATEST_UNIVERSAL).write_text(src.tag)
        (tmp / ds_checkpoint.LATEST).write_text(src.tag)  # the pointer, last
        commit(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    what = f"grown to {plan.new.shape_str()}" if plan is not None else "resharded"
    log(
        f"growlm-grow: wrote {out / src.tag} ({what}; {time.perf_counter() - t0:.1f} s); resume it with "
        f"`train.py --resume {out}` at any world size, ZeRO stage {'3' if src.zero_stage == 3 else '1 or 2'}"
    )
    return out


def _check_numel(path: Path, numel: int, name: str) -> None:
    """Element count of a universal tensor file, read memory-mapped (nothing is loaded)."""
    obj = load_file(path, f"{path.stem} of {name}")
    t = obj.get("param") if isinstance(obj, dict) else obj
    if not isinstance(t, torch.Tensor) or t.numel() != numel:
        got = t.numel() if isinstance(t, torch.Tensor) else type(t).__name__
        raise CheckpointError(f"{path}: {got} elements, {name} of the checkpoint's model config has {numel}")


# ----- export --------------------------------------------------------------------------------------------------------


def export_hf(src: Source, out: Path, *, overwrite: bool = False, workers: int = 1, log: Any = print) -> Path:
    """Write ``config.json`` + ``model.safetensors`` of ``src``'s fp32 weights, loadable by
    ``transformers.GPT2LMHeadModel.from_pretrained(out)``.

    Raises:
        CheckpointError: the output exists (without ``overwrite``) or overlaps the input; the checkpoint's growth
            masks are still ramping (a masked model is not GPT-2).
    """
    from model.gpt import GPT
    from model.hf import to_hf

    step = int(src.state["global_step"])
    masks = MaskSpec.from_dict(src.state["growth_masks"]) if src.state.get("growth_masks") else None
    if masks is not None and masks.value(step) < 1.0:
        raise CheckpointError(
            f"{src.tag_dir} still has growth masks ramping (value {masks.value(step):.3f} at step {step}, 1 at step "
            f"{masks.end_step()}); a masked model is not a GPT-2: export a checkpoint from step >= {masks.end_step()}"
        )
    check_output(out, src, overwrite)
    tmp = _fresh_tmp(out)
    try:
        conv = src.tag_dir
        if not src.universal:
            conv = tmp / ".convert" / src.tag
            convert(src.tag_dir, conv, workers)
        shapes = param_shapes(src.config)
        store = UniversalStore(conv / "zero", shapes, flat=src.zero_stage == 3)
        model = GPT(src.config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(store.read_tensor(name, "fp32"))
        hf = to_hf(model)
        if (tmp / ".convert").exists():
            shutil.rmtree(tmp / ".convert")
        hf.save_pretrained(str(tmp), safe_serialization=True)
        commit(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"growlm-grow: exported {src.tag_dir} ({src.config.shape_str()}) to {out} (transformers GPT2LMHeadModel)")
    return out


# ----- command line --------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="growlm-grow",
        description="Grow a saved growlm/DeepSpeed ZeRO-1/2/3 checkpoint offline into one that train.py --resume "
        "loads at any world size (optimizer state included), reshard it only (no growth flags), or export its "
        "weights to a transformers GPT-2 folder (--export_hf).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("checkpoint", help="checkpoint folder (its 'latest' tag) or a tag folder")
    p.add_argument("out", nargs="?", help="output checkpoint folder (must not exist unless --overwrite)")
    p.add_argument("--export_hf", "--export-hf", metavar="DIR", help="write a transformers GPT-2 folder instead")
    p.add_argument("--overwrite", action="store_true", help="replace the output if it exists (only once complete)")
    p.add_argument("--zero_stage", type=int, help="ZeRO stage the resuming job will use: refuse impossible crossings")
    p.add_argument("--workers", type=int, default=1, help="ds_to_universal extract/merge worker processes")
    g = p.add_argument_group("growth stage from a plan file")
    g.add_argument("--plan", help="YAML growth plan (growth/plan_file.py)")
    g.add_argument("--stage", help="stage name (default: the stage that starts from the checkpoint's shape)")
    f = p.add_argument_group("growth stage from flags")
    f.add_argument("--family", choices=("masked", "duplicate"), help="operator family (default masked)")
    for k in _SHAPE_FLAGS:
        f.add_argument(f"--{k}", type=int, help=f"target {k}")
    f.add_argument("--option", action="append", metavar="KEY=VALUE", help="operator option (growth.ops.make_plan)")
    f.add_argument("--ramp_steps", type=int, help="masked family: mask ramp length in optimizer steps")
    f.add_argument("--moments", default="carry", help="Adam moments policy: carry | carry_old | reset")
    f.add_argument("--fresh_exp_avg_sq", default="zero", help="exp_avg_sq of fresh entries: zero | mean")
    f.add_argument("--schedule", default="continue", help="LR placement: continue | target | rewind")
    f.add_argument("--constant_op", type=float, default=1.0, help="'target': lbi' = lbi / constant_op")
    f.add_argument("--rewarm_steps", type=int, default=0, help="linear LR re-warm over this many steps")
    f.add_argument("--total_num_steps", type=int, help="'target': the target schedule's total_num_steps")
    f.add_argument("--warmup_num_steps", type=int, help="'target': the target schedule's warmup_num_steps")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if (args.out is None) == (args.export_hf is None):
            raise GrowthError("give an output checkpoint folder OUT, or --export_hf DIR (one of them)")
        src = open_source(args.checkpoint)
        if args.export_hf:
            if args.plan or any(getattr(args, k) is not None for k in _SHAPE_FLAGS):
                raise GrowthError("--export_hf exports the checkpoint as it is; grow it first, then export the result")
            export_hf(src, Path(args.export_hf), overwrite=args.overwrite, workers=args.workers)
            return 0
        step = int(src.state["global_step"])
        if args.plan:
            if any(getattr(args, k) is not None for k in _SHAPE_FLAGS) or args.family:
                raise GrowthError("give the growth stage either by --plan or by shape flags, not both")
            stage, seed = stage_from_plan_file(args.plan, args.stage, src.config)
        else:
            if args.stage:
                raise GrowthError("--stage needs --plan")
            stage, seed = stage_from_flags(args, src.config, step), 0
        grow_checkpoint(
            src,
            Path(args.out),
            stage,
            seed=seed,
            overwrite=args.overwrite,
            target_zero_stage=args.zero_stage,
            workers=args.workers,
        )
        return 0
    except (CheckpointError, GrowthError, ManifestError) as e:
        print(f"growlm-grow: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
