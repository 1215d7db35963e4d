"""growlm-gpu-check's train.py runs, shared by its sections (``gpu_check``, ``gpu_check_ranks``): the sizes of each
mode (``GPU``, ``SMOKE``), the ``Runner`` that records a section's checks and starts its train.py runs (on
``Runner.ranks`` ranks), and a run growing live with its checks (``train_run``, ``check_run``, ``check_growths``,
within ``GROWTH_TOL``)."""

from __future__ import annotations

import json
import math
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from growlm import TRAIN_SCRIPT
from growlm.runtime.atomic import write_json
from growlm.runtime.dist import select_accelerator
from growlm.runtime.ds_config import shipped_ds_config
from growlm.runtime.launch import launch_ranks
from growlm.runtime.metrics_file import read_records

# |loss after - loss before| allowed for a function-preserving growth, by precision: fp32 rounding only; bf16/fp16
# round the grown model's weights and activations (8 and 11 significand bits)
GROWTH_TOL = {"fp32": 1e-4, "bf16": 5e-2, "fp16": 1e-2}


@dataclass(frozen=True)
class Shapes:
    """The sizes of one mode (GPU or smoke)."""

    precision: str
    train_preset: str
    train_seq_len: int
    train_micro: int
    train_steps: int
    grow_depth_to: int  # n_layer after the duplication growth (x2)
    grow_steps: tuple[int, int]  # the steps of the two growths (after fp16's first overflow-skipped steps)
    grow_width_to: tuple[int, int]  # (n_embd, n_head) after the masked growth
    lr: float
    source_shape: tuple[str, ...]  # the offline and export sections' source model (train.py flags)
    source_steps: int  # and its steps
    bench_preset: str
    bench_seq_len: int
    bench_steps: int
    bench_skip: int
    compile_shape: tuple[str, ...]  # the compile section's shape (train.py flags) when it does not grow
    compile_steps: int
    compile_grow: tuple[int, int] | None  # (step, n_layer after) of its one live growth (duplication), or None


GPU = Shapes("bf16", "gpt2", 512, 8, 12, 24, (4, 7), (1024, 16), 6e-4, ("--preset", "gpt2", "--n_layer", "4"), 4,
             "gpt2-medium", 1024, 8, 3, (), 6, (3, 12))  # fmt: skip
SMOKE = Shapes("fp32", "tiny", 32, 4, 6, 4, (2, 4), (96, 6), 3e-3, ("--preset", "tiny"), 2, "tiny", 32, 3, 1,
               ("--preset", "tiny", "--n_layer", "1", "--n_embd", "32", "--n_head", "2"), 3, None)  # fmt: skip


