"""report.md of the equal-compute experiment, written from results.json's numbers (no hand-written conclusions)."""

from __future__ import annotations

from typing import Any


def _p(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _setup(s: dict[str, Any], ref: dict, ng: dict) -> list[str]:
    f = ref["fit"]
    tokens = s["steps"] * s["batch"] * s["seq_len"]
    return [
        "Produced by `growlm-experiment` (`eval/experiments/equal_compute.py`); every number below is computed from "
        "the runs by the report generator.",
        "",
        f"* **Budget**: the scratch target trains T = {s['steps']} steps of {s['batch']} x {s['seq_len']} tokens "
        f"({tokens:,} tokens, {s['budget_flops']:.3e} model FLOPs, {s['target_flops_per_step']:.3e} per step). "
        "Every arm gets the same FLOPs; a staged arm's step count follows from its stages' costs; every arm's "
        "cosine LR schedule (peak "
        f"{s['lr']:g}, {s['warmup']} warm-up steps, to 0.1 x peak) ends at its own last step.",
        f"* **Seeds**: {s['seeds']} (seed {s['seed']} upward); the runs of one seed read the same batches in the "
        "same order. Vocabulary: a ByteLevel BPE with "
        f"{s['vocab_size']} tokens trained on the training split; validation = the first {s['eval_tokens']:,} "
        "held-out tokens, the same at every evaluation.",
        f"* **Scratch reference curve** (compute scratch needs to reach a loss): L(C) = {f['a']:.3f} (C / "
        f"{f['c_ref']:.3e})^-{f['b']:.3f} + {f['c']:.3f} fitted to the longer scratch run (rmse {f['rmse']:.4f}), "
        "corrected linearly in log C to pass through each seed's scratch final point and the longer run's final "
        "point (shifted by the seed's difference), monotone; beyond the longer run it is extrapolated.",
        "* **Paired saving** of a seed = 1 - C_arm / C_scratch(L_arm) at the arm's final loss L_arm; **first "
        "crossing** = 1 - C_arm(L_T) / C_T where the arm's curve first reaches the seed's scratch final loss L_T. "
        "Mean and 95% t-interval over seeds (t table, `eval/experiments/compute_protocol.py`).",
        f"* **Reference losses** on the same validation tokens: unigram {ng['unigram_all_train']:.3f}, bigram "
        f"{ng['bigram_all_train']:.3f} (counts from all {ng['train_tokens']:,} training tokens), bigram "
        f"{ng['bigram_tokens_seen']:.3f} (counts from {ng['tokens_seen']:,} training tokens, as many as scratch "
        "trained on).",
    ]


def markdown(res: dict[str, Any]) -> str:
    """The report as markdown: setup, the savings table, per-seed table, what limits the result, plots."""
    s, ng = res["setup"], res["ngram"]
    lines = ["# Does growing save compute? Equal-compute staged training with paired seeds", "",
             *_setup(s, res["reference"], ng), ""]  # fmt: skip
    sc = list(res["scratch_final_loss"].values())
    lines += [f"Scratch target final loss: {min(sc):.4f} .. {max(sc):.4f} over {len(sc)} seeds "
              f"(mean {sum(sc) / len(sc) - ng['bigram_all_train']:+.3f} nats against the bigram reference "
              f"{ng['bigram_all_train']:.3f}; negative = below it).", "",
              "| arm | seeds | saving mean | 95% interval | seeds positive | seed std | first crossing (reached) "
              "| equal-steps cap | mean final loss | logit-step ratio |",
              "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for a in res["arms"]:
        dyn = ", ".join(f"{x:.2f}" for x in a.get("dynamics_logit_ratios") or []) or "-"
        lines.append(
            f"| {a['arm']} | {a['n_seeds']} | **{_p(a['saving_mean'])}** | {_p(a['saving_ci95_low'])} .. "
            f"{_p(a['saving_ci95_high'])} | {a['seeds_positive']}/{a['n_seeds']} | {_p(a['saving_std'])} | "
            f"{_p(a['crossing_saving_mean'])} ({a['crossing_reached']}/{a['n_seeds']}) | "
            f"{_p(a['equal_steps_cap'])} | {a['final_loss_mean']:.4f} | {dyn} |"
        )
    lines += ["", "A saving is claimed only where the interval's lower bound is above 0. Scratch runs of other "
              "sizes (no growth) are listed with the same metric: what staying small would give.", "",
              "## What limits the result", ""] + [f"- {x}" for x in res["limits"]] + ["", "## Per seed", "",
              "| arm | seed | steps | grew at | final loss | scratch final | saving | first crossing | note |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for a in res["arms"]:
        for r in a["per_seed"]:
            never = len(r["grow_steps"]) < r.get("planned_growths", 0)
            note = "; ".join(x for x in ("never grew" if never else "", "extrapolated" if r["extrapolated"] else "",
                                          "lower bound" if r["saving_is_bound"] else "",
                                          f"slope threshold {r['slope_threshold']:.4f}" if r.get("slope_threshold")
                                          is not None else "") if x)  # fmt: skip
            lines.append(
                f"| {a['arm']} | {r['seed']} | {r['steps']} | {r['grow_steps'] or '-'} | {r['final_loss']:.4f} | "
                f"{r['scratch_final_loss']:.4f} | {_p(r['saving'])} | {_p(r['crossing_saving'])} | {note} |"
            )
    lines += _divergence(res["arms"])
    lines += [""] + [f"![{p}]({p})" for p in res["plots"]] + [""]
    return "\n".join(lines)


def _divergence(arms: list[dict[str, Any]]) -> list[str]:
    """The copy-divergence table of the width growths (relative difference of the copies after N steps)."""
    rows = [(a["arm"], g, n, parts) for a in arms for g, by in (a.get("copy_divergence") or {}).items()
            for n, parts in by.items()]  # fmt: skip
    if not rows:
        return []
    cols = list(rows[0][3])
    out = ["", "## Width copies: how fast they come apart", "",
           "Relative difference of the copies (0 = identical, ~1.41 = independent) after N AdamW steps of the grown "
           "model (in-process probe, constant LR; `eval/experiments/dynamics_probe.py`).", "",
           "| arm | growth | steps after growth | " + " | ".join(cols) + " |",
           "|---|---|---|" + "---|" * len(cols)]  # fmt: skip
    for arm, g, n, parts in rows:
        out.append(f"| {arm} | {g} | {n} | " + " | ".join(f"{parts[c]:.3f}" for c in cols) + " |")
    return out
