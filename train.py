"""growlm training entry point: pretrain a GPT-2 with DeepSpeed ZeRO on a prepared token file.

Launch with the deepspeed launcher (``deepspeed --num_gpus 2 train.py ...``; on a CPU DeepSpeed's CPU
accelerator and gloo are chosen automatically), with ``torchrun --nproc_per_node 2 train.py ...``, with
``mpirun -n 2 python train.py ...`` (mpi4py discovery), or as a single process (``python train.py ...``).
DeepSpeed settings (ZeRO stage, precision, micro batch, gradient accumulation, clipping, AdamW, LR schedule) come
from the JSON given by --ds_config; see ds_configs/README.md. Run ``python train.py --help`` for every flag.

The file reads top to bottom: parse and validate, build, train, close.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from runtime.dist import select_accelerator

select_accelerator()  # before anything imports deepspeed

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from data.sampler import ResumableSampler, TokenWindows, micro_batch_start  # noqa: E402
from eval.metrics.perplexity import NLL, token_nll  # noqa: E402
from growth.errors import GrowthError  # noqa: E402
from growth.live import grow_engine  # noqa: E402
from growth.schedule import apply_rewarm, apply_schedule, engine_schedule, start_schedule  # noqa: E402
from growth.stages import StageList, load_stages  # noqa: E402
from growth.trigger import slope_trigger  # noqa: E402
from model.config import PRESETS, GPTConfig, flops_per_token, from_preset, param_count  # noqa: E402
from runtime import checkpoint  # noqa: E402
from runtime.engine import build_engine, loss_scale_of  # noqa: E402
from runtime.run_state import DataIdentity, RunState  # noqa: E402

REPO = Path(__file__).resolve().parent
DEFAULT_PRESET = "cpu-small"
SHAPE_FLAGS = ("n_layer", "n_embd", "n_head", "n_inner", "n_positions", "vocab_size")  # GPTConfig overrides


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show a flag's default only when it has one and its help does not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or "default" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


class UsageError(Exception):
    """Bad input from the command line; printed as one message, exit status 2."""


class RankError(UsageError):
    """Bad input that only some ranks can see (e.g. ranks disagreeing); printed by every rank."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``python train.py --help`` describes every flag)."""
    p = argparse.ArgumentParser(
        prog="growlm-train",
        description="Pretrain a GPT-2 with DeepSpeed ZeRO. Model shape from --preset (+ overrides); DeepSpeed "
        "settings (ZeRO stage, precision, batch, optimizer, LR schedule) from --ds_config.",
        formatter_class=_HelpFormatter,
    )
    m = p.add_argument_group("model")
    m.add_argument(
        "--preset",
        default=None,
        help=f"model shape preset, one of: {', '.join(PRESETS)} "
        f"(default {DEFAULT_PRESET}, or the checkpoint's shape with --resume)",
    )
    m.add_argument("--n_layer", type=int, help="override the preset's number of blocks L")
    m.add_argument("--n_embd", type=int, help="override the preset's width d (must be divisible by n_head)")
    m.add_argument("--n_head", type=int, help="override the preset's number of attention heads H")
    m.add_argument("--n_inner", type=int, help="override the preset's FFN width F (default 4 * n_embd)")
    m.add_argument("--n_positions", type=int, help="override the preset's longest context P")
    m.add_argument("--vocab_size", type=int, help="override the preset's vocabulary V (>= the data's vocabulary)")
    m.add_argument("--dropout", type=float, help="override the preset's dropout (embedding, attention, residual)")
    d = p.add_argument_group("data")
    d.add_argument(
        "--data",
        default=None,
        help="folder made by growlm-prepare (train.bin, val.bin, meta.json); "
        "default: the built-in corpus, prepared on first use into data/cache/builtin",
    )
    d.add_argument("--seq_len", type=int, default=None, help="tokens per training sequence T (default n_positions)")
    d.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the model init, data order and dropout (default 1234, or the checkpoint's with --resume)",
    )
    t = p.add_argument_group("training")
    t.add_argument(
        "--ds_config",
        default=str(REPO / "ds_configs" / "zero2_bf16.json"),
        help='DeepSpeed JSON config; a scheduler total_num_steps of "auto" becomes --max_steps',
    )
    t.add_argument("--max_steps", type=int, default=200, help="train until this many optimizer steps (global step)")
    t.add_argument(
        "--out_dir",
        default="runs/default",
        help="run folder: checkpoints/, tb/ (TensorBoard), "
        "metrics.jsonl; refused if it already holds checkpoints this run would write",
    )
    t.add_argument(
        "--growth_plan",
        default=None,
        help="YAML growth plan (growth/plans/*.yaml): the starting shape and stages to grow into during this run; "
        "each stage's operator, trigger (step, tokens or loss slope), mask ramp, Adam policy and LR rule",
    )
    t.add_argument(
        "--resume",
        default=None,
        help="checkpoint to continue from: a checkpoints folder (its "
        "'latest' tag) or a tag folder; restores weights, Adam state, LR schedule, loss scaler, "
        "consumed samples and RNG. DeepSpeed's loader unpickles the checkpoint's files: use checkpoints from a "
        "trusted source only (growlm refuses any file holding more than tensor data and a few known types)",
    )
    t.add_argument("--save_interval", type=int, default=0, help="also save every N steps (0: only at the end)")
    t.add_argument("--no_final_save", action="store_true", help="do not save a checkpoint at the end")
    t.add_argument("--log_interval", type=int, default=10, help="steps between TensorBoard/console logs")
    t.add_argument("--dist_timeout_s", type=float, default=300.0, help="seconds to wait for other ranks")
    e = p.add_argument_group("evaluation")
    e.add_argument("--eval_interval", type=int, default=0, help="validate every N steps (0: only before/after)")
    e.add_argument("--eval_tokens", type=int, default=32768, help="held-out tokens used by periodic validation")
    e.add_argument(
        "--final_eval_tokens",
        type=int,
        default=0,
        help="held-out tokens scored before and after training (0: the whole validation split)",
    )
    e.add_argument(
        "--eval_stride",
        type=int,
        default=None,
        help="sliding-window stride for before/after perplexity (default seq_len: non-overlapping windows)",
    )
    e.add_argument("--eval_batch_size", type=int, default=8, help="windows per forward pass when evaluating")
    e.add_argument("--no_eval", action="store_true", help="skip the before/after perplexity")
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # set by the deepspeed launcher
    return p.parse_args(argv)


