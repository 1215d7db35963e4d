"""One training run, top to bottom: validate (trainer.config), join the process group, open the data, build and
restore the engine (trainer.checkpointing), evaluate before, train (growth events, steps, validation, saves),
evaluate after, close. The architecture and data flow of a run are described in DESIGN.md, section "Data flow of a
run".
"""

from __future__ import annotations

import argparse
import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from data.sampler import ResumableSampler, TokenWindows
from growth.schedule import start_schedule
from model.config import param_count
from runtime import checkpoint
from runtime.dist import DistInfo
from runtime.engine import build_engine, loss_scale_of, release_engine
from trainer.checkpointing import restore, save
from trainer.config import RunConfig, resolve
from trainer.errors import RankError, UsageError
from trainer.evaluation import Evaluator, perplexity_after, perplexity_before, validate_periodically
from trainer.growth_events import maybe_grow
from trainer.loop import Batches, Progress, StepResult, flops_per_step, train_step
from trainer.metrics import MetricsLogger, Throughput, max_rss_bytes


@dataclass(frozen=True)
class RunData:
    """The opened token folder: training windows of seq_len + 1 tokens, their resumable order, the held-out tokens
    and the sha256 of the train split (None when meta.json records none)."""

    windows: TokenWindows
    sampler: ResumableSampler
    val_tokens: np.ndarray
    train_sha256: str | None


def join(run: RunConfig) -> DistInfo:
    """Initialise the process group (runtime.dist.init_distributed).

    Raises:
        RankError: the group cannot be formed (every rank reports it: the rank that cannot reach the master is
            often not rank 0).
    """
    from runtime.dist import init_distributed

    try:
        return init_distributed(run.dist_timeout_s)
    except RuntimeError as e:
        raise RankError(str(e)) from None


def open_data(run: RunConfig, info: DistInfo) -> RunData:
    """Open the token folder (preparing the built-in corpus once per node if it is the one used).

    Raises:
        UsageError: the data's vocabulary is larger than the model's, or (resume) its train split is not the one
            the checkpoint trained on.
    """
    from data.prepare import ensure_builtin_prepared, load_meta, open_tokens

    if run.builtin_data:
        if info.local_rank == 0:
            ensure_builtin_prepared()
        dist.barrier()
    meta = load_meta(run.data_dir)
    if meta["vocab_size"] > run.model.vocab_size:
        raise UsageError(
            f"the data's vocabulary ({meta['vocab_size']}) is larger than the model's vocab_size "
            f"({run.model.vocab_size}); use --data prepared with the model's tokenizer"
        )
    train_tokens, val_tokens = open_tokens(run.data_dir, "train"), open_tokens(run.data_dir, "val")
    windows = TokenWindows(train_tokens, run.seq_len)
    sha = meta["splits"]["train"].get("sha256")
    saved_sha = run.resume_state.data.train_sha256 if run.resume_state is not None else None
    if saved_sha and saved_sha != sha:
        raise UsageError(
            f"--data {run.data_dir}: its train split (sha256 {sha}) is "
            f"not the one the checkpoint trained on ({saved_sha}); resume with the same --data"
        )
    return RunData(windows, ResumableSampler(len(windows), run.seed), val_tokens, sha)


def check_same_plan(run: RunConfig, info: DistInfo) -> None:
    """Refuse ranks holding different --growth_plan files: their collectives would mismatch and hang.

    Raises:
        RankError: the plan files' sha256 differ between ranks (raised on every rank).
    """
    if run.growth is None:
        return
    digest = hashlib.sha256(Path(run.growth_plan).read_bytes()).hexdigest()
    digests = [None] * info.world_size
    dist.all_gather_object(digests, digest)
    if len(set(digests)) > 1:
        raise RankError(
            f"rank {info.rank}: the ranks read different --growth_plan files (sha256 "
            f"{', '.join(d[:12] for d in digests)}); give every rank the same plan"
        )


def announce(log: MetricsLogger, run: RunConfig, p: Progress, data: Batches, run_data: RunData) -> None:
    """Print the run's model, parallelism, batch and data on rank 0."""
    info, cfg = data.info, run.model
    log.console(
        f"growlm: model {cfg.shape_str()} ({param_count(cfg) / 1e6:.2f}M parameters), ZeRO stage {run.zero_stage}, "
        f"{run.precision}, {info.world_size} rank(s) on {info.device.type}, micro batch {data.micro} x accumulation "
        f"{data.gas} x {info.world_size} ranks = {data.global_batch} sequences of {run.seq_len} tokens per step"
    )
    log.console(
        f"growlm: data {run.data_dir}: {len(run_data.windows.tokens):,} train tokens ({len(run_data.windows):,} "
        f"samples), {len(run_data.val_tokens):,} held-out tokens; starting at step {p.step}, {p.consumed:,} samples "
        "consumed"
    )


