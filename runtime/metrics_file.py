"""``metrics.jsonl``, a run folder's record of what happened: its one writer and its one reader.

One JSON object per line, appended as it happens: ``{"event": "train", "step", "loss", "lr", "grad_norm",
"loss_scale", "consumed_samples", "tokens", "skipped_steps", "flops", "step_time_s", "max_rss_bytes" (host),
"cuda_max_allocated_bytes" (null without CUDA)}`` per step, ``{"event": "val", "step", "val_loss", "val_perplexity",
"val_tokens", "tokens", "flops"}`` per validation, ``{"event": "growth", ...}`` per growth (trainer.growth_events;
``"driver": true`` for growlm-run's offline growth), ``{"event": "stop", ...}`` when a job stops before a stage
(train.py --stop_before_stage), ``{"event": "interrupt", "step", "signal", "checkpoint", "tokens", "flops"}`` when a
signal stops it (trainer.stopping). Writers: the training loop (trainer.logger.MetricsLogger, rank 0) and growlm-run.
Readers: the trigger reference curve, growlm-run, growlm-bench, the experiments and the tests. A line a killed writer
left half-written is skipped by the reader and dropped by the next rewrite. A resumed run first drops what an
interrupted job wrote after its checkpoint (``purge_after``), so each step appears once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

from growlm.runtime.atomic import write_text

METRICS_FILE = "metrics.jsonl"
ANY_STAGE = "*"  # keeps_after_resume: every offline growth record at the checkpoint's step stays


class MetricsFileError(ValueError):
    """A metrics.jsonl that cannot serve as asked (missing, or without the records needed); names the file and fix."""


def metrics_path(where: str | Path) -> Path:
    """The metrics.jsonl of a run folder, or ``where`` itself when it names a file."""
    where = Path(where)
    return where if where.name.endswith(".jsonl") else where / METRICS_FILE


def read_records(where: str | Path, event: str | None = None) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl (a run folder or the file; [] when it does not exist), of one ``event`` kind
    when given; a half-written line is skipped."""
    path = metrics_path(where)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(r, dict) and (event is None or r.get("event") == event):
            out.append(r)
    return out


def val_points(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The "val" records with FLOPs > 0 (after training started), one per step, in step (= FLOPs) order; of two
    records of one step the last is kept (the final evaluation repeats the last step's)."""
    by_step = {int(r["step"]): r for r in records if r.get("event") == "val" and r.get("flops", 0) > 0}
    return [by_step[k] for k in sorted(by_step)]


def read_val_curve(where: str | Path) -> tuple[list[float], list[float]]:
    """The validation curve of a run: (cumulative training FLOPs, validation loss in nats/token) of its
    metrics.jsonl's ``val_points``.

    Raises:
        MetricsFileError: the file does not exist or holds no validation record after training started.
    """
    path = metrics_path(where)
    if not path.is_file():
        raise MetricsFileError(f"cannot read the metrics file {path}: no such file; give a run's metrics.jsonl")
    pts = val_points(read_records(path))
    if not pts:
        raise MetricsFileError(f"{path} holds no validation record; the run it comes from needs --eval_interval")
    return [float(r["flops"]) for r in pts], [float(r["val_loss"]) for r in pts]


def finished_at(where: str | Path, step: int) -> bool:
    """Whether the run's metrics.jsonl holds its validation at ``step`` (train.py's final one when ``step`` is its
    --max_steps): a finished run that a rerun of an experiment skips."""
    return any(r.get("step") == step for r in read_records(where, "val"))


def keeps_after_resume(
    record: dict[str, Any], step: int, stop_stage: str | None = None, grown_stage: str | None = ANY_STAGE
) -> bool:
    """Whether a record stays when a run resumes from its checkpoint at global step ``step`` (the resumed job writes
    the others again): records without a step; train/val records up to ``step``; live growth records before it (a
    growth at ``step`` happened after that checkpoint was saved and is done again); growlm-run's offline growth
    records before it, and at it for ``grown_stage`` (the stage whose offline growth made the checkpoint resumed
    from; ``ANY_STAGE``: train.py, which cannot tell, keeps them all); stop records before it, or at it for another
    stage than ``stop_stage`` (the resumed job stops there again)."""
    s, event = record.get("step"), record.get("event")
    if not isinstance(s, int | float):
        return True
    if event == "growth" and record.get("driver"):
        return s < step or (s == step and grown_stage in (ANY_STAGE, record.get("stage")))
    if event == "growth":
        return s < step
    if event == "stop":
        return s < step or (s == step and record.get("stage") != stop_stage)
    return s <= step


def purge_after(
    where: str | Path, step: int, stop_stage: str | None = None, grown_stage: str | None = ANY_STAGE
) -> int:
    """Drop from a metrics.jsonl the records an interrupted job wrote after the checkpoint at global step ``step``
    (``keeps_after_resume``), as TensorBoard's ``purge_step`` does for its scalars. Kept lines are copied byte for
    byte; a half-written line is dropped. The file is replaced atomically (runtime.atomic: a reader sees the old or
    the new file) and only when something changes. Returns the number of lines dropped (0 without a file)."""
    path = metrics_path(where)
    if not path.is_file():
        return 0
    text = path.read_text(errors="replace")
    lines = text.splitlines()
    kept = []
    for line in lines:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue  # a half-written line: the next record would be glued to it
        if not isinstance(r, dict) or keeps_after_resume(r, step, stop_stage, grown_stage):
            kept.append(line)
    if len(kept) != len(lines) or (text and not text.endswith("\n")):
        write_text(path, "".join(line + "\n" for line in kept), overwrite=True)
    return len(lines) - len(kept)


def open_for_append(where: str | Path) -> IO[str]:
    """The metrics.jsonl of a run folder opened for appending (the folder is created); write with ``write_record``."""
    path = metrics_path(where)
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "a")


def write_record(f: IO[str], record: dict[str, Any]) -> None:
    """Append ``record`` as one line in one write (another process appending to the same file cannot split it) and
    flush it, so a reader sees every finished record."""
    f.write(json.dumps(record) + "\n")
    f.flush()


def append_record(where: str | Path, record: dict[str, Any]) -> None:
    """Open, append one record (``write_record``) and close: for a writer that adds a record now and then
    (growlm-run's offline growth records)."""
    with open_for_append(where) as f:
        write_record(f, record)
