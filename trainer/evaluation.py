"""Held-out evaluation during a run: periodic validation and the before/after sliding-window perplexity.

Both score the validation split's first tokens with trainer.scoring.token_nll, windows shared among the
data-parallel ranks (a collective: every rank calls with the same arguments). The metric is described in DESIGN.md,
section "Evaluation".
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from growlm.runtime import stop
from growlm.runtime.dist import DistInfo
from growlm.trainer.config import RunConfig
from growlm.trainer.logger import MetricsLogger, Throughput
from growlm.trainer.loop import Progress, agree_stop, all_reduce_sum
from growlm.trainer.scoring import NLL, EvalStopped, token_nll


@dataclass(frozen=True)
class Evaluator:
    """Scores an engine on the held-out tokens ``val_tokens`` (1-D token ids) in windows of ``seq_len`` tokens,
    ``batch_size`` windows per forward pass."""

    val_tokens: np.ndarray
    seq_len: int
    batch_size: int
    info: DistInfo

    def score(
        self, engine: Any, max_tokens: int, stride: int | None, progress: bool = False, stoppable: bool = False
    ) -> NLL:
        """Summed NLL of the first ``max_tokens`` held-out tokens (0: all) in eval mode, every ``stride`` tokens
        (None: non-overlapping windows); ``progress`` shows a bar on rank 0.

        Raises:
            EvalStopped: ``stoppable`` and the ranks agreed on a stop request (``agree_stop``, checked every few
                batches).
        """
        engine.eval()
        tokens = self.val_tokens[:max_tokens] if max_tokens else self.val_tokens
        try:
            return token_nll(
                lambda x: engine(x),
                tokens,
                self.seq_len,
                stride,
                self.batch_size,
                rank=self.info.rank,
                world_size=self.info.world_size,
                all_reduce_sum=all_reduce_sum,
                device=self.info.device,
                progress=progress and self.info.rank == 0,
                stop_check=agree_stop if stoppable else None,
            )
        finally:
            engine.train()


def perplexity_before(ev: Evaluator, engine: Any, run: RunConfig, log: MetricsLogger) -> NLL | None:
    """The held-out perplexity before training (--final_eval_tokens, --eval_stride), printed; None with
    --no_final_eval, or when a stop request ends it early (the run then stops before its first step)."""
    if run.no_final_eval:
        return None
    t0 = time.perf_counter()
    try:
        before = ev.score(engine, run.final_eval_tokens, run.eval_stride, progress=True, stoppable=True)
    except EvalStopped as e:
        log.console(f"growlm: {stop.reason(e.signum)}: the evaluation before training stopped early")
        return None
    log.console(
        f"growlm: held-out perplexity before training: {before.perplexity:.2f} (loss {before.loss:.4f} "
        f"over {before.n_tokens:,} tokens, {time.perf_counter() - t0:.1f} s)"
    )
    return before


def perplexity_after(ev: Evaluator, p: Progress, run: RunConfig, log: MetricsLogger, before: NLL | None) -> int:
    """The held-out perplexity after training: a "val" record and a line comparing it with ``before`` (when it was
    measured: a job growlm-run relaunched skips it). Returns 0, or the exit status of a stop request that ended it
    early (``runtime.stop.exit_status``; no record then)."""
    if run.no_final_eval:
        return 0
    try:
        after = ev.score(p.engine, run.final_eval_tokens, run.eval_stride, progress=True, stoppable=True)
    except EvalStopped as e:
        log.console(f"growlm: {stop.reason(e.signum)}: training finished; the evaluation after it stopped early")
        return stop.exit_status(e.signum)
    log.val(after, step=p.step, tokens=p.consumed * run.seq_len, flops=p.consumed_flops)
    was = f"{before.perplexity:.2f}" if before is not None else "not measured (a growlm-run relaunch)"
    log.console(
        f"growlm: held-out perplexity after {p.step} steps: {after.perplexity:.2f} (loss {after.loss:.4f}); "
        f"before: {was}"
    )
    return 0


def validate_periodically(ev: Evaluator, p: Progress, run: RunConfig, log: MetricsLogger, meter: Throughput) -> None:
    """Every --eval_interval steps (not at the last step): score --eval_tokens held-out tokens, add the point to
    the slope trigger's history and log a "val" record. The time taken is left out of tokens/s."""
    if not (run.eval_interval and p.step % run.eval_interval == 0 and p.step < run.max_steps):
        return
    t_eval = time.perf_counter()
    val = ev.score(p.engine, run.eval_tokens, None)
    meter.pause(time.perf_counter() - t_eval)  # tokens/s counts training time only
    p.slope_points.append((float(p.consumed_flops), val.loss))
    log.val(val, step=p.step, tokens=p.consumed * run.seq_len, flops=p.consumed_flops)
    log.console(f"step {p.step}: val loss {val.loss:.4f}, perplexity {val.perplexity:.2f}")