def step_record(p: Progress, result: StepResult, seq_len: int) -> dict[str, Any]:
    """The "train" record of metrics.jsonl for the step just taken."""
    return {
        "event": "train",
        "step": p.step,
        "loss": result.loss,
        "lr": result.lr,
        "grad_norm": result.grad_norm,
        "loss_scale": loss_scale_of(p.engine),
        "consumed_samples": p.consumed,
        "tokens": p.consumed * seq_len,
        "skipped_steps": p.engine.skipped_steps,
        "flops": p.consumed_flops,
        "step_time_s": time.perf_counter() - result.started,
        "max_rss_bytes": max_rss_bytes(),
    }


def train(p: Progress, run: RunConfig, data: Batches, ev: Evaluator, log: MetricsLogger, sha: str | None) -> Throughput:
    """Train until --max_steps: before each step a due growth, then the step, its record, periodic validation and
    the planned saves. Returns the throughput meter (its last measurement is the run's tokens/s)."""
    own_grad_norm = run.zero_stage == 0 and run.precision == "fp32"  # DeepSpeed reports no norm there
    log.start_bar(p.step)
    p.engine.train()
    meter = Throughput(data.global_batch * run.seq_len)
    while p.step < run.max_steps:
        maybe_grow(p, run, data, log)
        result = train_step(p, data, own_grad_norm=own_grad_norm)
        meter.step()
        if log.enabled:
            log.train(step_record(p, result, run.seq_len), meter, flops_per_step(p.model, data))
        validate_periodically(ev, p, run, log, meter)
        if p.step in run.save_steps:
            path = save(p, run, data.info, sha)
            log.console(f"growlm: saved checkpoint {path}")
    log.close_bar()
    return meter


def build(run: RunConfig) -> Any:
    """The run's freshly built engine (a collective): GPT-2's init seeded by --seed (identical on every rank), the
    LR schedule at its start, and with --init_from the folder's weights loaded into it (built inside ``zero.Init`` at
    ZeRO-3 then, as every value is overwritten). A --resume checkpoint is loaded into it next (restore).
    """
    from trainer.init_from import load_weights

    torch.manual_seed(run.seed)  # identical init on every rank
    masks = run.resume_state.growth_masks if run.resume_state else None
    partitioned = run.init_from is not None and run.zero_stage == 3
    engine = build_engine(run.model, masks, run.ds_config, partitioned=partitioned)
    start_schedule(engine)  # step 1 trains at the warm-up's first non-zero LR (a resume then loads its position)
    if run.init_from is not None:
        load_weights(engine, run.init_from)
    return engine


def run(args: argparse.Namespace) -> int:
    """Validate, build, train, close (see the module docstring). Returns the exit status.

    Raises:
        UsageError, RankError, CheckpointError, GrowthError: bad input, reported by train.main.
    """
    cfg = resolve(args)
    info = join(cfg)
    run_data = open_data(cfg, info)
    check_same_plan(cfg, info)
    engine = build(cfg)
    micro, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    data = Batches(run_data.windows, run_data.sampler, micro, gas, info)
    p = restore(engine, cfg, info)
    log = MetricsLogger(cfg.out_dir, enabled=info.rank == 0, log_interval=cfg.log_interval, max_steps=cfg.max_steps)
    announce(log, cfg, p, data, run_data)
    ev = Evaluator(run_data.val_tokens, cfg.seq_len, cfg.eval_batch_size, info)
    before = perplexity_before(ev, p.engine, cfg, log)
    meter = train(p, cfg, data, ev, log, run_data.train_sha256)
    perplexity_after(ev, p, cfg, log, before)
    log.console(f"growlm: training tokens/s (last interval, all ranks): {meter.tokens_per_s:,.0f}")
    log.console(f"growlm: TensorBoard logs: {cfg.out_dir / 'tb'}  (tensorboard --logdir {cfg.out_dir / 'tb'})")
    if log.enabled and (cfg.save_dir / checkpoint.LATEST).exists():
        log.console(f"growlm: checkpoint: {cfg.save_dir / (cfg.save_dir / checkpoint.LATEST).read_text().strip()}")
    log.close()
    release_engine(p.engine)  # its memory returns (a ZeRO-3 engine is otherwise never freed)
    dist.barrier()
    return 0
