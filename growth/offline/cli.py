"""growlm-grow: grow a saved ZeRO checkpoint offline into one that resumes at any world size, or only reshard it, or
export its weights to a transformers folder (GPT-2 or Llama, as the checkpoint's model).

    growlm-grow CKPT OUT --growth_plan growth/plans/tiny_msg.yaml [--stage deeper]     grow by a plan file's stage
    growlm-grow CKPT OUT --family masked --n_layer 4 [--ramp_steps 100 ...]      grow by flags
    growlm-grow CKPT OUT                                                         reshard only (no growth)
    growlm-grow CKPT --export_hf HF_DIR [--tokenizer T]        config.json + model.safetensors + the tokenizer

CKPT is a checkpoint folder (its ``latest`` tag) or a tag folder written by train.py at ZeRO stage 1, 2 or 3 (or an
output of this command). OUT becomes a checkpoint folder ``OUT/<tag>`` + ``latest`` that ``train.py --resume OUT``
loads at any world size, at the saved ZeRO stage's family (1/2, or 3). This module is the command line only: the
pipeline is growth/offline/pipeline.py, the export growth/offline/export.py, the universal-checkpoint files
growth/offline/universal.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from growlm.growth.errors import GrowthError
from growlm.runtime.atomic import write_error, write_failed_message
from growlm.runtime.commands import HelpFormatter, add_version, interruptible
from growlm.runtime.manifest import MANIFEST_FILE, ManifestError, Verification

if TYPE_CHECKING:  # the annotations only: main imports the pipeline (torch) once the input's hashing has started
    from growlm.growth.stages.plan import Stage, StageList
    from growlm.model.config import ModelConfig

_SHAPE_FLAGS = ("n_layer", "n_embd", "n_head", "n_inner", "n_kv_head")  # n_kv_head: Llama only


def load_plan_file(path: str) -> StageList:
    """The validated plan file of ``--growth_plan`` (growth.stages.plan.load_stages, the one plan-file loader).

    Raises:
        GrowthError: the file is missing or unreadable, not valid YAML (``FILE:LINE: problem; fix``), or invalid.
    """
    from growlm.growth.stages.plan import load_stages  # lazy: pydantic and yaml, for a plan file only

    try:
        return load_stages(path)
    except OSError as e:
        raise GrowthError(f"--growth_plan {path}: {e.strerror}") from None
    except GrowthError as e:  # YAML syntax / a tab / a repeated key (FILE:LINE: problem; fix), or a bad plan
        raise GrowthError(f"--growth_plan {path}: {e}") from None


def stage_from_plan_file(
    path: str, name: str | None, cfg: ModelConfig, sched: StageList | None = None
) -> tuple[Stage, int]:
    """The stage of a plan file that grows ``cfg`` (by ``name``, or the first whose start shape is ``cfg``), and
    the plan's seed. ``sched``: the plan already loaded from ``path`` (else it is loaded here).

    Raises:
        GrowthError: the file is invalid, has no such stage, or does not chain from ``cfg``.
    """
    from growlm.growth.ops.preparation import same_shape  # lazy: torch (see start_input_check)

    sched = load_plan_file(path) if sched is None else sched
    current, starts = sched.start, []
    for stage in sched.stages:
        starts.append((stage.name, current))
        if (name is None or stage.name == name) and same_shape(current, cfg):
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


def stage_from_flags(args: argparse.Namespace, cfg: ModelConfig, step: int) -> Stage | None:
    """The stage described by the shape/family flags, or None when no shape flag is given (reshard only; a stage
    flag without a shape flag is refused before, ``check_flags_apply``)."""
    given = {k: getattr(args, k) for k in _SHAPE_FLAGS if getattr(args, k) is not None}
    if not given:
        return None
    from growlm.growth.ops.apply import OptimizerPolicy  # lazy: torch (see start_input_check)
    from growlm.growth.ops.schedule_rule import ScheduleRule  # lazy: torch (see start_input_check)
    from growlm.growth.stages.plan import Stage, Trigger  # lazy: pydantic and yaml, for a growth only
    from growlm.model.config import grown_shape  # lazy: torch (see start_input_check)
    from growlm.model.registry import family  # lazy: torch (see start_input_check)

    options: dict[str, Any] = {}
    for item in args.option or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise GrowthError(f"--option {item!r} must be KEY=VALUE, e.g. layer_order=stack")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    if "n_kv_head" in given and "n_kv_head" not in {f.name for f in fields(cfg)}:
        raise GrowthError(
            f"--n_kv_head sets a Llama-shaped model's key/value heads, and the checkpoint's model is a "
            f"{family(cfg).name} ({cfg.shape_str()}, one key/value head per query head); drop it"
        )
    try:
        target = grown_shape(cfg, given)  # a Llama's n_inner and n_kv_head follow the width unless given
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


# a flag of the "growth stage from flags" group -> where the same setting goes in a plan file's stage
PLAN_KEY_OF_FLAG = {
    "--family": "family: masked", "--option": "options: {KEY: VALUE}", "--ramp_steps": "ramp_steps: N",
    "--moments": "optimizer: {moments: ...}", "--fresh_exp_avg_sq": "optimizer: {fresh_exp_avg_sq: ...}",
    "--schedule": "schedule: {kind: ...}", "--constant_op": "schedule: {constant_op: X}",
    "--rewarm_steps": "schedule: {rewarm_steps: N}", "--total_num_steps": "schedule: {total_num_steps: N}",
    "--warmup_num_steps": "schedule: {warmup_num_steps: N}",
}  # fmt: skip


def stage_flags_given(argv: list[str] | None) -> list[str]:
    """The flags of the "growth stage from flags" group that ``argv`` (None: sys.argv[1:]) gives explicitly, even
    at their default value or abbreviated (argparse parses it again with every default suppressed)."""
    p = build_parser()
    group = next(g for g in p._action_groups if g.title == "growth stage from flags")
    for action in p._actions:
        action.default = argparse.SUPPRESS
    given = vars(p.parse_args(argv))
    return [a.option_strings[0] for a in group._group_actions if a.dest in given]


def check_flags_apply(args: argparse.Namespace, argv: list[str] | None) -> None:
    """Refuse, before anything is read, a flag that nothing this command does would use: --stage without
    --growth_plan, --zero_stage with --export_hf (a transformers folder is not resumed at a ZeRO stage), and a flag of
    the "growth stage from flags" group (``PLAN_KEY_OF_FLAG``: how a growth is done) given without a target shape
    flag (the command would only reshard) or with --export_hf (an export writes the checkpoint as it is). With
    --growth_plan the plan gives the stage (those flags are refused in ``main``, with the plan key that sets each).

    Raises:
        GrowthError: names the first such flag and the fix.
    """
    if args.stage is not None and not args.growth_plan:
        raise GrowthError(f"--stage {args.stage} names a stage of a plan file; add --growth_plan FILE, or drop --stage")
    if args.zero_stage is not None and args.export_hf is not None:
        raise GrowthError(
            f"--zero_stage {args.zero_stage} sets the ZeRO stage a resume of OUT will use, and --export_hf writes a "
            "transformers folder, which is not resumed; drop --zero_stage"
        )
    unused = [f for f in stage_flags_given(argv) if f in PLAN_KEY_OF_FLAG] if not args.growth_plan else []
    if not unused:
        return
    if args.export_hf is not None:
        raise GrowthError(
            f"{unused[0]} sets how a growth is done, and --export_hf exports the checkpoint as it is; drop "
            f"{unused[0]} (to export a grown model, grow first with a target such as --n_layer, then export the "
            "result)"
        )
    if not any(getattr(args, k) is not None for k in _SHAPE_FLAGS):
        targets = " / ".join(f"--{k}" for k in _SHAPE_FLAGS)
        raise GrowthError(
            f"{unused[0]} sets how a growth is done, and no target shape is given ({targets}), so this would only "
            f"reshard and ignore it; add a target such as --n_layer, or drop {unused[0]}"
        )


def check_schedule_fits(src: Any, stage: Stage | None, plan_path: str | None) -> None:
    """Refuse a growth whose LR schedule growth cannot place (growth.ops.schedule_rule.place_schedule: total_num_steps
    below warmup_num_steps) with the flag or plan key that fixes it, before anything is read or written. The saved
    schedule is the checkpoint's placed one, else its DeepSpeed config's WarmupCosineLR (train.py accepts a run
    shorter than its warm-up, e.g. --max_steps 4 with warmup_num_steps 20 and total_num_steps "auto").

    Raises:
        GrowthError: names both lengths and the fix.
    """
    if stage is None:
        return
    saved = src.state.schedule
    sched = (src.state.ds_config or {}).get("scheduler") or {}
    if saved is None and sched.get("type") != "WarmupCosineLR":
        return  # no schedule to place
    params = sched.get("params") or {}
    total = saved.total_num_steps if saved is not None else params.get("total_num_steps")
    warmup = saved.warmup_num_steps if saved is not None else params.get("warmup_num_steps", 1000)
    total, warmup = stage.schedule.total_num_steps or total, stage.schedule.warmup_num_steps or warmup
    if isinstance(total, int) and isinstance(warmup, int) and total < warmup:
        where = f"the stage's schedule: {{total_num_steps: N}} in {plan_path}" if plan_path else "--total_num_steps N"
        raise GrowthError(
            f"the LR schedule growth would place has total_num_steps {total} < warmup_num_steps {warmup} (the run "
            f"trained shorter than its warm-up), which growth cannot place; give {where} with N >= {warmup} (the "
            "length of the run that will continue), or a shorter warmup_num_steps"
        )


def build_parser() -> argparse.ArgumentParser:
    """The growlm-grow argument parser (``--help`` describes every flag)."""
    p = argparse.ArgumentParser(
        prog="growlm-grow",
        description="Grow a saved growlm/DeepSpeed ZeRO-1/2/3 checkpoint offline into one that train.py --resume "
        "loads at any world size (optimizer state included), reshard it only (no growth flags), or export its "
        "weights to a transformers GPT-2 or Llama folder (--export_hf). Files are read with weights-only unpickling, "
        "but DeepSpeed's own loaders (train.py --resume) unpickle them fully: use checkpoints from a trusted source "
        "only (growlm first refuses any file holding more than tensor data and a few known types).",
        formatter_class=HelpFormatter,
    )
    p.add_argument("checkpoint", help="checkpoint folder (its 'latest' tag) or a tag folder")
    p.add_argument("out", nargs="?", help="output checkpoint folder (must not exist unless --overwrite)")
    p.add_argument(
        "--export_hf",
        metavar="DIR",
        help="write a transformers folder (GPT-2 or Llama, as the checkpoint's model) instead of OUT (default: no "
        "export)",
    )
    p.add_argument(
        "--tokenizer",
        help="with --export_hf: the model's tokenizer (gpt2, a tokenizer.json or a token folder; default: the one of "
        "the token folder the checkpoint was trained on)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace the output if it exists (only once complete)")
    p.add_argument("--zero_stage", type=int, help="ZeRO stage the resuming job will use: refuse impossible crossings")
    g = p.add_argument_group("growth stage from a plan file")
    g.add_argument("--growth_plan", help="YAML growth plan (growth/plans/*.yaml; growth/stages/plan.py)")
    g.add_argument("--stage", help="stage name (default: the stage that starts from the checkpoint's shape)")
    f = p.add_argument_group("growth stage from flags")
    f.add_argument("--family", choices=("masked", "duplicate"), help="operator family (default: masked)")
    follows = {
        "n_inner": " (default: follows the width: GPT-2 4 x n_embd, a Llama's scaled by the new n_embd / the old)",
        "n_kv_head": " (Llama checkpoints only; default: keeps the query heads per key/value head)",
    }
    for k in _SHAPE_FLAGS:
        f.add_argument(f"--{k}", type=int, help=f"target {k}" + follows.get(k, ""))
    f.add_argument("--option", action="append", metavar="KEY=VALUE", help="operator option (growth.ops.make_rules)")
    f.add_argument("--ramp_steps", type=int, help="masked family: mask ramp length in optimizer steps")
    f.add_argument("--moments", default="carry", help="Adam moments policy: carry | carry_old | reset")
    f.add_argument("--fresh_exp_avg_sq", default="zero", help="exp_avg_sq of fresh entries: zero | mean")
    f.add_argument("--schedule", default="continue", help="LR placement: continue | target | rewind")
    f.add_argument("--constant_op", type=float, default=1.0, help="'target': lbi' = lbi / constant_op")
    f.add_argument("--rewarm_steps", type=int, default=0, help="linear LR re-warm over this many steps")
    f.add_argument("--total_num_steps", type=int, help="'target': the target schedule's total_num_steps")
    f.add_argument("--warmup_num_steps", type=int, help="'target': the target schedule's warmup_num_steps")
    return add_version(p)


def start_input_check(path: str) -> Verification | None:
    """Start hashing the input checkpoint's manifest on background threads (runtime.manifest.Verification) before the
    pipeline's imports (torch: about two seconds of one core), so the two overlap; open_source takes the verdict
    before anything is loaded. None when ``path`` is not plainly a tag folder with a manifest, or a checkpoint folder
    whose ``latest`` names one (open_source then resolves and checks it itself, with its own errors)."""
    p = Path(path)
    try:
        if not (p / MANIFEST_FILE).is_file() and (p / "latest").is_file():
            p = p / (p / "latest").read_text().strip()
        return Verification(p) if (p / MANIFEST_FILE).is_file() else None
    except (OSError, ValueError):  # unreadable, or a name the filesystem refuses: open_source says what is wrong
        return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The parsed growlm-grow command line (``--help`` describes every flag)."""
    return build_parser().parse_args(argv)


