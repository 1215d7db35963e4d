"""The one logger of a run: ``metrics.jsonl`` (runtime.metrics_file: one JSON record per step, validation and growth
event), TensorBoard scalars under ``tb/``, and the console (a tqdm progress bar while training).

Only rank 0 writes; on other ranks every method does nothing, so callers need no rank checks. The record keys are
runtime.metrics_file's; "growth" records are built by trainer.growth_events.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from growlm.runtime.metrics_file import METRICS_FILE, open_for_append, purge_after, write_record
from growlm.trainer.scoring import NLL

TRAIN_SCALARS = ("loss", "lr", "grad_norm", "loss_scale")  # train/<key> in TensorBoard at every log interval


class Throughput:
    """Training tokens per second over the steps since the last measurement, excluding paused time (validation).

    Args:
        tokens_per_step: tokens of one optimizer step, all ranks.
    """

    def __init__(self, tokens_per_step: int) -> None:
        self.tokens_per_step = tokens_per_step
        self.tokens_per_s = 0.0  # the last measurement
        self._t, self._steps = time.perf_counter(), 0

    def step(self) -> None:
        """Count one optimizer step."""
        self._steps += 1

    def pause(self, seconds: float) -> None:
        """Leave ``seconds`` (spent on something other than training) out of the current interval."""
        self._t += seconds

    def measure(self) -> float:
        """Tokens/s of the steps counted since the last call; starts a new interval."""
        now = time.perf_counter()
        self.tokens_per_s = self._steps * self.tokens_per_step / (now - self._t)
        self._t, self._steps = now, 0
        return self.tokens_per_s


EARLIER = "earlier"  # metrics.jsonl -> metrics.earlier-<UTC time>.jsonl, tb -> tb.earlier-<UTC time>


def set_aside_earlier_records(out_dir: Path) -> str:
    """Make room for a fresh run's records (no --resume) in ``out_dir``: an earlier run's ``metrics.jsonl`` holding
    any line (a run that ended, or was killed, before this one started over in the same folder) is renamed to
    ``metrics.earlier-<UTC time of its last write>.jsonl`` and its ``tb/`` to ``tb.earlier-<the same time>``, so the
    two runs' steps never mix in one file or one TensorBoard run (a fresh run appended to it, step 1 twice). Nothing
    is deleted; an empty metrics.jsonl (a run killed before its first record) is left to be appended to.

    Returns:
        The one line saying what moved where ('' when nothing did).
    """
    path = out_dir / METRICS_FILE
    if not path.is_file() or not path.read_text(errors="replace").strip():
        return ""
    stamp, n = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(path.stat().st_mtime)), 1
    names = (f"metrics.{EARLIER}-{stamp}.jsonl", f"tb.{EARLIER}-{stamp}")
    while any((out_dir / name).exists() for name in names):  # two earlier runs within one second
        n += 1
        names = (f"metrics.{EARLIER}-{stamp}-{n}.jsonl", f"tb.{EARLIER}-{stamp}-{n}")
    lines = len(path.read_text(errors="replace").splitlines())
    path.rename(out_dir / names[0])
    moved = [f"{METRICS_FILE} ({lines:,} line(s)) to {names[0]}"]
    if (out_dir / "tb").is_dir():
        (out_dir / "tb").rename(out_dir / names[1])
        moved.append(f"tb/ to {names[1]}/")
    return (
        f"growlm: --out_dir {out_dir} holds an earlier run's records and this run starts afresh (no --resume): moved "
        f"{' and '.join(moved)}, so its steps do not mix with this run's"
    )


class MetricsLogger:
    """metrics.jsonl + TensorBoard + console of one run (writes on rank 0 only; see the module docstring).

    Args:
        out_dir: the run folder (created); ``metrics.jsonl`` is appended to, TensorBoard writes ``out_dir/tb``.
        enabled: this is rank 0.
        log_interval: steps between TensorBoard train scalars and progress-bar updates of the loss.
        max_steps: the last step (always logged).
        purge_step: a resumed run's first step (checkpoint step + 1): TensorBoard drops the scalars an earlier,
            interrupted job wrote at this step and after (SummaryWriter's ``purge_step``), and metrics.jsonl the
            records it wrote after the checkpoint (``purge_after``), so each step shows once. None: a fresh run,
            which first moves an earlier run's records aside (``set_aside_earlier_records``).
        stop_stage: the run's --stop_before_stage (a stop record for it at the checkpoint's step is written again).
    """

    def __init__(
        self,
        out_dir: Path,
        *,
        enabled: bool,
        log_interval: int,
        max_steps: int,
        purge_step: int | None = None,
        stop_stage: str | None = None,
    ) -> None:
        self.enabled, self.log_interval, self.max_steps = enabled, log_interval, max_steps
        self.out_dir = out_dir
        self._writer = self._file = self._bar = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter  # lazy: heavy (about 1 s, tensorboard), rank 0 only

            out_dir.mkdir(parents=True, exist_ok=True)
            if purge_step is not None:
                purge_after(out_dir, purge_step - 1, stop_stage)
            else:
                moved = set_aside_earlier_records(out_dir)
                if moved:
                    self.console(moved)
            self._writer = SummaryWriter(str(out_dir / "tb"), purge_step=purge_step)
            self._file = open_for_append(out_dir)

    def console(self, message: str) -> None:
        """Print a line (above the progress bar while it runs)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(message)
        else:
            print(message, flush=True)

    def log(self, record: dict[str, Any], scalars: dict[str, float] | None = None, step: int | None = None) -> None:
        """Append ``record`` to metrics.jsonl and write ``scalars`` (TensorBoard tag -> value) at ``step``."""
        if not self.enabled:
            return
        write_record(self._file, record)
        self.scalars(scalars or {}, record["step"] if step is None else step)

    def scalars(self, scalars: dict[str, float], step: int) -> None:
        """Write TensorBoard scalars (tag -> value) at ``step``."""
        if not self.enabled:
            return
        for tag, value in scalars.items():
            self._writer.add_scalar(tag, value, step)

    def text(self, tag: str, text: str, step: int) -> None:
        """Write a TensorBoard text entry."""
        if self.enabled:
            self._writer.add_text(tag, text, step)

    def start_bar(self, initial: int) -> None:
        """Show the training progress bar (steps ``initial`` .. max_steps)."""
        if self.enabled:
            self._bar = tqdm(total=self.max_steps, initial=initial, desc="train", unit="step", dynamic_ncols=True)

    def close_bar(self) -> None:
        """Close the progress bar; later console lines are printed plainly."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def train(self, record: dict[str, Any], meter: Throughput, flops_per_step: int) -> None:
        """Log a "train" record; at each log interval (and the last step) also TensorBoard's train scalars,
        tokens/s (from ``meter``) and model TFLOP/s (all ranks) of the current model."""
        if not self.enabled:
            return
        self.log(record)
        self._bar.update(1)
        step = record["step"]
        if step % self.log_interval == 0 or step == self.max_steps:
            tokens_per_s = meter.measure()
            tflops = flops_per_step / meter.tokens_per_step * tokens_per_s / 1e12  # model FLOPs, all ranks
            scalars = {f"train/{k}": record[k] for k in TRAIN_SCALARS}
            scalars.update(
                {
                    "train/tokens_per_s": tokens_per_s,
                    "train/model_tflops": tflops,
                    "train/consumed_tokens": record["tokens"],
                }
            )
            self.scalars(scalars, step)
            self._bar.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{record['lr']:.2e}", tok_s=f"{tokens_per_s:,.0f}")

    def val(self, val: NLL, *, step: int, tokens: int, flops: int) -> None:
        """Log a "val" record (mean loss in nats/token, perplexity, tokens scored) and val/loss, val/perplexity."""
        record = {
            "event": "val",
            "step": step,
            "val_loss": val.loss,
            "val_perplexity": val.perplexity,
            "val_tokens": val.n_tokens,
            "tokens": tokens,
            "flops": flops,
        }
        self.log(record, {"val/loss": val.loss, "val/perplexity": val.perplexity})

    def close(self) -> None:
        """Close the bar, TensorBoard and metrics.jsonl."""
        self.close_bar()
        if self.enabled:
            self._writer.close()
            self._file.close()
