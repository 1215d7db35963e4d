"""The equal-compute experiment's report: per-seed paired savings against the scratch reference curve, mean and 95%
t-interval per arm, first crossings, unigram/bigram reference losses, plots, report.md and results.json.

results.json: {"setup", "reference": {power-law fit, anchors}, "ngram": {...}, "arms": [{"arm", "n_seeds",
"saving_mean", "saving_ci95_low", "saving_ci95_high", "seeds_positive", "saving_std", "crossing_saving_mean", ...,
"equal_steps_cap", "dynamics_logit_ratio", "per_seed": [...]}], "limits": [...]}. Savings are fractions of the
scratch compute (positive = saved); see eval.experiments.compute_protocol for the definitions.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from growlm.eval.experiments import compute_protocol as cp
from growlm.eval.experiments import dynamics_probe as dp
from growlm.eval.experiments import equal_compute_plots as plots
from growlm.eval.experiments.equal_compute import SLOPE, Job, cost, job_done, read_vals, shape
from growlm.eval.experiments.equal_compute_markdown import markdown
from growlm.eval.experiments.ngram import ngram_losses
from growlm.eval.experiments.staged_report import flops_to_loss
from growlm.model.config import GPTConfig
from growlm.runtime.metrics_file import read_records

GOAL = (0.40, 0.25)  # the target: >= 40% saved, 95% interval's lower bound > 25%


def _run(args: argparse.Namespace, job: Job) -> dict[str, Any] | None:
    """A finished run's validation curve, job.json and growth records (None: not finished with these settings)."""
    if not job_done(args, job):
        return None
    vals = read_vals(job.out)
    meta = job.out / "job.json"
    recs = read_records(job.out)
    return {"flops": [float(r["flops"]) for r in vals], "loss": [float(r["val_loss"]) for r in vals],
            "steps": [int(r["step"]) for r in vals], "job": json.loads(meta.read_text()),
            "growths": [r for r in recs if r.get("event") == "growth"]}  # fmt: skip


def reference_curves(runs: dict[str, dict]) -> tuple[dict[int, cp.ReferenceCurve], dict]:
    """Per seed, the scratch reference curve: a power law fitted to the longer scratch run (evaluations past 10% of
    its steps; the scratch run of the same seed when there is no longer run), anchored at the seed's scratch final
    point and at the longer run's final point shifted by the seed's difference in scratch final loss."""
    scratch = {int(k.split("seed")[1]): r for k, r in runs.items() if k.startswith("scratch/")}
    longs = {int(k.split("seed")[1]): r for k, r in runs.items() if k.startswith("scratch-long/")}
    long_seed = min(longs) if longs else min(scratch)
    long = longs.get(long_seed, scratch[long_seed])
    keep = [i for i, s in enumerate(long["steps"]) if s >= 0.1 * long["steps"][-1]]
    law = cp.fit_power_law([long["flops"][i] for i in keep], [long["loss"][i] for i in keep])
    base = scratch[long_seed]["loss"][-1] if long_seed in scratch else long["loss"][-1]
    refs = {}
    for seed, s in scratch.items():
        anchors = [(s["flops"][-1], s["loss"][-1])]
        if longs:
            anchors.append((long["flops"][-1], long["loss"][-1] + s["loss"][-1] - base))
        refs[seed] = cp.ReferenceCurve(law, anchors)
    info = {
        "fit": {"a": law.a, "b": law.b, "c": law.c, "c_ref": law.c_ref, "rmse": law.rmse},
        "long_run_seed": long_seed if longs else None,
        "long_run_final": [long["flops"][-1], long["loss"][-1]],
    }
    return refs, info  # fmt: skip