@interruptible("growlm-grow")
def main(argv: list[str] | None = None) -> int:
    """growlm-grow: returns 0 on success, 2 on bad input (one line on stderr naming the problem)."""
    args = parse_args(argv)
    verifying = start_input_check(args.checkpoint) if args.out is not None or args.export_hf is not None else None
    from growlm.growth.offline.export import export_hf  # lazy: torch, imported while the input is hashed
    from growlm.growth.offline.pipeline import grow_checkpoint, open_source  # lazy: torch, as export_hf
    from growlm.runtime.checkpoint import CheckpointError  # lazy: torch, as export_hf

    try:
        if (args.out is None) == (args.export_hf is None):
            raise GrowthError("give an output checkpoint folder OUT, or --export_hf DIR (one of them)")
        if args.tokenizer is not None and args.export_hf is None:
            raise GrowthError("--tokenizer names the tokenizer an export carries; it needs --export_hf DIR")
        ignored = [f for f in stage_flags_given(argv) if f in PLAN_KEY_OF_FLAG] if args.growth_plan else []
        if ignored:
            raise GrowthError(
                f"{ignored[0]} sets a stage given by flags, and --growth_plan gives the stage; set it in the plan's "
                f"stage ({PLAN_KEY_OF_FLAG[ignored[0]]}) or drop --growth_plan"
            )
        check_flags_apply(args, argv)
        plan = (
            load_plan_file(args.growth_plan) if args.growth_plan else None
        )  # a bad plan file is refused before any reading
        src = open_source(args.checkpoint, verifying)
        if args.export_hf:
            if args.growth_plan or any(getattr(args, k) is not None for k in _SHAPE_FLAGS):
                raise GrowthError("--export_hf exports the checkpoint as it is; grow it first, then export the result")
            export_hf(src, Path(args.export_hf), tokenizer=args.tokenizer, overwrite=args.overwrite)
            return 0
        step = src.state.global_step
        if args.growth_plan:
            if any(getattr(args, k) is not None for k in _SHAPE_FLAGS):
                raise GrowthError("give the growth stage either by --growth_plan or by shape flags, not both")
            stage, seed = stage_from_plan_file(args.growth_plan, args.stage, src.config, plan)
        else:
            stage, seed = stage_from_flags(args, src.config, step), 0
        check_schedule_fits(src, stage, args.growth_plan)
        grow_checkpoint(
            src,
            Path(args.out),
            stage,
            seed=seed,
            overwrite=args.overwrite,
            target_zero_stage=args.zero_stage,
        )
        return 0
    except (CheckpointError, GrowthError, ManifestError) as e:
        print(f"growlm-grow: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a full disk, a read-only folder (write_error): the output's staging folder is gone
        out = args.export_hf if args.export_hf is not None else args.out
        failed = write_error(e, Path(out).parent) if out is not None else None
        if failed is None:
            raise
        what = "the export" if args.export_hf is not None else "the grown checkpoint"
        kept = "nothing was left there" + (", the folder there before is unchanged" if Path(out).exists() else "")
        print(f"growlm-grow: error: {write_failed_message(failed, what, out, kept)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
