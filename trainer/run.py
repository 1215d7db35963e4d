"""One training run, top to bottom: validate (trainer.config), join the process group, open the data, build and
restore the engine (trainer.checkpointing), evaluate before, train (growth events, steps, validation, saves),
evaluate after, close. The architecture and data flow of a run are described in DESIGN.md, section "Data flow of a
run".
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from growlm.data.prepare import ensure_builtin_prepared, load_meta, open_tokens
from growlm.data.sampler import ResumableSampler, TokenWindows
from growlm.model.config import param_count
from growlm.model.layers import attention_kernel, flash_takes_gqa
from growlm.runtime import checkpoint, collectives, stop
from growlm.runtime.crash_points import hold_point
from growlm.runtime.dist import DistInfo, init_distributed, launch_rank, select_accelerator
from growlm.runtime.ds_config import choose_ds_config
from growlm.runtime.engine import loss_scale_of, release_engine
from growlm.runtime.lock import LockHeldError, hold_lock
from growlm.runtime.process_memory import cuda_max_allocated_bytes, peak_rss_bytes
from growlm.runtime.processes import DRIVER_PID_ENV
from growlm.runtime.schedule import start_schedule
from growlm.trainer.checkpointing import restore, save, schedule_note
from growlm.trainer.config import RunConfig, resolve
from growlm.trainer.errors import RankError, UsageError
from growlm.trainer.evaluation import Evaluator, perplexity_after, perplexity_before, validate_periodically
from growlm.trainer.growth_events import maybe_grow, next_stage
from growlm.trainer.init_from import load_weights
from growlm.trainer.logger import MetricsLogger, Throughput
from growlm.trainer.loop import (
    Batches,
    Progress,
    StepTaken,
    SyncedSteps,
    agree_stop,
    flops_per_step,
    sync_steps,
    train_step,
)
from growlm.trainer.stopping import stop_before_training, stop_on_signal

RUN_LOCK = "train.lock"  # <out_dir>/train.lock: one train.py per run folder (growlm-run's is <out_dir>/driver/lock)


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

    try:
        return init_distributed(run.dist_timeout_s)
    except RuntimeError as e:
        raise RankError(str(e)) from None


def open_data(run: RunConfig, info: DistInfo) -> RunData:
    """Open the token folder (preparing the built-in corpus once per node if it is the one used).

    Raises:
        UsageError: the built-in corpus could not be prepared on some node (every rank raises it), the data's
            vocabulary is larger than the model's, or (resume) its train split is not the one the checkpoint
            trained on.
    """

    if run.builtin_data:  # one rank a node prepares it; every rank learns whether any failed, so none is left waiting
        problem = ""
        if info.local_rank == 0:
            try:
                ensure_builtin_prepared()
            except (OSError, ValueError) as e:  # a cache folder that cannot be written, a damaged corpus
                problem = f"rank {info.rank} could not prepare the built-in corpus: {e}"
        problems = [p for p in (collectives.all_gather_object(problem) if info.world_size > 1 else [problem]) if p]
        if problems:
            raise UsageError(f"{problems[0]}; set GROWLM_CACHE to a folder every rank can write, or pass --data")
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


def claim_out_dir(run: RunConfig, info: DistInfo) -> Any:
    """Take ``<out_dir>/train.lock`` (runtime.lock) on global rank 0 before anything is written into --out_dir, so
    two runs never stage into the same checkpoint folder; a collective: every rank learns whether rank 0 got it.
    Only rank 0 takes it (on a shared filesystem the lock may work across nodes, where one lock per node would make
    a run's nodes refuse each other). Returns the open lock file on rank 0 (keep it referenced; closing it releases
    the lock), None on other ranks.

    Raises:
        UsageError: another process holds the lock (the message names the folder and the holder), or the folder
            cannot be created (raised on every rank; printed by rank 0).
    """

    lock, message = None, ""
    if info.rank == 0:
        try:
            run.out_dir.mkdir(parents=True, exist_ok=True)
            lock = hold_lock(run.out_dir / RUN_LOCK)
        except LockHeldError as e:
            message = (
                f"--out_dir {run.out_dir} is in use by another growlm-train ({e.holder}; lock {e.path}): two runs in "
                "one folder would mix their checkpoints; wait for it to end or stop it, or choose another --out_dir"
            )
        except OSError as e:
            message = f"--out_dir {run.out_dir} cannot be used ({e.strerror or e}); choose a folder you can write"
    if info.world_size > 1:
        message = collectives.broadcast_object(message, src=0)
    if message:
        raise UsageError(message)
    return lock


def check_same_plan(run: RunConfig, info: DistInfo) -> None:
    """Refuse ranks holding different --growth_plan files: their collectives would mismatch and hang.

    Raises:
        RankError: the plan files' sha256 differ between ranks (raised on every rank).
    """
    if run.growth is None:
        return
    digest = hashlib.sha256(Path(run.growth_plan).read_bytes()).hexdigest()
    digests = collectives.all_gather_object(digest)
    if len(set(digests)) > 1:
        raise RankError(
            f"rank {info.rank}: the ranks read different --growth_plan files (sha256 "
            f"{', '.join(d[:12] for d in digests)}); give every rank the same plan"
        )


def announce(log: MetricsLogger, run: RunConfig, p: Progress, data: Batches, run_data: RunData) -> None:
    """Print the run's model, parallelism, batch and data on rank 0."""
    info, cfg = data.info, run.model
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(run.precision, torch.float32)
    n_rep = cfg.n_head // cfg.n_kv_head  # query heads per key/value head (1 for GPT-2)
    gqa = n_rep > 1 and flash_takes_gqa(torch.device(info.device), dtype, cfg.head_dim)
    kernel = attention_kernel(cfg.head_dim, dtype, info.device, n_rep, gqa)
    log.console(
        f"growlm: model {cfg.shape_str()} ({param_count(cfg) / 1e6:.2f}M parameters), ZeRO stage {run.zero_stage}, "
        f"{run.precision}, {info.world_size} rank(s) on {info.device.type}, micro batch {data.micro} x accumulation "
        f"{data.gas} x {info.world_size} ranks = {data.global_batch} sequences of {run.seq_len} tokens per step; "
        f"attention: SDPA {kernel} kernel" + (", compiled" if run.compile else "")
    )
    log.console(
        f"growlm: data {run.data_dir}: {len(run_data.windows.tokens):,} train tokens ({len(run_data.windows):,} "
        f"samples), {len(run_data.val_tokens):,} held-out tokens; starting at step {p.step}, {p.consumed:,} samples "
        "consumed"
    )