# ----------------------------------------------------------------------------------------- validation (no ranks)


def load_ds_config(path: str, max_steps: int) -> dict[str, Any]:
    """The DeepSpeed config at ``path`` with ``"auto"`` scheduler step counts replaced by ``max_steps``."""
    try:
        cfg = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(
            f"--ds_config {path}: no such file; pick one of {sorted(os.listdir(REPO / 'ds_configs'))}"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"--ds_config {path} is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise UsageError(f"--ds_config {path} must hold a JSON object")
    sched = cfg.get("scheduler", {}).get("params", {})
    for key in ("total_num_steps", "warmup_num_steps"):
        if sched.get(key) == "auto":
            sched[key] = max_steps
    if cfg.get("fp16", {}).get("enabled") and cfg.get("bf16", {}).get("enabled"):
        raise UsageError(f"--ds_config {path} enables both fp16 and bf16; enable one")
    return cfg


def precision_of(ds_cfg: dict) -> str:
    """'fp16', 'bf16' or 'fp32', as enabled in a DeepSpeed config."""
    return (
        "fp16" if ds_cfg.get("fp16", {}).get("enabled") else "bf16" if ds_cfg.get("bf16", {}).get("enabled") else "fp32"
    )


def model_config_from_args(args: argparse.Namespace, resume_state: RunState | None) -> GPTConfig:
    """The model shape: the checkpoint's when resuming (flags must agree with it), else preset + overrides."""
    overrides = {k: getattr(args, k) for k in (*SHAPE_FLAGS, "dropout")}
    try:
        if resume_state is None:
            return from_preset(args.preset or DEFAULT_PRESET, **overrides)
        saved = resume_state.model_config
        given = {k: v for k, v in overrides.items() if v is not None}
        requested = from_preset(args.preset, **given) if args.preset else replace(saved, **given)
        if args.dropout is None:  # dropout is not part of the shape: keep the checkpoint's unless asked
            requested = replace(requested, dropout=saved.dropout)
        return requested
    except ValueError as e:
        raise UsageError(str(e)) from None


def validate_data_dir(path: str | None) -> Path:
    """The prepared token folder to train on (``path``, or the built-in corpus's when None).

    Raises:
        UsageError: the folder is missing, is a text file, has no valid meta.json, or its train split is empty.
    """
    from data.prepare import default_data_dir, load_meta

    if path is None:
        return default_data_dir()
    p = Path(path)
    if not p.exists():
        raise UsageError(
            f"--data {p}: no such folder; prepare one with `growlm-prepare --train FILE... --val FILE... --out {p}`"
        )
    if p.is_file():
        raise UsageError(
            f"--data {p} is a file; train.py reads a prepared token folder: run `growlm-prepare "
            f"--train {p} --val HELD_OUT_FILE --out DIR` and pass --data DIR"
        )
    try:
        meta = load_meta(p)
    except (ValueError, FileNotFoundError) as e:
        raise UsageError(str(e)) from None
    if meta["splits"]["train"]["n_tokens"] == 0:
        raise UsageError(f"--data {p}: the train split is empty")
    return p


def planned_save_steps(start: int, max_steps: int, interval: int, final: bool) -> list[int]:
    """Global steps in (start, max_steps] at which this run saves: every ``interval``, and the last if ``final``."""
    steps = list(range(start + interval - start % interval, max_steps + 1, interval)) if interval > 0 else []
    if final and max_steps > start and max_steps not in steps:
        steps.append(max_steps)
    return steps


# ----------------------------------------------------------------------------------------------- training


def load_growth_plan(path: str) -> StageList:
    """The validated growth plan at ``path``.

    Raises:
        UsageError: the file is missing, does not parse, or its stages do not chain (growth.stages.parse_stages).
    """
    try:
        return load_stages(path)
    except FileNotFoundError:
        raise UsageError(f"--growth_plan {path}: no such file; see growth/plans/ for examples") from None
    except GrowthError as e:
        raise UsageError(f"--growth_plan {path}: {e}") from None
    except Exception as e:  # YAML syntax
        raise UsageError(f"--growth_plan {path} does not parse: {e}") from None


def shape_of(cfg: GPTConfig) -> dict:
    """The config's fields that fix parameter shapes (all but dropout)."""
    return {k: v for k, v in cfg.to_dict().items() if k != "dropout"}


def plan_config(args, growth: StageList, cfg: GPTConfig, resume_state: RunState | None, stage_index: int):
    """The model shape when a growth plan drives the run: the plan's start, or after ``stage_index`` stages."""
    shape_flags = [f"--{k}" for k in ("preset", *SHAPE_FLAGS) if getattr(args, k) is not None]
    if resume_state is None:
        if shape_flags:
            raise UsageError(f"--growth_plan sets the starting shape (its 'start'); drop {', '.join(shape_flags)}")
        start = growth.start
        return replace(start, dropout=args.dropout) if args.dropout is not None else start
    expected = growth.start if stage_index == 0 else growth.stages[stage_index - 1].target
    if stage_index > len(growth.stages) or shape_of(expected) != shape_of(cfg):
        raise UsageError(
            f"the checkpoint ({cfg.shape_str()}, {stage_index} growth stage(s) done) is not a point of --growth_plan "
            f"{args.growth_plan} (which expects {expected.shape_str()} there); resume with the plan it was trained with"
        )
    return cfg


def check_plan_fits_run(growth: StageList, stage_index: int, args, ds_cfg: dict) -> None:
    """Refuse, before any rank starts, a plan this run cannot carry out."""
    zero = ds_cfg.get("zero_optimization", {})
    stage = int(zero.get("stage", 0))
    if precision_of(ds_cfg) == "fp16" and stage == 0:
        raise UsageError(
            "live growth supports fp16 at ZeRO stage 1-3, not 0 (its FP16_Optimizer keeps no per-"
            "parameter Adam state that growth can read); use ds_configs/zero1_fp16.json or bf16"
        )
    if ds_cfg.get("scheduler", {}).get("type") != "WarmupCosineLR":
        raise UsageError("live growth places a WarmupCosineLR schedule; use a ds_config with that scheduler type")
    max_live = float(zero.get("stage3_max_live_parameters", 1e9))
    for s in growth.stages[stage_index:]:
        if s.when.kind == "step" and s.when.value < 1:
            raise UsageError(
                f"stage {s.name!r} grows at step {s.when.value:g}: DeepSpeed has no Adam state before "
                "the first optimizer step; grow at step >= 1 or start the plan at the grown shape"
            )
        if s.when.kind == "slope" and not args.eval_interval:
            raise UsageError(f"stage {s.name!r} grows on the validation-loss slope; set --eval_interval")
        largest = max(s.target.vocab_size, s.target.ffn_dim, 3 * s.target.n_embd) * s.target.n_embd
        if stage == 3 and largest > max_live:
            raise UsageError(
                f"stage {s.name!r}: the grown model has a parameter of {largest:,} elements, more than "
                f"this ds_config's stage3_max_live_parameters={max_live:,.0f}; raise it"
            )


def max_rss_bytes() -> int:
    """Peak resident memory of this process so far (bytes); on CUDA, peak allocated device memory."""
    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def main(argv: list[str] | None = None) -> int:
    """growlm-train: run ``run`` and turn bad input into one message and exit status 2."""
    args = parse_args(argv)
    rank_env = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    try:
        return run(args)
    except (UsageError, checkpoint.CheckpointError, GrowthError) as e:
        if rank_env == 0 or isinstance(e, RankError):
            print(f"growlm-train: error: {e}", file=sys.stderr)
        return 2
    finally:  # success, refusal or exception: leave no process group, TCP store or rendezvous variables behind
        from runtime.dist import close_distributed

        close_distributed()


def run(args: argparse.Namespace) -> int:
    """Parse and validate, build, train, close (see the module docstring). Returns the exit status.

    Raises:
        UsageError, RankError, CheckpointError, GrowthError: bad input, reported by ``main``.
    """
    # ---- parse and validate everything that needs no other rank, so bad input fails fast and alike everywhere
    ds_cfg = load_ds_config(args.ds_config, args.max_steps)
    zero_stage = int(ds_cfg.get("zero_optimization", {}).get("stage", 0))
    precision = precision_of(ds_cfg)
    resume = None
    if args.resume:
        try:  # resolve, check the manifest and every pickle, read the RunState
            resume = checkpoint.open_checkpoint(args.resume)
        except checkpoint.CheckpointError as e:
            raise checkpoint.CheckpointError(f"--resume {e}") from None
        resume_state = resume.state
        if resume_state.universal:  # written by growlm-grow: DeepSpeed reshards it at load (any world size)
            ds_cfg["checkpoint"] = {**ds_cfg.get("checkpoint", {}), "load_universal": True}
    else:
        resume_state = None
    cfg = model_config_from_args(args, resume_state)
    stage_index = resume_state.growth_stage if resume_state else 0
    growth = None
    if args.growth_plan:
        growth = load_growth_plan(args.growth_plan)
        cfg = plan_config(args, growth, cfg, resume_state, stage_index)
        check_plan_fits_run(growth, stage_index, args, ds_cfg)
    seq_len = args.seq_len or (resume_state.seq_len if resume_state else cfg.n_positions)
    seed = args.seed if args.seed is not None else (resume_state.seed if resume_state else 1234)
    if resume_state is not None:  # the data order is a function of (seed, seq_len, token file): keep all three
        for flag, value, saved in (
            ("--seq_len", seq_len, resume_state.seq_len),
            ("--seed", seed, resume_state.seed),
        ):
            if value != saved:
                raise UsageError(
                    f"{flag} {value} differs from the checkpoint's {saved}: the resumed run would read other "
                    f"samples than the interrupted one; drop {flag}"
                )
    if not 1 <= seq_len <= cfg.n_positions:
        raise UsageError(
            f"--seq_len {seq_len} must be in [1, n_positions={cfg.n_positions}]; shorten it or raise --n_positions"
        )
    if resume_state is not None:
        launched_world = int(os.environ.get("WORLD_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE") or 1)
        checkpoint.check_compatible(
            resume_state,
            model_config=cfg.to_dict(),
            world_size=launched_world,
            zero_stage=zero_stage,
            path=resume.tag_dir,
        )
    data_dir = validate_data_dir(args.data)
    out_dir = Path(args.out_dir)
    save_dir = out_dir / "checkpoints"
    start_step = resume_state.global_step if resume_state else 0
    if args.max_steps < start_step:
        raise UsageError(f"--max_steps {args.max_steps} is below the checkpoint's global step {start_step}")
    planned = planned_save_steps(start_step, args.max_steps, args.save_interval, not args.no_final_save)
    clash = sorted(set(checkpoint.existing_tags(save_dir)) & {checkpoint.tag_for(s) for s in planned})
    if clash:
        raise UsageError(
            f"{save_dir} already holds {', '.join(clash)}, which this run would write; checkpoints are "
            "never overwritten: choose another --out_dir (or --resume from the newest one)"
        )

    from deepspeed.accelerator import get_accelerator

    if precision == "fp16" and not get_accelerator().is_fp16_supported():
        available = ["fp32"] + (["bf16"] if get_accelerator().is_bf16_supported() else [])
        raise UsageError(
            f"--ds_config {args.ds_config} asks for fp16, which this device "
            f"({get_accelerator().device_name()}) does not support; available precisions: "
            f"{', '.join(available)} (e.g. ds_configs/zero{zero_stage}_{available[-1]}.json)"
        )

    # ---- build
    from runtime.dist import init_distributed

    try:
        info = init_distributed(args.dist_timeout_s)
    except RuntimeError as e:  # every rank says it: the one that cannot reach the master is often not rank 0
        raise RankError(str(e)) from None

    if args.data is None:
        from data.prepare import ensure_builtin_prepared

        if info.local_rank == 0:
            ensure_builtin_prepared()
        dist.barrier()
    from data.prepare import load_meta, open_tokens

    meta = load_meta(data_dir)
    if meta["vocab_size"] > cfg.vocab_size:
        raise UsageError(
            f"the data's vocabulary ({meta['vocab_size']}) is larger than the model's vocab_size "
            f"({cfg.vocab_size}); use --data prepared with the model's tokenizer"
        )
    train_tokens, val_tokens = open_tokens(data_dir, "train"), open_tokens(data_dir, "val")
    windows = TokenWindows(train_tokens, seq_len)
    if resume_state is not None:
        saved_sha = resume_state.data.train_sha256
        if saved_sha and saved_sha != meta["splits"]["train"].get("sha256"):
            raise UsageError(
                f"--data {data_dir}: its train split (sha256 {meta['splits']['train'].get('sha256')}) is "
                f"not the one the checkpoint trained on ({saved_sha}); resume with the same --data"
            )
    sampler = ResumableSampler(len(windows), seed)

    if growth is not None:  # every rank must run the same plan, or collectives would mismatch and hang
        digest = hashlib.sha256(Path(args.growth_plan).read_bytes()).hexdigest()
        digests = [None] * info.world_size
        dist.all_gather_object(digests, digest)
        if len(set(digests)) > 1:
            raise RankError(
                f"rank {info.rank}: the ranks read different --growth_plan files (sha256 "
                f"{', '.join(d[:12] for d in digests)}); give every rank the same plan"
            )
    torch.manual_seed(seed)  # identical init on every rank
    engine = build_engine(cfg, resume_state.growth_masks if resume_state else None, ds_cfg)
    start_schedule(engine)  # step 1 trains at the warm-up's first non-zero LR (a resume then loads its position)
    model = engine.module
    micro, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    global_batch = micro * gas * info.world_size
    if resume_state is not None:
        resume_state = checkpoint.load(engine, resume, rank=info.rank, world_size=info.world_size)
        if resume_state.world_size != info.world_size:  # no RNG file per rank to restore: a fresh stream per rank
            torch.manual_seed(seed + 1 + info.rank + 7919 * resume_state.global_step)
        consumed = resume_state.consumed_samples
        consumed_flops = resume_state.consumed_flops
        model.set_growth_step(resume_state.global_step)
        if resume_state.schedule:  # a growth placed the schedule; DeepSpeed restored only its position
            sched_state = replace(resume_state.schedule, last_batch_iteration=engine.lr_scheduler.last_batch_iteration)
            apply_schedule(engine, sched_state, resume_state.global_step)
    else:
        torch.manual_seed(seed + 1 + info.rank)  # per-rank dropout stream
        consumed, consumed_flops = 0, 0
    if resume_state is None or not resume_state.schedule:
        sched_state = None
    step = engine.global_steps
    if step != start_step:
        raise checkpoint.CheckpointError(
            f"DeepSpeed restored global step {step}, growlm_state.json says {start_step}: the tag folder mixes files "
            "of two checkpoints; resume from another tag"
        )

    is_main = info.rank == 0
    writer = None
    if is_main:
        from torch.utils.tensorboard import SummaryWriter

        out_dir.mkdir(parents=True, exist_ok=True)
        writer = SummaryWriter(str(out_dir / "tb"))
        metrics = open(out_dir / "metrics.jsonl", "a")
        n_params = param_count(cfg)
        print(
            f"growlm: model {cfg.shape_str()} ({n_params / 1e6:.2f}M parameters), ZeRO stage {zero_stage}, "
            f"{precision}, {info.world_size} rank(s) on {info.device.type}, micro batch {micro} x accumulation "
            f"{gas} x {info.world_size} ranks = {global_batch} sequences of {seq_len} tokens per step",
            flush=True,
        )
        print(
            f"growlm: data {data_dir}: {len(train_tokens):,} train tokens ({len(windows):,} samples), "
            f"{len(val_tokens):,} held-out tokens; starting at step {step}, {consumed:,} samples consumed",
            flush=True,
        )

    def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
        t = t.to(info.device)
        dist.all_reduce(t)
        return t.cpu()

    def evaluate(max_tokens: int, stride: int | None, progress: bool = False) -> NLL:
        engine.eval()
        tokens = val_tokens[:max_tokens] if max_tokens else val_tokens
        result = token_nll(
            lambda x: engine(x),
            tokens,
            seq_len,
            stride,
            args.eval_batch_size,
            rank=info.rank,
            world_size=info.world_size,
            all_reduce_sum=all_reduce_sum,
            device=info.device,
            progress=progress and is_main,
        )
        engine.train()
        return result

    def log_val(val: NLL, step: int, tokens: int, flops: int) -> None:
        writer.add_scalar("val/loss", val.loss, step)
        writer.add_scalar("val/perplexity", val.perplexity, step)
        rec = {
            "event": "val",
            "step": step,
            "val_loss": val.loss,
            "val_perplexity": val.perplexity,
            "val_tokens": val.n_tokens,
            "tokens": tokens,
            "flops": flops,
        }
        metrics.write(json.dumps(rec) + "\n")
        metrics.flush()

    before = None
    if not args.no_eval:
        t0 = time.perf_counter()
        before = evaluate(args.final_eval_tokens, args.eval_stride, progress=True)
        if is_main:
            print(
                f"growlm: held-out perplexity before training: {before.perplexity:.2f} (loss {before.loss:.4f} "
                f"over {before.n_tokens:,} tokens, {time.perf_counter() - t0:.1f} s)",
                flush=True,
            )

    # ---- train
    tok_per_step = global_batch * seq_len
    flops_per_step = flops_per_token(cfg, seq_len) * tok_per_step
    save_steps = set(planned)
    bar = None
    if is_main:
        from tqdm import tqdm

        bar = tqdm(total=args.max_steps, initial=step, desc="train", unit="step", dynamic_ncols=True)
    engine.train()
    t_log, steps_since_log, tokens_per_s = time.perf_counter(), 0, 0.0
    stage0_norm = float("nan")
    # (cumulative FLOPs, val loss) of the validations since the last growth: the slope trigger's history
    slope_points: list[tuple[float, float]] = list(resume_state.slope_points) if resume_state else []
    history = list(resume_state.growth) if resume_state else []  # growths this model went through (RunState.growth)

    def fixed_batch_loss(x: torch.Tensor, y: torch.Tensor) -> float:
        """Eval-mode loss of one batch per rank, averaged over ranks (the loss-preservation check)."""
        engine.eval()
        with torch.no_grad():
            loss = engine(x, y).detach().double().cpu()
        engine.train()
        return float(all_reduce_sum(loss)) / info.world_size

    while step < args.max_steps:
        if growth is not None and stage_index < len(growth.stages):
            stage = growth.stages[stage_index]
            kind, value = stage.when.kind, stage.when.value
            due = model.growth_masks is None and (  # a stage waits for a running mask ramp to end
                (kind == "step" and step >= value)
                or (kind == "tokens" and consumed * seq_len >= value)
                or (
                    kind == "slope" and slope_trigger([f for f, _ in slope_points], [v for _, v in slope_points], value)
                )
            )
            if due:
                x, y = windows.batch(
                    sampler.sample_ids(micro_batch_start(consumed, micro, 0, info.rank, info.world_size), micro)
                )
                x, y = x.to(info.device), y.to(info.device)
                loss_before = fixed_batch_loss(x, y)
                old_cfg, rss_before = cfg, max_rss_bytes()
                result = grow_engine(
                    engine,
                    stage.plan(cfg, growth.seed),
                    lambda c, m: build_engine(c, m, ds_cfg, partitioned=zero_stage == 3),
                    policy=stage.optimizer,
                    schedule_rule=stage.schedule,
                    ramp_steps=stage.ramp_steps or None,
                    rewarm=sched_state,
                )
                engine, model, cfg, sched_state = result.engine, result.engine.module, stage.target, result.schedule
                stage_index += 1
                slope_points.clear()
                history.append({"step": step, "stage": stage.name, "family": stage.family, "live": True,
                                "from": old_cfg.to_dict(), "to": cfg.to_dict()})  # fmt: skip
                flops_per_step = flops_per_token(cfg, seq_len) * tok_per_step
                loss_after = fixed_batch_loss(x, y)
                if is_main:
                    rec = {
                        "event": "growth",
                        "step": step,
                        "stage": stage.name,
                        "family": stage.family,
                        "from": old_cfg.to_dict(),
                        "to": cfg.to_dict(),
                        "params_from": param_count(old_cfg),
                        "params_to": param_count(cfg),
                        "loss_before": loss_before,
                        "loss_after": loss_after,
                        "seconds": result.seconds,
                        "bytes_moved": result.bytes_moved,
                        "max_rss_bytes_before": rss_before,
                        "max_rss_bytes": max_rss_bytes(),
                        "lr": engine.get_lr()[0],
                        "tokens": consumed * seq_len,
                        "flops": consumed_flops,
                    }
                    metrics.write(json.dumps(rec) + "\n")
                    metrics.flush()
                    for k in ("loss_before", "loss_after", "seconds", "bytes_moved", "params_to"):
                        writer.add_scalar(f"growth/{k}", rec[k], step)
                    writer.add_text(
                        "growth",
                        f"step {step}: {stage.name} ({stage.family}) {old_cfg.shape_str()} -> {cfg.shape_str()}",
                        step,
                    )
                    bar.write(
                        f"growlm: step {step}: grew {old_cfg.shape_str()} -> {cfg.shape_str()} ({stage.family}, "
                        f"{stage.name}) in {result.seconds:.1f} s; fixed-batch loss {loss_before:.6f} -> "
                        f"{loss_after:.6f}"
                    )
        t_step = time.perf_counter()
        lr = engine.get_lr()[0]  # the LR this step uses
        loss_sum = torch.zeros((), dtype=torch.float64)
        for j in range(gas):
            start = micro_batch_start(consumed, micro, j, info.rank, info.world_size)
            x, y = windows.batch(sampler.sample_ids(start, micro))
            loss = engine(x.to(info.device), y.to(info.device))
            engine.backward(loss)
            if j == gas - 1 and zero_stage == 0 and precision == "fp32":  # DeepSpeed reports no norm here
                grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
                stage0_norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
            engine.step()
            loss_sum += loss.detach().double().cpu()
            del loss  # its graph holds the parameters (and, through them, a grown-away engine)
        step, consumed = step + 1, consumed + global_batch
        consumed_flops += flops_per_step
        model.set_growth_step(step)  # mask ramp (no-op without masks; removes them at 1)
        if sched_state is not None:
            apply_rewarm(engine, sched_state, step)
        steps_since_log += 1
        mean_loss = float(all_reduce_sum(loss_sum / gas)) / info.world_size
        grad_norm = engine.get_global_grad_norm()
        grad_norm = float(grad_norm) if grad_norm is not None else stage0_norm
        if is_main:
            rec = {
                "event": "train",
                "step": step,
                "loss": mean_loss,
                "lr": lr,
                "grad_norm": grad_norm,
                "loss_scale": loss_scale_of(engine),
                "consumed_samples": consumed,
                "tokens": consumed * seq_len,
                "skipped_steps": engine.skipped_steps,
                "flops": consumed_flops,
                "step_time_s": time.perf_counter() - t_step,
                "max_rss_bytes": max_rss_bytes(),
            }
            metrics.write(json.dumps(rec) + "\n")
            metrics.flush()
            bar.update(1)
            if step % args.log_interval == 0 or step == args.max_steps:
                dt = time.perf_counter() - t_log
                tokens_per_s = steps_since_log * tok_per_step / dt
                t_log, steps_since_log = time.perf_counter(), 0
                tflops = flops_per_step / tok_per_step * tokens_per_s / 1e12  # model FLOPs, all ranks
                for k in ("loss", "lr", "grad_norm", "loss_scale"):
                    writer.add_scalar(f"train/{k}", rec[k], step)
                writer.add_scalar("train/tokens_per_s", tokens_per_s, step)
                writer.add_scalar("train/model_tflops", tflops, step)
                writer.add_scalar("train/consumed_tokens", rec["tokens"], step)
                bar.set_postfix(loss=f"{mean_loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:,.0f}")
        if args.eval_interval and step % args.eval_interval == 0 and step < args.max_steps:
            t_eval = time.perf_counter()
            val = evaluate(args.eval_tokens, None)
            t_log += time.perf_counter() - t_eval  # tokens/s counts training time only
            slope_points.append((float(consumed_flops), val.loss))
            if is_main:
                log_val(val, step, consumed * seq_len, consumed_flops)
                bar.write(f"step {step}: val loss {val.loss:.4f}, perplexity {val.perplexity:.2f}")
        if step in save_steps:
            state = RunState(
                model_config=cfg,
                global_step=step,
                consumed_samples=consumed,
                seq_len=seq_len,
                world_size=info.world_size,
                zero_stage=zero_stage,
                seed=seed,
                precision=precision,
                consumed_flops=consumed_flops,
                slope_points=list(slope_points),
                growth_masks=model.growth_masks,
                growth_stage=stage_index,
                schedule=engine_schedule(engine, sched_state.rewarm_start, sched_state.rewarm_steps)
                if sched_state is not None
                else None,
                data=DataIdentity(dir=str(data_dir), train_sha256=meta["splits"]["train"].get("sha256")),
                ds_config=ds_cfg,
                growth=history,
                extra=resume_state.extra if resume_state else {},
            )
            path = checkpoint.save(engine, save_dir, state, rank=info.rank)
            if is_main:
                bar.write(f"growlm: saved checkpoint {path}")
    if bar is not None:
        bar.close()

    # ---- close
    if not args.no_eval:
        after = evaluate(args.final_eval_tokens, args.eval_stride, progress=True)
        if is_main:
            log_val(after, step, consumed * seq_len, consumed_flops)
            print(
                f"growlm: held-out perplexity after {step} steps: {after.perplexity:.2f} (loss {after.loss:.4f}); "
                f"before: {before.perplexity:.2f}",
                flush=True,
            )
    if is_main:
        print(f"growlm: training tokens/s (last interval, all ranks): {tokens_per_s:,.0f}", flush=True)
        print(f"growlm: TensorBoard logs: {out_dir / 'tb'}  (tensorboard --logdir {out_dir / 'tb'})", flush=True)
        if (save_dir / checkpoint.LATEST).exists():
            print(f"growlm: checkpoint: {save_dir / (save_dir / checkpoint.LATEST).read_text().strip()}", flush=True)
        writer.close()
        metrics.close()
    dist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
