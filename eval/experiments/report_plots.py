"""The IsoFLOP report's plots (PNG, matplotlib Agg), from the curves and results.json's content:
loss_vs_flops.png (validation loss against FLOPs per size and arm at budget C, seed mean and min..max band, and the
envelope per budget), lr_sweep.png (pilot loss against peak LR) and deltas.png (paired difference against the
envelope with 95% intervals, and wall-clock per arm)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from growlm.eval.experiments.protocol import Settings


def _plt():
    import matplotlib  # lazy: about 1 s, plots only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after the Agg backend is chosen

    return plt


def _band(curves: list[dict]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Seed mean and min..max of validation curves on a common log-FLOPs grid."""
    fl = [np.array([p["flops"] for p in c["points"]]) for c in curves]
    ls = [np.array([p["val_loss"] for p in c["points"]]) for c in curves]
    lo, hi = max(f[0] for f in fl), min(f[-1] for f in fl)
    grid = np.logspace(np.log10(lo), np.log10(hi), 60)
    ys = np.array([np.interp(np.log10(grid), np.log10(f), y) for f, y in zip(fl, ls, strict=True)])
    return grid, ys.mean(0), ys.min(0), ys.max(0)


def plot_all(s: Settings, done: dict[str, dict], res: dict[str, Any], out: Path) -> None:
    """Write the three PNGs into ``out``."""
    plt = _plt()
    seeds = set(res["seeds"])
    main = [r for r in done.values() if r["spec"].phase == "main" and r["spec"].seed in seeds]
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
    groups: dict[str, list[dict]] = {}
    for r in main:
        sp = r["spec"]
        if sp.budget == 1.0 and not sp.tag:  # the arms as the primary metric reads them, levers left out
            groups.setdefault(sp.size or sp.arm, []).append(r["curve"])
    for i, (who, curves) in enumerate(sorted(groups.items(), key=lambda kv: (kv[0] not in s.sizes, kv[0]))):
        grid, m, lo, hi = _band(curves)
        style = "--" if who in s.sizes else "-"
        ax.plot(grid, m, style, color=f"C{i % 10}", lw=1.5, label=f"{who} ({len(curves)} seeds)")
        ax.fill_between(grid, lo, hi, color=f"C{i % 10}", alpha=0.12)
    env = res["envelope"]
    ax.plot([e["budget_flops"] for e in env.values()], [e["loss"] for e in env.values()], "ko-", ms=5,
            label="envelope (best scratch size per budget)")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title("Scratch sizes (dashed) and growth arms (solid) at budget C")
    lows = [e["loss"] for e in env.values()]
    ax.set_ylim(min(lows) - 0.1, max(lows) + 0.6)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "loss_vs_flops.png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for i, (who, sw) in enumerate(res["lr_sweep"].items()):
        lrs = sorted(sw, key=float)
        ax.plot([float(x) for x in lrs], [sw[x] for x in lrs], "o-" if who in s.sizes else "s--",
                color=f"C{i % 10}", label=who)  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("peak LR")
    ax.set_ylabel("final validation loss at C (pilot seed)")
    ax.set_title("Pilot LR sweep")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "lr_sweep.png")
    plt.close(fig)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.8), dpi=110)
    rows = [(a["arm"], a["delta_vs_envelope_mean"], a["delta_vs_envelope_ci95_low"], a["delta_vs_envelope_ci95_high"],
             a["delta_vs_envelope_per_seed"]) for a in res["arms"]]  # fmt: skip
    for j, (_, m, lo, hi, per) in enumerate(rows):
        a1.errorbar([m], [j], xerr=[[m - lo], [hi - m]], fmt="o", color="C0", capsize=4)
        a1.plot(per, [j] * len(per), "x", color="gray", ms=4)
    a1.axvline(0, color="k", lw=1)
    a1.set_yticks(range(len(rows)), [r[0] for r in rows])
    a1.set_xlabel(f"loss - {res['comparator']['size']} at C (nats), 95% CI; x = seeds")
    a1.set_title("Paired difference against the best scratch model")
    walls = [a["wall_s_mean"] for a in res["arms"]] + [z["wall_s_mean"] for z in res["scratch"]]
    names = [a["arm"] for a in res["arms"]] + [z["size"] for z in res["scratch"]]
    a2.barh(range(len(walls)), walls, color=["C1"] * len(res["arms"]) + ["C7"] * len(res["scratch"]))
    a2.set_yticks(range(len(walls)), names)
    a2.set_xlabel(f"wall-clock per run at C (s, {s.device}, growth included)")
    a2.set_title("Wall-clock")
    fig.tight_layout()
    fig.savefig(out / "deltas.png")
    plt.close(fig)