class Runner:
    """What a section records (checks, results, a skip reason), written to ``sections/NAME.partial.json`` after
    every change, and the runs it starts: train.py on ``ranks`` ranks (1 unless the section sets it) with the mode's
    sizes, in the section's work folder, each rank's log in ``logs/NAME/RUN``."""

    def __init__(self, shapes: Shapes, section: str, folder: Path, work: Path, data: str | None, smoke: bool,
                 keep_work: bool) -> None:  # fmt: skip
        self.s, self.section, self.folder, self.work, self.data = shapes, section, folder, work, data
        self.smoke, self.keep_work = smoke, keep_work
        self.device = "cpu" if smoke else "cuda"
        self.ranks = 1
        self.checks: list[dict[str, Any]] = []
        self.results: dict[str, Any] = {}
        self.skipped: str | None = None
        self.finished = False

    def save(self) -> None:
        """Write what the section has so far to ``sections/NAME.partial.json`` (atomically)."""
        state = {"section": self.section, "checks": self.checks, "results": self.results, "skipped": self.skipped,
                 "finished": self.finished}  # fmt: skip
        write_json(self.folder / "sections" / f"{self.section}.partial.json", state, overwrite=True)

    def check(self, name: str, ok: bool, detail: str) -> bool:
        """Record one pass/fail check of the report; returns ``ok``."""
        self.checks.append({"section": self.section, "name": name, "ok": bool(ok), "detail": detail})
        self.save()
        return bool(ok)

    def record(self, key: str, value: Any) -> None:
        """Record one result (a run's numbers) under ``key``."""
        self.results[key] = value
        self.save()

    def skip(self, reason: str) -> None:
        """Mark the section skipped (a one-line ``reason``): neither passed nor failed."""
        self.skipped = reason
        self.save()

    def drop(self, *paths: Path) -> None:
        """Delete run folders and checkpoints the section no longer needs (kept with --keep_work)."""
        if not self.keep_work:
            for p in paths:
                shutil.rmtree(p, ignore_errors=True)

    def ds_config(self, name: str, stage: int, precision: str, lr: float | None = None,
                  weight_decay: float | None = None, base: dict[str, Any] | None = None) -> Path:  # fmt: skip
        """ds_configs/zero{STAGE}_{PRECISION}.json (on CUDA its GPU variant, ds_configs/gpu/), or the config ``base``,
        with the mode's micro batch, peak LR (or ``lr``), the config's weight decay (or ``weight_decay``) and a 2-step
        warm-up, written to WORK/NAME.json; its path."""
        if base is None:
            base = json.loads(shipped_ds_config(stage, precision, select_accelerator()).read_text())  # GPU variant
        cfg = json.loads(json.dumps(base))  # a copy: ``base`` is left as given
        cfg["train_micro_batch_size_per_gpu"] = self.s.train_micro
        cfg["optimizer"]["params"]["lr"] = self.s.lr if lr is None else lr
        if weight_decay is not None:
            cfg["optimizer"]["params"]["weight_decay"] = weight_decay
        cfg["scheduler"]["params"]["warmup_num_steps"] = 2
        path = self.work / f"{name}.json"
        path.write_text(json.dumps(cfg, indent=2))
        return path

    def train(self, name: str, args: list[str]) -> tuple[int, Path, str | None, float]:
        """train.py on ``ranks`` ranks with ``args`` into WORK/NAME (no time limit of its own: the section's budget
        applies; smoke: the CPU's threads shared between the ranks); (exit status, run folder, train.py's own error
        line from the first rank that printed one, or None, wall seconds)."""
        out, logs, n = self.work / name, self.folder / "logs" / self.section / name, self.ranks
        cmd = [sys.executable, str(TRAIN_SCRIPT), "--seq_len", str(self.s.train_seq_len), "--no_final_eval"]
        cmd += ["--log_interval", "1", *(["--data", self.data] if self.data else []), *args, "--out_dir", str(out)]
        threads = str(max(1, torch.get_num_threads() // n))
        env = {"OMP_NUM_THREADS": threads, "DS_ACCELERATOR": "cpu"} if self.smoke else {}
        t = time.monotonic()
        res = launch_ranks(cmd, n, envs=[env] * n, log_dir=logs, timeout_s=math.inf)
        wall = time.monotonic() - t
        error = next((ln.split("growlm-train: error:", 1)[1].strip() for text in res.outputs
                      for ln in text.splitlines() if "growlm-train: error:" in ln), None)  # fmt: skip
        return res.returncode, out, error, wall

    def plan(self, name: str, depth: tuple[int, int] | None, width: int | None) -> Path:
        """A live-growth plan from the mode's train preset at half its growth depth: ``depth`` (step, n_layer
        after) a duplication growth, ``width`` (a step) the masked growth to ``grow_width_to``; its path."""
        start = depth[1] // 2 if depth else self.s.grow_depth_to // 2
        text = f"seed: 0\nstart: {{preset: {self.s.train_preset}, n_layer: {start}}}\nstages:\n"
        if depth:
            text += (
                f"  - name: depth-x2\n    target: {{n_layer: {depth[1]}}}\n    family: duplicate\n"
                f"    options: {{layer_order: interleave, exact: true}}\n    when: {{step: {depth[0]}}}\n"
                "    optimizer: {moments: carry}\n    schedule: {kind: continue}\n"
            )
        if width:
            d, h = self.s.grow_width_to
            text += (
                f"  - name: width\n    target: {{n_embd: {d}, n_head: {h}}}\n    family: masked\n"
                f"    when: {{step: {width}}}\n    ramp_steps: 2\n    schedule: {{kind: continue}}\n"
            )
        path = self.work / f"{name}.yaml"
        path.write_text(text)
        return path


def check_run(r: Runner, name: str, run: Path, precision: str, growths: int) -> dict[str, Any]:
    """The checks of one finished train.py run (losses finite and falling, ``growths`` live growths each preserving
    the loss within ``GROWTH_TOL``); its numbers."""
    steps = read_records(run, "train")
    losses = [s["loss"] for s in steps]
    times = [s["step_time_s"] for s in steps][1:]
    median = statistics.median(times) if times else float("nan")
    rec: dict[str, Any] = {
        "losses": losses,
        "skipped_steps": steps[-1].get("skipped_steps", 0) if steps else None,
        "step_time_s_median": median,
        "first_step_s": steps[0]["step_time_s"] if steps else None,
    }
    r.check(f"{name} losses finite", bool(losses) and all(math.isfinite(x) for x in losses), f"{len(losses)} steps")
    r.check(f"{name} loss falls", len(losses) > 1 and losses[-1] < losses[0],
            f"{losses[0]:.4f} -> {losses[-1]:.4f}" if losses else "no steps")  # fmt: skip
    rec["growths"] = check_growths(r, name, run, precision, growths, median)
    return rec


def check_growths(r: Runner, name: str, run: Path, precision: str, growths: int, median: float) -> list[dict]:
    """The checks of a finished run's live growths: ``growths`` of them (where not 0), each preserving the loss within
    ``GROWTH_TOL``; each growth's numbers, its seconds also in steps of ``median`` seconds."""
    found = read_records(run, "growth")
    if growths:
        r.check(f"{name} grew {growths} time(s)", len(found) == growths, f"{len(found)} growth record(s)")
    for g in found:
        diff = abs(g["loss_after"] - g["loss_before"])
        r.check(f"{name} {g['stage']} ({g['family']}) preserves the loss", diff <= GROWTH_TOL[precision],
                f"{g['loss_before']:.6f} -> {g['loss_after']:.6f} (|diff| {diff:.2e}, tolerance "
                f"{GROWTH_TOL[precision]:g}); {g['seconds']:.2f} s")  # fmt: skip
    return [
        {k: g[k] for k in ("step", "stage", "family", "loss_before", "loss_after", "seconds")}
        | {"equivalent_steps": g["seconds"] / median if median > 0 else None}
        for g in found
    ]


def train_run(r: Runner, name: str, stage: int, precision: str, *, growths: int = 2, extra: tuple[str, ...] = (),
              ds_config: Path | None = None, keep: bool = False) -> dict[str, Any]:  # fmt: skip
    """One train.py run at ZeRO ``stage`` (on ``r.ranks`` ranks) growing live twice (depth x2, then width) or, with
    ``growths`` 1, once (depth x2), with its checks; its record. ``extra``: more train.py flags; ``ds_config``: the
    config file (default: the shipped ``zero{stage}_{precision}``); ``keep``: leave the run folder (WORK/NAME) to the
    caller."""
    plan = r.plan(name, (r.s.grow_steps[0], r.s.grow_depth_to), r.s.grow_steps[1] if growths > 1 else None)
    cfg = ds_config or r.ds_config(name, stage, precision)
    args = ["--ds_config", str(cfg), "--max_steps", str(r.s.train_steps), *extra]
    rc, run, error, wall = r.train(name, [*args, "--growth_plan", str(plan), "--no_final_save"])
    rec: dict[str, Any] = {"exit_status": rc, "wall_s": wall}
    if r.check(f"{name} ran", rc == 0, f"exit status {rc}" + (f": {error}" if error else "")):
        rec.update(check_run(r, name, run, precision, growths=growths))
    if not keep:
        r.drop(run)
    return rec