def step_record(p: Progress, taken: StepTaken, seq_len: int) -> dict[str, Any]:
    """The "train" record of metrics.jsonl for the step just taken, with ``loss`` and ``grad_norm`` still None and
    ``step_time_s`` its host time so far: ``fill_records`` completes them after the interval's sync."""
    return {
        "event": "train",
        "step": p.step,
        "loss": None,
        "lr": taken.lr,
        "grad_norm": None,
        "loss_scale": loss_scale_of(p.engine),
        "consumed_samples": p.consumed,
        "tokens": p.consumed * seq_len,
        "skipped_steps": p.engine.skipped_steps,
        "flops": p.consumed_flops,
        "step_time_s": taken.ended - taken.started,
        "max_rss_bytes": peak_rss_bytes(),  # host
        "cuda_max_allocated_bytes": cuda_max_allocated_bytes(),  # None (null) without CUDA
    }


def fill_records(pending: list[tuple[StepTaken, dict[str, Any]]], synced: SyncedSteps) -> list[dict[str, Any]]:
    """The pending steps' records with the values one sync read back: each step's mean loss and gradient norm; the
    last step's time runs to the end of the sync (on a GPU the interval's kernels finish there), so the interval's
    step times add up to its wall time."""
    records = []
    for i, (taken, rec) in enumerate(pending):
        rec = {**rec, "loss": synced.losses[i], "grad_norm": synced.grad_norms[i]}
        if i == len(pending) - 1:
            rec["step_time_s"] = synced.synced - taken.started
        records.append(rec)
    return records


def sync_due(p: Progress, run: RunConfig, log_interval: int) -> bool:
    """Whether the steps taken so far are read back after this step (the same answer on every rank): at each log
    interval and the last step, and before anything that logs or decides after it: a planned save, a periodic
    validation, a due growth stage (or --stop_before_stage's stop)."""
    return (
        p.step % log_interval == 0
        or p.step >= run.max_steps
        or p.step in run.save_steps
        or bool(run.eval_interval and p.step % run.eval_interval == 0)
        or next_stage(p, run) is not None
    )


def stop_checkpoint_saved(p: Progress, run: RunConfig, stage_name: str) -> bool:
    """Whether this step's tag already holds this very state (a job killed after its stop save, resumed from it).

    Raises:
        UsageError: the tag holds another state: the checkpoint the job resumed from, of another model shape or
            growth stage (stage ``stage_name`` is due at the step the job started at, e.g. two token triggers
            inside one global batch); such a stop cannot be split across jobs.
    """
    tag = checkpoint.tag_for(p.step)
    if tag not in checkpoint.existing_tags(run.save_dir):
        return False
    saved = checkpoint.read_state(run.save_dir, tag, verify=False)
    if saved.growth_stage == p.stage_index and saved.model_config.shape_str() == p.model.shape_str():
        return True
    raise UsageError(
        f"--stop_before_stage {stage_name}: the stage is due at step {p.step}, where {run.save_dir / tag} already "
        f"holds the run after {saved.growth_stage} growth stage(s) ({saved.model_config.shape_str()}), not this "
        f"job's model after {p.stage_index} ({p.model.shape_str()}); two stages due in the same step cannot run "
        "on different resources: move the stage's trigger at least one step later, or give it the previous resources"
    )