def seed_row(run: dict, scratch: dict, ref: cp.ReferenceCurve) -> dict[str, Any]:
    """One arm run's numbers against its seed: paired saving, first crossing of the scratch final loss, growths."""
    c_arm, l_arm = run["flops"][-1], run["loss"][-1]
    ps = cp.paired_saving(ref, l_arm, c_arm)
    l_t = scratch["loss"][-1]
    c_t = flops_to_loss(scratch["flops"], scratch["loss"], l_t)
    c_x = flops_to_loss(run["flops"], run["loss"], l_t)
    return {"seed": run["job"]["seed"], "final_loss": l_arm, "scratch_final_loss": l_t, "flops": c_arm,
            "saving": ps["saving"], "scratch_flops_needed": ps["scratch_flops_needed"],
            "extrapolated": ps["extrapolated"], "saving_is_bound": ps["bound"],
            "crossing_flops": c_x, "crossing_saving": None if c_x is None else 1 - c_x / c_t,
            "grow_steps": [g["step"] for g in run["growths"]], "steps": run["steps"][-1],
            "planned_growths": len(run["job"]["grow_steps"]),
            "slope_threshold": run["job"].get("slope_threshold")}  # fmt: skip


def arm_summary(name: str, rows: list[dict], cap: float | None, dyn: list[float] | None) -> dict[str, Any]:
    """Mean, 95% t-interval and seeds positive of an arm's paired savings (and of its first crossings)."""
    sav = [r["saving"] for r in rows]
    m, lo, hi = cp.mean_ci95(sav)
    cross = [r["crossing_saving"] for r in rows]
    got = [c for c in cross if c is not None]
    cm, clo, chi = cp.mean_ci95(got) if got else (None, None, None)
    return {"arm": name, "n_seeds": len(rows), "saving_mean": m, "saving_ci95_low": lo, "saving_ci95_high": hi,
            "saving_std": float(np.std(sav, ddof=1)) if len(sav) > 1 else None,
            "seeds_positive": sum(s > 0 for s in sav), "crossing_reached": len(got),
            "crossing_saving_mean": cm, "crossing_ci95_low": clo, "crossing_ci95_high": chi,
            "final_loss_mean": float(np.mean([r["final_loss"] for r in rows])),
            "equal_steps_cap": cap, "dynamics_logit_ratio": dyn[0] if dyn else None,
            "dynamics_logit_ratios": dyn, "per_seed": rows}  # fmt: skip


