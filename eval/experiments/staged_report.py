"""The staged-training report: FLOPs each run needed to reach the scratch run's final validation loss, the compute
saving, a plot of validation loss against cumulative FLOPs with the growth points marked, markdown + JSON.

Inputs are train.py's ``OUT_DIR/metrics.jsonl`` records: ``{"event": "val", "step", "val_loss", "flops", ...}``
(cumulative model FLOPs, 6N + 12LHQT per token of the model trained at that step), and
``{"event": "growth", "step", "flops", "from", "to", "family", ...}``.

Compute saving (DESIGN.md, section When to grow; Shen et al. 2022 arXiv 2203.06211): with L* the scratch run's final
validation loss, saving = (C_scratch(L*) - C_staged(L*)) / C_scratch(L*), where C_run(L*) is the compute at which
the run's validation curve first reaches L*, interpolated linearly in log10 FLOPs between the two evaluations around
the crossing. A run that never reaches L* has no saving (reported as such).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from growlm.eval.experiments import scaling as planner
from growlm.growth.stages.trigger import SLOPE_THRESHOLDS
from growlm.runtime.metrics_file import read_records, val_points


@dataclass
class RunCurve:
    """One run's validation curve and growth events, read from its metrics.jsonl."""

    name: str
    flops: list[float]
    val_loss: list[float]
    steps: list[int]
    growths: list[dict] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