def stop_before_stage(p: Progress, run: RunConfig, info: DistInfo, log: MetricsLogger, sha: str | None) -> bool:
    """With --stop_before_stage NAME: when stage NAME is due, save the run at this step (unless that tag already
    holds it: ``stop_checkpoint_saved``) and log a "stop" record (``save_s``: seconds of the save, None when an
    earlier job saved it); returns whether the run stops here.

    Raises:
        UsageError: see ``stop_checkpoint_saved``.
    """
    stage = next_stage(p, run) if run.stop_before_stage is not None else None
    if stage is None or stage.name != run.stop_before_stage:
        return False
    t = time.perf_counter()
    saved_before = stop_checkpoint_saved(p, run, stage.name)
    if not saved_before:
        save(p, run, info, sha)
    save_s = None if saved_before else time.perf_counter() - t  # None: saved by an earlier, killed job, time unknown
    hold_point(f"train.stopped:{p.step}")  # test-only (runtime.crash_points): stop checkpoint saved, no stop record
    rec = {"event": "stop", "step": p.step, "stage": stage.name, "save_s": save_s,
           "tokens": p.consumed * run.seq_len, "flops": p.consumed_flops}  # fmt: skip
    log.log(rec)
    log.console(f"growlm: step {p.step}: stage {stage.name!r} is due; saved and stopping (--stop_before_stage)")
    return True


@dataclass(frozen=True)
class TrainEnd:
    """How ``train`` ended: ``stage``: stopped before --stop_before_stage's stage; ``status``: the exit status of a
    run a signal stopped (128 + its number; 0: not stopped by one)."""

    stage: bool = False
    status: int = 0


def train(
    p: Progress, run: RunConfig, data: Batches, ev: Evaluator, log: MetricsLogger, sha: str | None
) -> tuple[Throughput, TrainEnd]:
    """Train until --max_steps (or until --stop_before_stage's stage is due, or a signal stops every rank): before
    each step a due growth, then the step, periodic validation and the planned saves. The steps' losses stay on
    the device until the next sync point (``sync_due``: each log interval, the last step, a save, a validation, a
    due growth); there one all-reduce reads them back with every rank's stop requests and their records are
    logged. A stop requested before training (``runtime.stop``) ends it before the first step; one agreed at a
    sync point ends it after that step's validation and save (``trainer.stopping``). Returns the throughput meter
    (its last measurement is the run's tokens/s) and how the run ended."""
    own_grad_norm = run.zero_stage == 0 and run.precision == "fp32"  # DeepSpeed reports no norm there
    meter = Throughput(data.global_batch * run.seq_len)
    signum = agree_stop()  # a signal during the start or the evaluation before training
    if signum:
        return meter, TrainEnd(status=stop_before_training(p, run, log, signum))
    log.start_bar(p.step)
    p.engine.train()
    pending: list[tuple[StepTaken, dict[str, Any]]] = []  # steps not yet read back (at most a log interval)
    try:
        while p.step < run.max_steps:
            if stop_before_stage(p, run, data.info, log, sha):
                return meter, TrainEnd(stage=True)
            maybe_grow(p, run, data, log)
            taken = train_step(p, data, own_grad_norm=own_grad_norm)
            meter.step()
            pending.append((taken, step_record(p, taken, run.seq_len)))
            stop_signal = 0
            if sync_due(p, run, log.log_interval):
                synced = sync_steps([t for t, _ in pending], data.info)
                stop_signal = synced.stop_signal
                for rec in fill_records(pending, synced):
                    if log.enabled:
                        log.train(rec, meter, flops_per_step(p.model, data))
                pending = []
            hold_point(f"train.step:{p.step}")  # test-only (runtime.crash_points): killed while training
            validate_periodically(ev, p, run, log, meter)
            path = None
            if p.step in run.save_steps:
                path = save(p, run, data.info, sha)
                log.console(f"growlm: saved checkpoint {path}")
            if stop_signal:
                log.close_bar()
                return meter, TrainEnd(status=stop_on_signal(p, run, data.info, log, sha, stop_signal, path))
        return meter, TrainEnd()
    finally:  # also on an error: its message then starts a line of its own, not the bar's
        log.close_bar()


