"""Plots of the equal-compute report (PNG, matplotlib Agg): validation loss against FLOPs per arm with seed bands
and the unigram/bigram lines, and the paired saving per arm with its 95% interval and the per-seed points."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def _plt():
    import matplotlib  # lazy: heavy (about 1 s), only for plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: heavy (about 1 s), only for plots

    return plt


def loss_vs_flops(path: Path, runs: dict[str, dict], ngram: dict, refs: dict) -> None:
    """Per arm: the seeds' mean validation loss on a common log-FLOPs grid, band = min..max over seeds."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
    arms = list(dict.fromkeys(k.split("/")[0] for k in runs))
    for i, arm in enumerate(arms):
        curves = [r for k, r in runs.items() if k.split("/")[0] == arm]
        lo = max(min(c["flops"]) for c in curves)
        hi = min(max(c["flops"]) for c in curves)
        grid = np.logspace(np.log10(lo), np.log10(hi), 100)
        ys = np.array([np.interp(np.log10(grid), np.log10(c["flops"]), c["loss"]) for c in curves])
        ax.plot(grid, ys.mean(0), color=f"C{i % 10}", lw=2.2 if arm == "scratch" else 1.4,
                label=f"{arm} ({len(curves)} seeds)")  # fmt: skip
        ax.fill_between(grid, ys.min(0), ys.max(0), color=f"C{i % 10}", alpha=0.15)
    if refs:
        ref = refs[min(refs)]
        g = ref.grid[(ref.grid >= ref.anchors[0][0] / 20) & (ref.grid <= ref.anchors[-1][0] * 3)]
        ax.plot(g, [ref.loss(x) for x in g], "k:", lw=1, label=f"scratch reference curve (seed {min(refs)})")
    for key, style in (("bigram_all_train", "--"), ("bigram_tokens_seen", "-."), ("unigram_all_train", ":")):
        ax.axhline(ngram[key], ls=style, color="gray", lw=1, label=f"{key.replace('_', ' ')} {ngram[key]:.3f}")
    ax.set_xscale("log")
    ax.set_xlabel("training compute (model FLOPs, 6N + 12LHQT per token)")
    ax.set_ylabel("validation loss (nats/token)")
    lows = [min(r["loss"]) for r in runs.values()]
    low = min(*lows, ngram["bigram_all_train"], ngram["bigram_tokens_seen"])
    ax.set_ylim(low - 0.1, max(ngram["unigram_all_train"], min(lows) + 1.0) + 0.1)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("equal compute: validation loss against FLOPs (line = seed mean, band = seed min..max)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def savings(path: Path, arms: list[dict[str, Any]]) -> None:
    """Paired saving per arm: mean with its 95% t-interval, and every seed's value."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    for i, a in enumerate(arms):
        ys = [r["saving"] * 100 for r in a["per_seed"]]
        ax.plot([i] * len(ys), ys, "o", color="gray", ms=4, alpha=0.7)
        lo, hi = a["saving_ci95_low"], a["saving_ci95_high"]
        err = None if lo is None else [[(a["saving_mean"] - lo) * 100], [(hi - a["saving_mean"]) * 100]]
        ax.errorbar([i], [a["saving_mean"] * 100], yerr=err, fmt="s", color=f"C{i % 10}", capsize=6, ms=8)
        if a.get("equal_steps_cap") is not None:
            ax.plot([i - 0.3, i + 0.3], [a["equal_steps_cap"] * 100] * 2, "k--", lw=1)
    ax.axhline(0, color="black", lw=0.8)
    ax.axhline(40, color="green", lw=0.8, ls=":", label="goal 40%")
    ax.set_xlim(-0.6, len(arms) - 0.4)
    ax.set_xticks(range(len(arms)), [a["arm"] for a in arms], rotation=20, fontsize=8)
    ax.set_ylabel("compute saved at the arm's final loss (% of scratch)")
    ax.set_title("paired saving per arm: mean and 95% t-interval (squares), seeds (dots), equal-steps cap (dashes)",
                 fontsize=9)  # fmt: skip
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def dynamics(path: Path, arms: list[dict[str, Any]]) -> bool:
    """Logit-step ratio of every growth (1 = dynamics preserved) and the copy divergence of width growths against
    post-growth steps. False (nothing written) when no arm grows."""
    grows = [(a["arm"], i, r) for a in arms for i, r in enumerate(a.get("dynamics_logit_ratios") or [])]
    if not grows:
        return False
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    ax1.bar(range(len(grows)), [r for _, _, r in grows], color="C0")
    ax1.axhline(1.0, color="black", lw=0.8)
    ax1.axhline(1.1, color="red", lw=0.8, ls=":", label="goal: within 1.1")
    ax1.set_xticks(range(len(grows)), [f"{a} #{i + 1}" for a, i, _ in grows], rotation=30, fontsize=7, ha="right")
    ax1.set_ylabel("logit change, grown / small (one AdamW step)")
    ax1.legend(fontsize=8)
    for a in arms:
        for label, by_steps in (a.get("copy_divergence") or {}).items():
            steps = sorted(by_steps, key=int)
            for j, part in enumerate(by_steps[steps[0]]):
                ax2.plot([int(s) for s in steps], [by_steps[s][part] for s in steps], "o-", color=f"C{j}",
                         label=f"{a['arm']} {label}: {part}")  # fmt: skip
    ax2.set_xlabel("optimizer steps after growth")
    ax2.set_ylabel("copy divergence (0 = identical halves)")
    if ax2.get_legend_handles_labels()[1]:
        ax2.legend(fontsize=6)
    else:
        ax2.text(0.5, 0.5, "no width growth in these arms", ha="center", transform=ax2.transAxes)
    ax2.grid(True, alpha=0.3)
    fig.suptitle("training dynamics of the growths (eval/experiments/dynamics_probe.py)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def write_all(folder: Path, runs: dict, arms: list[dict], ngram: dict, refs: dict) -> list[str]:
    """Write the report's PNGs into ``folder``; returns their file names."""
    loss_vs_flops(folder / "loss_vs_flops.png", runs, ngram, refs)
    savings(folder / "savings.png", arms)
    names = ["loss_vs_flops.png", "savings.png"]
    if dynamics(folder / "dynamics.png", arms):
        names.append("dynamics.png")
    return names