def read_run(name: str, out_dir: str | Path, meta: dict | None = None) -> RunCurve:
    """The validation points (in logged order, duplicates of a step kept last) and growth events of a run.

    Raises:
        FileNotFoundError / ValueError: no metrics.jsonl, or no validation point with FLOPs > 0.
    """
    path = Path(out_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics.jsonl; the run has not started")
    recs = read_records(path)
    pts = val_points(recs)
    if not pts:
        raise ValueError(f"{path}: no validation records after training started; run with --eval_interval")
    growths = [r for r in recs if r.get("event") == "growth"]
    return RunCurve(
        name,
        [float(r["flops"]) for r in pts],
        [float(r["val_loss"]) for r in pts],
        [int(r["step"]) for r in pts],
        growths,
        meta or {},
    )


def flops_to_loss(flops: Sequence[float], losses: Sequence[float], target: float) -> float | None:
    """Compute at which a curve first reaches ``target`` (loss <= target), linear in log10 FLOPs between the two
    evaluations around the first crossing; None if it never does.

    Raises:
        ValueError: lengths differ or a FLOPs value is not positive.
    """
    if len(flops) != len(losses):
        raise ValueError(f"{len(flops)} FLOPs values but {len(losses)} losses")
    if any(f <= 0 for f in flops):
        raise ValueError("FLOPs must be positive (log scale)")
    for i, (c, v) in enumerate(zip(flops, losses, strict=True)):
        if v <= target:
            if i == 0:
                return float(c)
            c0, v0 = flops[i - 1], losses[i - 1]
            t = (v0 - target) / (v0 - v)  # in (0, 1]
            return 10 ** (math.log10(c0) + t * (math.log10(c) - math.log10(c0)))
    return None


def compute_saving(c_scratch: float, c_staged: float | None) -> float | None:
    """(C_scratch - C_staged) / C_scratch, or None when the staged run never reached the loss."""
    return None if c_staged is None else (c_scratch - c_staged) / c_scratch


def summarize(scratch: RunCurve, staged: list[RunCurve]) -> dict[str, Any]:
    """The report's numbers: target loss L*, and per run the FLOPs to L*, total FLOPs and the saving."""
    target = scratch.val_loss[-1]
    c_scratch = flops_to_loss(scratch.flops, scratch.val_loss, target)
    rows = []
    for run in [scratch, *staged]:
        c = flops_to_loss(run.flops, run.val_loss, target)
        rows.append(
            {
                "run": run.name,
                **run.meta,
                "final_val_loss": run.val_loss[-1],
                "total_flops": run.flops[-1],
                "flops_to_target": c,
                "saving": compute_saving(c_scratch, c) if run is not scratch else 0.0,
                "saving_at_own_final_loss": _saving_at(scratch, run, run.val_loss[-1]) if run is not scratch else 0.0,
                "growths": [
                    {k: g.get(k) for k in ("step", "flops", "stage", "family", "loss_before", "loss_after")}
                    for g in run.growths
                ],
            }
        )
    return {"target_loss": target, "scratch_flops_to_target": c_scratch, "runs": rows}


def _saving_at(scratch: RunCurve, run: RunCurve, loss: float) -> float | None:
    """The saving measured at ``loss`` instead of L* (the reverse view for a run that ends above L*): compute the
    scratch run needed to reach the loss this run ended at, against what this run needed. None when the scratch run
    never got that low."""
    c_s = flops_to_loss(scratch.flops, scratch.val_loss, loss)
    return None if c_s is None else compute_saving(c_s, flops_to_loss(run.flops, run.val_loss, loss))


def plot(runs: list[RunCurve], target_loss: float, path: str | Path, title: str) -> Path:
    """PNG of validation loss against cumulative FLOPs (log x), growth points marked, L* dashed."""
    import matplotlib  # lazy: heavy (about 1 s), only for plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: heavy (about 1 s), only for plots

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=120)
    for i, run in enumerate(runs):
        color = f"C{i}"
        ax.plot(run.flops, run.val_loss, "-", color=color, lw=1.6 if i else 2.4, label=run.name)
        for g in run.growths:
            f = float(g["flops"])
            y = _interp_loss(run, f)
            if y is not None:  # masked: a smaller circle, so it shows on top of a duplication star at the same point
                masked = g.get("family") == "masked"
                ax.plot([f], [y], marker="o" if masked else "*", ms=7 if masked else 15, color=color, mec="black",
                        zorder=6 if masked else 5)  # fmt: skip
    ax.axhline(target_loss, ls="--", color="gray", lw=1, label=f"scratch final val loss {target_loss:.3f}")
    ax.set_xscale("log")
    ax.set_xlabel("cumulative training compute (model FLOPs, 6N + 12LHQT per token)")
    ax.set_ylabel("validation loss (nats/token)")
    lo = min(min(r.val_loss) for r in runs)
    hi = max(r.val_loss[min(2, len(r.val_loss) - 1)] for r in runs)
    ax.set_ylim(lo - 0.1, max(hi, lo + 0.5) + 0.1)
    ax.set_title(
        title + "\n(growth points: star = duplication, circle = masked)\n(runs with the same start model share init "
        "and data, so they coincide until they grow)",
        fontsize=9,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def _interp_loss(run: RunCurve, f: float) -> float | None:
    """Validation loss at compute f, linear in log10 FLOPs between the evaluations around it."""
    for i in range(1, len(run.flops)):
        if run.flops[i - 1] <= f <= run.flops[i]:
            a, b = math.log10(run.flops[i - 1]), math.log10(run.flops[i])
            t = 0.0 if b == a else (math.log10(f) - a) / (b - a)
            return run.val_loss[i - 1] + t * (run.val_loss[i] - run.val_loss[i - 1])
    return None


def _fmt_flops(c: float | None) -> str:
    return "never reached" if c is None else f"{c:.3e}"


def markdown(summary: dict[str, Any], setup: str, plot_name: str, notes: str = "") -> str:
    """The report as markdown: setup, the table, the plot, notes."""
    lines = [
        "# Staged training on the built-in corpus: does growing save compute?",
        "",
        setup.strip(),
        "",
        f"Target loss L* = the scratch run's final validation loss = **{summary['target_loss']:.4f}** nats/token.",
        "Compute to L*: first crossing of the validation curve, interpolated in log10 FLOPs. "
        "Saving = (C_scratch(L*) - C_run(L*)) / C_scratch(L*) (DESIGN.md, section When to grow). "
        "The last column measures the same "
        "at the loss the run itself ended at (how far behind or ahead of scratch a run that misses L* is; '-' when "
        "scratch never got that low).",
        "",
        "| run | start | growth | final val loss | FLOPs to L* | total FLOPs | saving at L* "
        "| saving at its own final loss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in summary["runs"]:
        growth = "; ".join(f"{g['family']} at step {g['step']}" for g in r["growths"]) or "none"
        saving = "n/a (never reached L*)" if r["saving"] is None else f"{100 * r['saving']:+.1f}%"
        own = "-" if r.get("saving_at_own_final_loss") is None else f"{100 * r['saving_at_own_final_loss']:+.1f}%"
        if r["run"] == summary["runs"][0]["run"]:
            saving = own = "(reference)"
        lines.append(
            f"| {r['run']} | {r.get('start', '')} | {growth} | {r['final_val_loss']:.4f} | "
            f"{_fmt_flops(r['flops_to_target'])} | {r['total_flops']:.3e} | {saving} | {own} |"
        )
    lines += ["", f"![validation loss against FLOPs]({plot_name})", ""]
    if notes:
        lines += [notes.strip(), ""]
    return "\n".join(lines)


def planner_analysis(scratch: RunCurve, staged: list[RunCurve], dimensions: dict[str, str]) -> list[dict[str, Any]]:
    """growth.planner applied after the fact: fit the Kaplan form L(S) = floor + (s_c / S)^alpha to the scratch run
    (the target curve) and to each staged run's evaluations before its growth (the small model), and compare the
    growth step used with the slope-trigger step and the saving-maximising step the fits predict.

    alpha is fitted when a curve has >= 6 points, else Kaplan's 0.76. ``dimensions``: run name -> 'width'|'depth'.
    """

    if len(scratch.steps) < 3:
        return []
    target = planner.fit_step_curve(scratch.steps, scratch.val_loss, scratch.flops[-1] / scratch.steps[-1], alpha=None)
    rows = []
    for run in staged:
        if not run.growths:
            continue
        g = run.growths[0]
        pre = [(s, f, v) for s, f, v in zip(run.steps, run.flops, run.val_loss, strict=True) if s <= g["step"]]
        row: dict[str, Any] = {"run": run.name, "grow_step": g["step"], "n_points": len(pre)}
        if len(pre) >= 3:
            steps, flops, losses = zip(*pre, strict=True)
            small = planner.fit_step_curve(
                steps, losses, flops[-1] / steps[-1], alpha=None if len(pre) >= 6 else planner.KAPLAN_ALPHA_S
            )
            thr = SLOPE_THRESHOLDS[dimensions.get(run.name, "both")]
            p = planner.propose_growth(small, target, scratch.steps[-1], thr)
            row |= {
                "small_fit": {"floor": small.floor, "s_c": small.s_c, "alpha": small.alpha, "rmse": small.rmse},
                "threshold": thr,
                "fitted_slope_at_growth": small.slope(g["step"]),
                "slope_trigger_step": p.slope_step,
                "predicted_saving_at_slope_step": p.slope_saving,
                "best_step": p.best_step,
                "predicted_best_saving": p.best_saving,
                "predicted_saving_at_grow_step": planner.predicted_saving(small, target, g["step"], scratch.steps[-1]),
            }
        rows.append(row)
    return [
        {"target_fit": {"floor": target.floor, "s_c": target.s_c, "alpha": target.alpha, "rmse": target.rmse}},
        *rows,
    ]


def planner_markdown(rows: list[dict[str, Any]]) -> str:
    """The planner comparison as a markdown table ('' when there was too little to fit)."""
    if not rows:
        return ""

    def f(x: Any, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    t = rows[0]["target_fit"]
    lines = [
        "## What the planner (growth/planner.py) says, fitted to these runs",
        "",
        f"Target curve fitted to the scratch run: L(S) = {t['floor']:.3f} + ({t['s_c']:.3g} / S)^{t['alpha']:.2f} "
        f"(rmse {t['rmse']:.3f}). Small-model curves: each staged run's evaluations up to its growth "
        "(alpha fixed at Kaplan's 0.76 when fewer than 6 points). Predicted savings assume the grown model continues "
        "on the target curve from the same loss.",
        "",
        "| run | grew at step | fitted slope there | threshold | slope-trigger step | best step | "
        "predicted saving: at the step used / at the best step |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows[1:]:
        lines.append(
            f"| {r['run']} | {r['grow_step']} | {f(r.get('fitted_slope_at_growth'), '.4f')} | "
            f"{f(r.get('threshold'), '.4f')} | {f(r.get('slope_trigger_step'), '.0f')} | "
            f"{f(r.get('best_step'), '.0f')} | "
            f"{f(r.get('predicted_saving_at_grow_step'), '+.1%')} / {f(r.get('predicted_best_saving'), '+.1%')} |"
        )
    return "\n".join(lines)