def build(run: RunConfig) -> Any:
    """The run's freshly built engine (a collective): GPT-2's init seeded by --seed (identical on every rank), the
    LR schedule at its start, and with --init_from the folder's weights loaded into it (built inside ``zero.Init`` at
    ZeRO-3 then, as every value is overwritten). A --resume checkpoint is loaded into it next (restore).
    """

    torch.manual_seed(run.seed)  # identical init on every rank
    masks = run.resume_state.growth_masks if run.resume_state else None
    partitioned = run.init_from is not None and run.zero_stage == 3
    engine = run.build_engine(run.model, masks, partitioned=partitioned)
    start_schedule(engine)  # step 1 trains at the warm-up's first non-zero LR (a resume then loads its position)
    if run.init_from is not None:
        load_weights(engine, run.init_from)
    return engine


def pick_ds_config(args: argparse.Namespace, accelerator: str) -> None:
    """Set ``args.ds_config`` to the file this run uses on ``accelerator`` (``runtime.ds_config.choose_ds_config``:
    a shipped config's GPU variant on CUDA, anything else as given); when it changed, global rank 0 prints one line
    naming both files."""
    args.ds_config, note = choose_ds_config(args.ds_config, accelerator)
    if note and launch_rank() == 0:
        print(note, flush=True)


def run(args: argparse.Namespace) -> int:
    """Validate, build, train, close (see the module docstring). Returns the exit status. On CUDA a shipped
    --ds_config is replaced by its GPU variant, said in one line (``runtime.ds_config.choose_ds_config``).

    Raises:
        UsageError, RankError, CheckpointError, GrowthError: bad input, reported by trainer.cli.main.
    """
    pick_ds_config(args, select_accelerator())
    cfg = resolve(args)
    info = join(cfg)
    if cfg.resume is not None:  # each rank checks the files it loads (and its part of the shared ones)
        try:
            checkpoint.verify_shares(cfg.resume, rank=info.rank, world_size=info.world_size)
        except checkpoint.CheckpointError as e:
            raise checkpoint.CheckpointError(f"--resume {e}") from None
    run_data = open_data(cfg, info)
    check_same_plan(cfg, info)
    lock = claim_out_dir(cfg, info)
    try:
        return _train_locked(cfg, info, run_data)
    finally:
        if lock is not None:
            lock.close()  # released: the next job of this folder (a growlm-run stage, a resume) may take it


def _train_locked(cfg: RunConfig, info: DistInfo, run_data: RunData) -> int:
    """``run`` once --out_dir is this run's: build, restore, train, evaluate, close. Returns the exit status."""
    engine = build(cfg)
    micro, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    data = Batches(run_data.windows, run_data.sampler, micro, gas, info)
    p = restore(engine, cfg, info)
    purge = p.step + 1 if cfg.resume_state is not None else None  # scalars of an interrupted job after the checkpoint
    log = MetricsLogger(
        cfg.out_dir,
        enabled=info.rank == 0,
        log_interval=cfg.log_interval,
        max_steps=cfg.max_steps,
        purge_step=purge,
        stop_stage=cfg.stop_before_stage,
    )
    announce(log, cfg, p, data, run_data)
    note = schedule_note(p, cfg)
    if note:
        log.console(note)
    ev = Evaluator(run_data.val_tokens, cfg.seq_len, cfg.eval_batch_size, info)
    relaunched = cfg.resume_state is not None and os.environ.get(DRIVER_PID_ENV)  # growlm-run: measured by job 0
    before = None if relaunched else perplexity_before(ev, p.engine, cfg, log)
    meter, end = train(p, cfg, data, ev, log, run_data.train_sha256)
    status = end.status
    if not end.stage and not status:
        signum = agree_stop()  # a signal during the last steps' saves: no evaluation after
        if signum:
            log.console(f"growlm: {stop.reason(signum)}: training finished; skipping the evaluation after it")
            status = stop.exit_status(signum)
        else:
            status = perplexity_after(ev, p, cfg, log, before)
    log.console(f"growlm: training tokens/s (last interval, all ranks): {meter.tokens_per_s:,.0f}")
    log.console(f"growlm: TensorBoard logs: {cfg.out_dir / 'tb'}  (tensorboard --logdir {cfg.out_dir / 'tb'})")
    if log.enabled and (cfg.save_dir / checkpoint.LATEST).exists():
        log.console(f"growlm: checkpoint: {cfg.save_dir / (cfg.save_dir / checkpoint.LATEST).read_text().strip()}")
    log.close()
    release_engine(p.engine)  # its memory returns (a ZeRO-3 engine is otherwise never freed)
    collectives.barrier()
    return status
