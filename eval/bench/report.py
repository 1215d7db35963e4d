"""Benchmark arithmetic and reports: throughput from train.py's metrics.jsonl, growth cost, markdown table, bar chart.

Pure functions on records (no processes, no timing). Definitions (DESIGN.md, section Evaluation): every rate comes
from one statistic, the median step time of the measured steps (``step_statistics``; min and max are reported beside
it), and every ratio between runs from the runs' medians; tokens/s counts the tokens of the global batch (all
ranks); model FLOPs are train.py's cumulative ``flops`` (6 N + 12 L H Q T per token,
``model.config.flops_per_token``, forward + backward, no activation recomputation); MFU = model FLOP/s per rank /
the peak of one rank's device.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path


class BenchError(Exception):
    """A benchmark cannot be computed or run; printed as one message."""


def step_statistics(times: list[float], *, tokens_per_step: float, flops_per_step: float, world_size: int) -> dict:
    """Every throughput figure of one run from one statistic, the median step time.

    Args:
        times: the measured steps' times in seconds (warm-up left out), in step order; at least one.
        tokens_per_step: tokens of one optimizer step's global batch (all ranks).
        flops_per_step: model FLOPs of one optimizer step (all ranks; the mean over the measured steps when a
            growth changed the model among them).
        world_size: data-parallel ranks.

    Returns:
        ``measured_steps``, ``step_times_s`` (as given), ``step_time_s_median`` / ``_min`` / ``_max`` (s),
        ``tokens_per_s`` = tokens_per_step / median and ``model_flops_per_s`` = flops_per_step / median (all ranks,
        and ``..._per_rank``: divided by ``world_size``). Min and max are reported beside the median, never used in
        a figure: one slow step moves the median by at most one place in the sorted times.

    Raises:
        BenchError: ``times`` is empty or holds a time that is not positive.
    """
    if not times:
        raise BenchError("no measured step: nothing to compute throughput from")
    if not all(t > 0 for t in times):  # also NaN
        raise BenchError(f"step times must be positive seconds, got {times}")
    median = statistics.median(times)
    return {
        "measured_steps": len(times),
        "step_times_s": list(times),
        "step_time_s_median": median,
        "step_time_s_min": min(times),
        "step_time_s_max": max(times),
        "tokens_per_s": tokens_per_step / median,
        "tokens_per_s_per_rank": tokens_per_step / median / world_size,
        "model_flops_per_s": flops_per_step / median,
        "model_flops_per_s_per_rank": flops_per_step / median / world_size,
    }


def summarize_train(records: list[dict], *, warmup_steps: int, world_size: int) -> dict:
    """Throughput of the steps after the first ``warmup_steps``, from train.py's metrics records.

    Args:
        records: every record of one run's metrics.jsonl (train, val and growth events, in order).
        warmup_steps: leading optimizer steps left out (op builds, allocator and cache warm-up).
        world_size: data-parallel ranks (tokens and FLOPs in the records are totals over all ranks).

    Returns:
        ``step_statistics`` of the measured steps (tokens and FLOPs per step: the measured window's totals / its
        steps; every rate from the median step time), ``measured_tokens``, fp16 overflow-skipped steps (whole run
        and measured window), rank 0's peak memory, final loss and the growth cost (``growth_cost``).

    Raises:
        BenchError: no step is left after the warm-up.
    """
    train = [r for r in records if r.get("event") == "train"]
    measured = train[warmup_steps:]
    if not measured:
        raise BenchError(
            f"the run has {len(train)} steps and {warmup_steps} are warm-up: nothing left to measure; "
            "raise --steps or lower --warmup"
        )
    before = train[warmup_steps - 1] if warmup_steps > 0 else {"tokens": 0, "flops": 0, "skipped_steps": 0}
    times = [r["step_time_s"] for r in measured]
    tokens = measured[-1]["tokens"] - before["tokens"]
    flops = measured[-1]["flops"] - before["flops"]
    stats = step_statistics(
        times, tokens_per_step=tokens / len(times), flops_per_step=flops / len(times), world_size=world_size
    )
    return {
        **stats,
        "measured_tokens": tokens,
        "skipped_steps": train[-1]["skipped_steps"],
        "skipped_steps_measured": measured[-1]["skipped_steps"] - before["skipped_steps"],
        "max_rss_bytes_rank0": max(r.get("max_rss_bytes", 0) for r in train),  # host
        "cuda_max_allocated_bytes_rank0": max((r.get("cuda_max_allocated_bytes") or 0) for r in train) or None,
        "final_loss": train[-1]["loss"],
        "growth": growth_cost(records, stats["step_time_s_median"]),
    }


def growth_cost(records: list[dict], step_time_s: float) -> dict:
    """Cost of the run's growth events (``{"event": "growth", "seconds": ...}``) in seconds and in training steps.

    Equivalent steps = seconds / ``step_time_s`` (the run's median step time), i.e. how many training steps the
    same wall time would have bought.
    """
    events = [r for r in records if r.get("event") == "growth"]
    per_event = [
        {
            "step": r.get("step"),
            "seconds": float(r["seconds"]),
            "equivalent_steps": float(r["seconds"]) / step_time_s,
        }
        for r in events
    ]
    seconds = sum(e["seconds"] for e in per_event)
    return {
        "events": len(events),
        "seconds": seconds,
        "equivalent_steps": seconds / step_time_s,
        "per_event": per_event,
    }


def peak_memory_bytes(rec: dict) -> int | None:
    """A run's peak memory: rank 0's peak device allocation on a GPU, else the largest peak RSS of its ranks."""
    if rec.get("peak_device_bytes_rank0"):
        return int(rec["peak_device_bytes_rank0"])
    rss = rec.get("peak_rss_bytes_per_rank") or []
    return max(rss) if rss else None


def add_recompute_savings(records: list[dict]) -> None:
    """For every run with activation recomputation whose twin without it (same name less ``-ckpt``) is among
    ``records``, add ``recompute_memory_saved_bytes`` (twin's peak memory - this run's, ``peak_memory_bytes``) and
    ``recompute_step_time_ratio`` (this run's median step time / the twin's). Modifies the records in place."""
    by_name = {r["name"]: r for r in records}
    for r in records:
        twin = by_name.get(r["name"].removesuffix("-ckpt")) if r.get("activation_recomputation") else None
        if twin is None:
            continue
        a, b = peak_memory_bytes(twin), peak_memory_bytes(r)
        r["recompute_memory_saved_bytes"] = a - b if a is not None and b is not None else None
        r["recompute_step_time_ratio"] = r["step_time_s_median"] / twin["step_time_s_median"]


def mib(n: float | None) -> str:
    """Bytes as whole MiB with thousands separators ('-' for None)."""
    return "-" if n is None else f"{n / 2**20:,.0f}"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _ms(seconds: float | None) -> str:
    """Seconds as milliseconds: whole ms from 10 ms up, else two decimals ('-' for None)."""
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:,.0f}" if seconds >= 0.01 else f"{seconds * 1e3:.2f}"


def _mfu(mfu: float | None) -> str:
    """MFU as a percentage; 'n/a' for None (no known peak) and above 100% (the measured peak was not a peak)."""
    return f"{mfu:.1%}" if mfu is not None and mfu <= 1.0 else "n/a"


def markdown(records: list[dict], header: dict) -> str:
    """A markdown report: a context list (``header``: label -> value) and one table row per run record."""
    lines = ["# growlm throughput benchmark", ""]
    lines += [f"- {k}: {v}" for k, v in header.items()]
    lines += [
        "",
        "| run | ZeRO | precision | ranks | steps | step ms median | step ms min | step ms max | tokens/s "
        "| tokens/s/rank | model TFLOP/s | MFU | fp16 skipped | peak RSS/rank MiB | vs PyTorch |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        ratio = r.get("overhead_vs_baseline")
        rss = r.get("peak_rss_bytes_per_rank") or []
        lines.append(
            f"| {r['name']} | {r.get('zero_stage', '-') if r['kind'] == 'deepspeed' else '-'} | {r['precision']} "
            f"| {r['world_size']} | {r.get('measured_steps', '-')} | {_ms(r.get('step_time_s_median'))} "
            f"| {_ms(r.get('step_time_s_min'))} | {_ms(r.get('step_time_s_max'))} | {r['tokens_per_s']:,.0f} "
            f"| {r['tokens_per_s_per_rank']:,.0f} | {r['model_flops_per_s'] / 1e12:.4f} | {_mfu(r['mfu'])} "
            f"| {r.get('skipped_steps', 0)} | {' / '.join(mib(b) for b in rss) or '-'} "
            f"| {_num(ratio, '.2f') + 'x' if ratio is not None else '-'} |"
        )
    recompute = [r for r in records if "recompute_step_time_ratio" in r]
    if recompute:
        lines += ["", "| run | peak memory MiB | without recomputation MiB | saved MiB | step time vs without |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for r in recompute:
            saved = r["recompute_memory_saved_bytes"]
            peak = peak_memory_bytes(r)
            lines.append(
                f"| {r['name']} | {mib(peak)} | {mib(None if saved is None or peak is None else peak + saved)} "
                f"| {mib(saved)} | {r['recompute_step_time_ratio']:.2f}x |"
            )
    growth = [r for r in records if r.get("growth", {}).get("events")]
    if growth:
        lines += ["", "| run | growth events | growth s | equivalent steps |", "|---|---|---|---|"]
        for r in growth:
            g = r["growth"]
            lines.append(f"| {r['name']} | {g['events']} | {g['seconds']:.2f} | {g['equivalent_steps']:.1f} |")
    lines += [
        "",
        "Every rate is from the median step time of the measured steps (steps; min and max beside it, used in no "
        "figure): tokens/s = tokens per step / median step time, counting the global batch of all ranks; "
        "model TFLOP/s = tokens/s x (6N + 12 L H Q T) per token, "
        "the recomputed forward of a -ckpt run (activation checkpointing) not counted; MFU = model FLOP/s per rank / "
        "the peak above (n/a where the model ran faster than that peak: no native kernels for the precision, so the "
        "measured product is no peak); 'vs PyTorch' = DeepSpeed "
        "median step time / the plain PyTorch median step time, the inverse of the tokens/s ratio (torch DDP, the "
        "same ranks, threads, precision and global batch; above 1: slower than plain PyTorch). Peak RSS is each "
        "rank process's peak resident memory (host); "
        "peak memory is rank 0's peak GPU allocation on a GPU, else the largest peak RSS.",
        "",
    ]
    return "\n".join(lines)


def bar_chart(records: list[dict], path: str | Path, title: str) -> Path:
    """A PNG with two bar panels (tokens/s and MFU), one bar per run record, written to ``path``."""
    import matplotlib  # lazy: heavy (about 1 s), only for plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: heavy (about 1 s), only for plots

    names = [r["name"] for r in records]
    colors = [
        "#888888" if r["kind"] == "pytorch" else {"fp32": "#4c72b0", "bf16": "#dd8452"}.get(r["precision"], "#55a868")
        for r in records
    ]
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.1 * len(names) + 4), 4.2))
    for ax, key, label, scale in (
        (axes[0], "tokens_per_s", "tokens/s (all ranks)", 1.0),
        (axes[1], "mfu", "MFU (%)", 100.0),
    ):
        values = [(r[key] or 0.0) * scale for r in records]  # MFU None (no known peak): an empty bar, "n/a"
        bars = ax.bar(range(len(names)), values, color=colors)
        labels = [
            "n/a" if r[key] is None else f"{v:,.0f}" if scale == 1.0 else f"{v:.1f}"
            for r, v in zip(records, values, strict=True)
        ]
        ax.bar_label(bars, labels=labels, fontsize=7)
        ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_reports(args, out: Path, records: list[dict], base: dict, shape: str) -> None:
    """One JSON per record, bench.json, bench.md and (for two or more runs) bench.png in ``out``.

    ``args``: growlm-bench's parsed flags; ``base``: {"device_type", "common" (the shared record fields),
    "peaks" ((precision, threads) -> peak)}; ``shape``: the model's shape string.
    """
    common, device_type = base["common"], base["device_type"]
    for rec in records:
        (out / f"{rec['name']}.json").write_text(json.dumps(rec, indent=2) + "\n")
    (out / "bench.json").write_text(json.dumps(records, indent=2) + "\n")
    peaks = "; ".join(
        f"{p} {t} thread(s): {v.flops_per_s / 1e9:,.1f} GFLOP/s ({v.source})"
        if device_type == "cpu"
        else f"{p}: {v.source}"
        for (p, t), v in base["peaks"].items()
    )
    header = {
        "device": common["device"],
        "model": f"{args.preset} ({shape}), {common['n_params'] / 1e6:.2f}M parameters, "
        f"{common['flops_per_token'] / 1e6:.1f} MFLOP per token at T={args.seq_len} (6N + 12 L H Q T, model "
        "FLOPs: a recomputed forward is not counted)",
        "batch": f"micro {args.micro_batch} x accumulation {args.grad_accum} x {args.world_size} ranks = "
        f"{common['global_batch']} sequences of {args.seq_len} tokens per step",
        "steps": f"{args.max_steps} per run, first {args.skip_steps} left out",
        "threads": f"{args.threads_per_rank} per rank (OMP_NUM_THREADS), the PyTorch baseline (torch DDP) too"
        if device_type == "cpu"
        else "-",
        "peak per device": peaks,
    }
    (out / "bench.md").write_text(markdown(records, header))
    if len(records) >= 2:
        title = (
            f"growlm-bench: {args.preset}, T={args.seq_len}, global batch {common['global_batch']}, {common['device']}"
        )
        bar_chart(records, out / "bench.png", title)