def ngram_reference(args: argparse.Namespace, tokens_seen: int) -> dict[str, float]:
    """Unigram/bigram validation losses on the experiment's validation tokens, from all training tokens and from a
    sample of as many tokens as the scratch run trained on (every k-th 2,048-token chunk of the training split)."""

    meta = json.loads((args.data / "meta.json").read_text())
    train = np.fromfile(args.data / "train.bin", dtype=np.uint16)
    val = np.fromfile(args.data / "val.bin", dtype=np.uint16)[: args.eval_tokens + 1]
    chunks = train[: len(train) // 2048 * 2048].reshape(-1, 2048)
    k = max(1, len(chunks) * 2048 // max(tokens_seen, 1))
    seen = chunks[::k].reshape(-1)
    full = ngram_losses(train, val, meta["vocab_size"])
    part = ngram_losses(seen, val, meta["vocab_size"])
    return {
        "unigram_all_train": full["unigram"],
        "bigram_all_train": full["bigram"],
        "bigram_tokens_seen": part["bigram"],
        "tokens_seen": int(len(seen)),
        "train_tokens": int(len(train)),
    }


def limits(
    arms: list[dict],
    scratch_final: list[float],
    ngram: dict,
    cost_ratios: dict[str, list[float]],
    first_slope_step: dict[str, int] | None = None,
) -> list[str]:
    """What the data say about the goal (>= 40% saved, lower bound > 25%), written from the numbers: the best arm,
    each arm's equal-steps cap (what its cheap stages alone save) and its stage costs, the seed noise, where the
    scratch runs end against the bigram reference, a smaller scratch model that beats the target outright, and a
    slope arm that grew at the first step its trigger could fire (``first_slope_step``: arm -> that step)."""
    staged = [a for a in arms if a["equal_steps_cap"] is not None]
    if not staged:
        return []
    gap = float(np.mean(scratch_final)) - ngram["bigram_all_train"]
    regime = [
        f"Regime: the scratch target ends at {np.mean(scratch_final):.3f} nats, {abs(gap):.3f} "
        f"{'above' if gap > 0 else 'below'} the all-data bigram reference ({ngram['bigram_all_train']:.3f})"
        + (
            ": the models are still mostly learning token-pair statistics, where depth matters little."
            if gap > -0.2
            else "."
        )
    ]
    by_costs: dict[tuple, list[str]] = {}
    for n, r in cost_ratios.items():
        by_costs.setdefault(tuple(round(c, 2) for c in r), []).append(n)
    regime += [f"{', '.join(ns)}: small stages cost {', '.join(f'{c:.2f}' for c in r)} x the target per step"
               for r, ns in by_costs.items()]  # fmt: skip
    best = max(staged, key=lambda a: a["saving_mean"])
    out = [
        f"Best arm: {best['arm']}, saving {best['saving_mean']:+.1%} (95% interval "
        f"{_pct(best['saving_ci95_low'])} to {_pct(best['saving_ci95_high'])}, {best['seeds_positive']}/"
        f"{best['n_seeds']} seeds positive); goal >= {GOAL[0]:.0%} with lower bound > {GOAL[1]:.0%}: "
        f"{'met' if best['saving_mean'] >= GOAL[0] and (best['saving_ci95_low'] or -1) > GOAL[1] else 'not met'}.",
        *regime,
    ]
    for a in staged:
        gain = a["saving_mean"] - a["equal_steps_cap"]
        half = None if a["saving_ci95_high"] is None else (a["saving_ci95_high"] - a["saving_ci95_low"]) / 2
        out.append(f"{a['arm']}: the cheap stages alone save {a['equal_steps_cap']:.1%} of the target's compute "
                   f"over the same steps (equal-steps cap); measured {a['saving_mean']:+.1%}, i.e. "
                   f"{gain:+.1%} from learning faster/slower per step than scratch after growth; "
                   f"interval half-width {_pct(half)} (seed std {_pct(a['saving_std'])}); "
                   f"{GOAL[0] - a['saving_mean']:+.1%} short of {GOAL[0]:.0%}." if a["saving_mean"] < GOAL[0] else
                   f"{a['arm']}: reaches the {GOAL[0]:.0%} goal on average.")  # fmt: skip
    for a in arms:
        if a["equal_steps_cap"] is None and (a["saving_ci95_low"] or 0) > 0:
            out.append(f"{a['arm']} (no growth) saves {a['saving_mean']:+.1%} ({_pct(a['saving_ci95_low'])} to "
                       f"{_pct(a['saving_ci95_high'])}): at this budget the smaller model alone ends below the "
                       "target's loss, so the target is larger than compute-optimal for these T steps, and part of "
                       "every growth arm's saving is the time it spends small; against the best scratch model of any "
                       "size the growth arms save less.")  # fmt: skip
    for name, step in (first_slope_step or {}).items():
        a = next((x for x in arms if x["arm"] == name), None)
        grew = [r["grow_steps"][0] for r in (a or {}).get("per_seed", []) if r["grow_steps"]]
        if grew and all(g == step for g in grew):
            steps_of = [r["grow_steps"] for r in a["per_seed"]]
            same = [
                x["arm"] for x in staged if x["arm"] != name and [r["grow_steps"] for r in x["per_seed"]] == steps_of
            ]
            out.append(f"{name}: the derived threshold fired at step {step} in {len(grew)}/{len(grew)} seeds, the "
                       "first evaluation with the trigger's window full: the seeds' equal-rate points lie at or "
                       "before it" + (f"; it grew exactly as {', '.join(same)}." if same else "."))  # fmt: skip
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def write_report(args: argparse.Namespace, jobs: list[Job], meta: dict) -> int:
    """Write report.md, results.json and the plots from the finished runs; 1 when the scratch runs are missing."""
    runs = {j.key: r for j in jobs if (r := _run(args, j)) is not None}
    if not any(k.startswith("scratch/") for k in runs):
        print("growlm-experiment: no finished scratch run; no report", file=sys.stderr)
        return 1
    refs, ref_info = reference_curves(runs)
    v = meta["vocab_size"]
    arms, dyn_cache, ratios, first_slope = [], {}, {}, {}
    for arm in {j.arm.name: j.arm for j in jobs}.values():
        if arm.name in ("scratch", "scratch-long"):
            continue
        rows = [seed_row(r, runs[f"scratch/seed{j.seed}"], refs[j.seed]) for j in jobs
                if j.arm.name == arm.name and (r := runs.get(j.key)) and f"scratch/seed{j.seed}" in runs]  # fmt: skip
        if not rows:
            continue
        cap = None
        if arm.staged:
            costs = [cost(args, s, v) for s in arm.shapes]
            ratios[arm.name] = [c / costs[-1] for c in costs[:-1]]
            g = [round(np.mean([r["grow_steps"][i] for r in rows if len(r["grow_steps"]) > i] or [0]))
                 for i in range(len(arm.grow))]  # fmt: skip
            cap = cp.equal_steps_cap(costs, g, args.steps) if all(g) else 0.0
        if SLOPE in arm.grow:
            first_slope[arm.name] = args.slope_window * next(j.eval_interval for j in jobs if j.arm.name == arm.name)
        dyn, div = dynamics(args, arm, v, dyn_cache)
        arms.append(arm_summary(arm.name, rows, cap, dyn) | {"copy_divergence": div})
    steps_t = args.steps
    ngram = ngram_reference(args, steps_t * args.batch * args.seq_len)

    args.report.mkdir(parents=True, exist_ok=True)
    pngs = plots.write_all(args.report, runs, arms, ngram, refs)
    res = {"protocol": "equal compute", "setup": _setup(args, v), "reference": ref_info, "ngram": ngram,
           "scratch_final_loss": {k: r["loss"][-1] for k, r in runs.items() if k.startswith("scratch/")},
           "arms": arms, "plots": pngs}  # fmt: skip
    sc = [r["loss"][-1] for k, r in runs.items() if k.startswith("scratch/")]
    res["limits"] = limits(arms, sc, ngram, ratios, first_slope)
    (args.report / "results.json").write_text(json.dumps(res, indent=2, default=_plain) + "\n")

    (args.report / "report.md").write_text(markdown(res))
    print(f"growlm-experiment: report {args.report / 'report.md'}", flush=True)
    for a in arms:
        print(
            f"  {a['arm']:26s} saving {a['saving_mean']:+.1%} [{_pct(a['saving_ci95_low'])}, "
            f"{_pct(a['saving_ci95_high'])}] {a['seeds_positive']}/{a['n_seeds']} seeds positive"
        )
    return 0


def dynamics(args: argparse.Namespace, arm: Any, vocab: int, cache: dict) -> tuple[list | None, dict | None]:
    """Per growth of the arm: the logit-step ratio, and for a width growth the copy divergence after 20/60/160
    post-growth steps (eval.experiments.dynamics_probe; measured once per distinct growth). (None, None) for arms
    that do not grow."""
    if not arm.staged:
        return None, None

    ratios, div = [], {}
    train = np.fromfile(args.data / "train.bin", dtype=np.uint16)
    hp = {"lr": args.lr, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    after = (2, 5, 10) if args.quick else (20, 60, 160)
    for i in range(len(arm.grow)):
        a, b = (GPTConfig(**shape(args, n, vocab)) for n in arm.shapes[i : i + 2])
        key = (a, b, json.dumps(arm.options[i], sort_keys=True))
        if key not in cache:
            opts, seq = dict(arm.options[i]), min(64, args.seq_len)
            wide = b.n_embd > a.n_embd
            cache[key] = (
                dp.growth_logit_ratio(a, b, opts, train, hp, seq_len=seq),
                dp.width_copy_divergence(a, b, opts, train, hp, after=after, seq_len=seq) if wide else None,
            )
        ratios.append(cache[key][0])
        if cache[key][1] is not None:
            div[f"growth {i + 1}: {a.n_layer}x{a.n_embd} -> {b.n_layer}x{b.n_embd}"] = cache[key][1]
    return ratios, div or None


def _setup(args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    d = {k: (_rel(x) if isinstance(x, Path) else x) for k, x in vars(args).items()}
    d["vocab_size"] = vocab
    d["target_flops_per_step"] = cost(args, "target", vocab)
    d["budget_flops"] = args.steps * d["target_flops_per_step"]
    return d


def _rel(p: Path) -> str:
    p = p.resolve()
    return str(p.relative_to(Path.cwd())) if p.is_relative_to(Path.cwd()) else str(p)


def _plain(x: Any) -> Any:
    """numpy scalars as Python numbers in results.json."""
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"{type(x).__name__} is not JSON serializable")
