"""The IsoFLOP experiment's report: results.json, report.md and three plots, computed from the curves alone (so
``growlm-experiment --report_only`` rebuilds them from the committed curves). Arithmetic in eval.experiments.analysis.

Primary metric, per growth arm: the paired difference (same seed, same batches) between the arm's final validation
loss at budget C and the comparator's, the comparator being the scratch size with the lowest pilot loss at C
(chosen once, from the pilot seed); mean and 95% t-interval over the main seeds. "Beats the envelope" only if the
interval's upper bound is below 0.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from growlm.eval.experiments import analysis as an
from growlm.eval.experiments import plan
from growlm.eval.experiments.analysis import fmt_delta, pct, r4
from growlm.eval.experiments.protocol import ARMS, RunSpec, Settings, arm
from growlm.model.config import param_count
from growlm.runtime import atomic


def comparison_fields(deltas: list[float], need: float | None, same: list[float]) -> dict[str, Any]:
    """An arm's comparison in results.json: the paired deltas against the comparator (nats; mean, 95% t-interval,
    per seed, beats_envelope when the interval's upper bound is below 0), the saving against the envelope (``need``:
    the envelope's compute for the arm's mean loss, in units of the arm's budget) and against the same size (per
    seed savings inside the finished runs)."""
    m, lo, hi = an.mean_ci95(deltas)
    sm, slo, shi = an.mean_ci95(same) if same else (None, None, None)
    return {"delta_vs_envelope_mean": r4(m), "delta_vs_envelope_ci95_low": r4(lo),
            "delta_vs_envelope_ci95_high": r4(hi), "beats_envelope": hi is not None and hi < 0,
            "delta_vs_envelope_per_seed": [r4(d) for d in deltas], "saving_vs_envelope_mean": r4(an.saving(1.0, need)),
            "saving_vs_same_size_mean": r4(sm), "saving_vs_same_size_ci95_low": r4(slo),
            "saving_vs_same_size_ci95_high": r4(shi), "saving_vs_same_size_n": len(same)}  # fmt: skip


@dataclass(frozen=True)
class _Finished:
    """The finished runs of one report, looked up by what they are: the settings, the pilot's choices and the main
    seeds that have every run."""

    s: Settings
    st: Any  # plan.pilot's choices: LRs, growth points, LR policies, comparator, crossovers
    done: dict[str, dict]
    seeds: list[int]

    def scratch(self, size: str, b: float, seed: int) -> float | None:
        """The final loss of ``size`` trained from scratch to ``b`` C on main seed ``seed`` (None: not run)."""
        return plan.final_loss(self.done, RunSpec("main", "scratch", seed, b, self.st.lr[size], size=size))

    def grown_spec(self, a: str, seed: int) -> RunSpec:
        """The main run of arm ``a`` on ``seed``."""
        st = self.st
        return RunSpec("main", "grow", seed, 1.0, st.lr[a], arm=a, grow_flops=st.growth[a], policy=st.policy[a])

    def grown(self, a: str, seed: int) -> float:
        """The final loss of arm ``a`` on main seed ``seed``."""
        return plan.final_loss(self.done, self.grown_spec(a, seed))

    def curve(self, spec: RunSpec) -> dict:
        """The curve of a finished run."""
        return self.done[spec.name]["curve"]


def _finished(s: Settings, done: dict[str, dict]) -> _Finished:
    """The runs the report reads, once the pilot is complete and at least 2 main seeds have every run.

    Raises:
        ValueError: the pilot is incomplete, or fewer than 2 seeds have every main run.
    """
    _, st = plan.pilot(s, done)
    if not st.complete:
        raise ValueError("the pilot is incomplete; run growlm-experiment (it resumes) before the report")
    main = plan.main_specs(s, st)
    seeds = [k for k in range(s.seeds) if all(sp.name in done for sp in main if sp.seed == k)]
    if len(seeds) < 2:
        raise ValueError(f"{len(seeds)} seeds have every main run; the report needs at least 2")
    return _Finished(s, st, done, seeds)


def _budget_means(f: _Finished) -> tuple[dict[float, dict[str, float]], dict[float, dict[str, int]]]:
    """Per budget and scratch size, the mean final loss over the main seeds, and how many seeds it averages."""
    means: dict[float, dict[str, float]] = {}
    counts: dict[float, dict[str, int]] = {}
    for b in f.s.budgets:
        for size in f.s.sizes:
            vals = [v for k in f.seeds if (v := f.scratch(size, b, k)) is not None]
            if vals:
                means.setdefault(b, {})[size] = statistics.fmean(vals)
                counts.setdefault(b, {})[size] = len(vals)
    return means, counts


def _arm_rows(f: _Finished, env_points: list[tuple[float, float]], comp_c: list[float]) -> list[dict[str, Any]]:
    """results.json's ``arms``: each growth arm against the comparator, the envelope and its own final size."""
    s, st = f.s, f.st
    rows = []
    for a in ARMS:
        la = [f.grown(a.name, k) for k in f.seeds]
        deltas = [x - y for x, y in zip(la, comp_c, strict=True)]
        need = an.compute_to_reach(env_points, statistics.fmean(la))
        same = []
        for k, x in zip(f.seeds, la, strict=True):
            pts = [(b, v) for b in s.budgets if (v := f.scratch(a.stages[-1], b, k)) is not None]
            same.append(an.saving(1.0, an.compute_to_reach(pts, x)))
        same_ok = [v for v in same if v is not None]
        curves = [f.curve(f.grown_spec(a.name, k)) for k in f.seeds]
        rows.append({
            "arm": a.name, "what": a.what, "final_size": a.stages[-1], "n_seeds": len(f.seeds), "lr": st.lr[a.name],
            "lr_policy": st.policy[a.name],
            "growth_at_C": [round(g / s.c_flops, 4) for g in st.growth[a.name]],
            "growth_flags": st.growth_flags[a.name],
            "final_loss_mean": r4(statistics.fmean(la)),
            **comparison_fields(deltas, need, same_ok),
            "wall_s_mean": r4(statistics.fmean(c["wall_s"] for c in curves), 2),
            "growth_wall_s_mean": r4(statistics.fmean(sum(g["wall_s"] for g in c["growth"]) for c in curves), 3),
            "loss_change_at_growth_mean": r4(statistics.fmean(
                statistics.fmean(g["loss_after"] - g["loss_before"] for g in c["growth"]) for c in curves)),
        })  # fmt: skip
    return rows


def _scratch_rows(f: _Finished, budget_means: dict[float, dict[str, float]], comp_c: list[float]) -> list[dict]:
    """results.json's ``scratch``: each size trained from scratch, against the comparator."""
    s, st = f.s, f.st
    rows = []
    for size in s.sizes:
        lc = [f.scratch(size, 1.0, k) for k in f.seeds]
        m, lo, hi = an.mean_ci95([x - y for x, y in zip(lc, comp_c, strict=True)])
        walls = [f.curve(RunSpec("main", "scratch", k, 1.0, st.lr[size], size=size))["wall_s"] for k in f.seeds]
        rows.append(
            {
                "size": size,
                "lr": st.lr[size],
                "n_params": param_count(s.config(size), include_position_embeddings=False),
                "loss_by_budget": {str(b): r4(budget_means[b].get(size)) for b in budget_means},
                "delta_vs_envelope_mean": r4(m),
                "delta_vs_envelope_ci95_low": r4(lo),
                "delta_vs_envelope_ci95_high": r4(hi),
                "wall_s_mean": r4(statistics.fmean(walls), 2),
            }
        )
    return rows


def lr_sweep(done: Mapping[str, dict], growth: Mapping[str, tuple], order: list[str]) -> dict[str, dict[str, float]]:
    """The pilot's LR sweep at the budget: per size and arm (in ``order``), LR -> final loss, the arms at their chosen
    growth points (``growth``) with the LR continued after growth, no lever."""
    sweep: dict[str, dict[str, float]] = {}
    for rec in done.values():
        sp = rec["spec"]
        if sp.phase == "pilot" and sp.budget == 1.0 and not sp.tag and sp.policy == "continue":
            if sp.kind == "grow" and sp.grow_flops != growth[sp.arm]:
                continue
            sweep.setdefault(sp.size or sp.arm, {})[f"{sp.lr:.2e}"] = r4(rec["curve"]["final"]["val_loss"])
    return {k: dict(sorted(sweep[k].items(), key=lambda kv: float(kv[0]))) for k in order if k in sweep}


def lr_policy(s: Settings, st: Any, done: Mapping[str, dict]) -> dict[str, dict[str, Any]]:
    """Per arm, the pilot's final loss with the LR schedule continued and re-warmed after growth, and the choice
    (``st``: the plan's state, with each arm's LR, growth points and policy)."""
    policy = {}
    for a in s.arm_list():
        base = RunSpec("pilot", "grow", s.pilot_seed, 1.0, st.lr[a.name], arm=a.name, grow_flops=st.growth[a.name])
        policy[a.name] = {"continue": r4(plan.final_loss(done, base)),
                          "rewarm": r4(plan.final_loss(done, replace(base, policy="rewarm"))),
                          "chosen": st.policy[a.name]}  # fmt: skip
    return policy


def _pilot_envelope(f: _Finished) -> dict[str, dict[str, float]]:
    """Budget -> size -> the pilot seed's final loss at the size's chosen LR (every measured budget)."""
    pilot_env: dict[str, dict[str, float]] = {}
    for rec in f.done.values():
        sp = rec["spec"]
        if sp.phase == "pilot" and sp.kind == "scratch" and sp.lr == f.st.lr[sp.size]:
            pilot_env.setdefault(f"{sp.budget:g}", {})[sp.size] = r4(rec["curve"]["final"]["val_loss"])
    return {b: dict(sorted(v.items(), key=lambda kv: list(f.s.sizes).index(kv[0])))
            for b, v in sorted(pilot_env.items(), key=lambda kv: float(kv[0]))}  # fmt: skip


def _levers(f: _Finished, pilot_env: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """The pilot seed's levers, each against its base run."""
    s, st = f.s, f.st
    levers = []
    for sp in plan.lever_specs(s, st):
        if sp.tag == "big":  # against the best scratch size at the same budget (pilot seed)
            best_size = min(pilot_env[f"{sp.budget:g}"], key=pilot_env[f"{sp.budget:g}"].get)
            base = RunSpec("pilot", "scratch", s.pilot_seed, sp.budget, st.lr[best_size], size=best_size)
        else:
            base = RunSpec("pilot", "grow", s.pilot_seed, 1.0, st.lr[sp.arm], arm=sp.arm, grow_flops=st.growth[sp.arm])
        lv, lb = plan.final_loss(f.done, sp), plan.final_loss(f.done, base)
        flags = plan.big_growth(st, arm(sp.arm))[1] if sp.tag == "big" else []
        levers.append({"lever": sp.tag, "what": plan.LEVERS[(sp.arm, sp.tag)], "arm": sp.arm, "budget_C": sp.budget,
                       "growth_at_C": [round(g / s.c_flops, 4) for g in sp.grow_flops], "growth_flags": flags,
                       "base": base.name, "loss": r4(lv), "base_loss": r4(lb), "effect": r4(lv - lb)})  # fmt: skip
    return levers


def _levers_main(f: _Finished, comp_c: list[float]) -> list[dict[str, Any]]:
    """The timing levers on the main seeds, paired with their arm's main runs and with the comparator."""
    s, st = f.s, f.st
    levers_main = []
    lever_runs = [sp for k in f.seeds for sp in plan.main_levers(s, st, k)]
    for tag in plan.MAIN_LEVERS:
        for a in ARMS:
            runs = [sp for sp in lever_runs if sp.arm == a.name and sp.tag == tag]
            if not runs:
                continue
            eff = [plan.final_loss(f.done, sp) - f.grown(a.name, sp.seed) for sp in runs]
            m, lo, hi = an.mean_ci95(eff)
            dm, dlo, dhi = an.mean_ci95([plan.final_loss(f.done, sp) - comp_c[f.seeds.index(sp.seed)] for sp in runs])
            levers_main.append({"lever": tag, "arm": a.name, "what": plan.LEVERS[(a.name, tag)], "n_seeds": len(eff),
                                "growth_at_C": [round(g / s.c_flops, 4) for g in runs[0].grow_flops],
                                "effect_mean": r4(m), "effect_ci95_low": r4(lo), "effect_ci95_high": r4(hi),
                                "effect_per_seed": [r4(e) for e in eff], "delta_vs_envelope_mean": r4(dm),
                                "delta_vs_envelope_ci95_low": r4(dlo),
                                "delta_vs_envelope_ci95_high": r4(dhi)})  # fmt: skip
    return levers_main


def summarize(s: Settings, done: dict[str, dict]) -> dict[str, Any]:
    """results.json's content from the finished curves: the envelope from the scratch runs, each arm and size
    against the comparator, the pilot's LR sweep, policies and levers, the main-seed levers, and the eval noise.

    Raises:
        ValueError: the pilot is incomplete, or fewer than 2 seeds have every main run.
    """
    f = _finished(s, done)
    seeds, st = f.seeds, f.st
    budget_means, budget_seeds = _budget_means(f)
    env = an.envelope(budget_means)
    env_points = [(b, loss) for b, (_, loss) in env.items()]
    comp = st.comparator
    comp_c = [f.scratch(comp, 1.0, k) for k in seeds]
    arms_out = _arm_rows(f, env_points, comp_c)
    pilot_env = _pilot_envelope(f)
    ses = [rec["curve"]["final"]["val_se"] for rec in done.values() if rec["spec"].phase == "main"]
    best = min(arms_out, key=lambda r: r["delta_vs_envelope_mean"])
    tokens_c = s.c_flops / s.step_flops(s.target) * s.batch * s.seq_len
    return {
        "protocol": "IsoFLOP envelope",
        "settings": {k: v for k, v in s.as_dict().items()},
        "data": next(iter(done.values()))["settings"].get("data"),
        "seeds": seeds,
        "pilot_seed": s.pilot_seed,
        "C_flops": s.c_flops,
        "head_fraction_of_target": round(s.head_fraction(), 4),
        "target_tokens_at_C": round(tokens_c),
        "envelope": {
            str(b): {
                "budget_flops": b * s.c_flops,
                "best_size": sz,
                "loss": r4(loss),
                "losses": {k: r4(v) for k, v in budget_means[b].items()},
                "n_seeds": budget_seeds[b],
            }
            for b, (sz, loss) in env.items()
        },  # fmt: skip
        "comparator": {
            "size": comp,
            "loss_at_C_mean": r4(statistics.fmean(comp_c)),
            "seed_sd": r4(statistics.stdev(comp_c)),
        },  # fmt: skip
        "crossovers": {k: {"budget_C": r4(v["budget"]), "flag": v["flag"]} for k, v in st.crossovers.items()},
        "pilot_envelope": pilot_env,
        "lr_sweep": lr_sweep(f.done, f.st.growth, [*f.s.sizes, *(a.name for a in ARMS)]),
        "lr_best": {k: v for k, v in st.lr.items()},
        "lr_policy": lr_policy(f.s, f.st, f.done),
        "levers": _levers(f, pilot_env),
        "levers_main": _levers_main(f, comp_c),
        "arms": arms_out,
        "scratch": _scratch_rows(f, budget_means, comp_c),
        "eval_noise": {
            "final_windows": s.final_windows,
            "val_se_mean": r4(statistics.fmean(ses), 5),
            "comparator_seed_sd": r4(statistics.stdev(comp_c), 5),
        },  # fmt: skip
        "best_arm": best["arm"],
        "best_arm_beats_envelope": best["beats_envelope"],
        "wall_s_runs_total": {
            ph: r4(sum(r["curve"]["wall_s"] for r in done.values() if r["spec"].phase == ph), 1)
            for ph in ("pilot", "main")
        },  # fmt: skip
        "machines": machines(done),
    }


def machines(done: dict[str, dict]) -> dict[str, dict[str, int]]:
    """Per phase, how many runs were timed on each machine (a curve's ``machine``; 'not recorded' in older curves)."""
    out: dict[str, dict[str, int]] = {}
    for rec in done.values():
        m = rec["curve"].get("machine", "not recorded")
        out.setdefault(rec["spec"].phase, {}).setdefault(m, 0)
        out[rec["spec"].phase][m] += 1
    return {ph: dict(sorted(v.items())) for ph, v in sorted(out.items())}


def results_json(summarize, s: Settings, done: dict[str, dict], out: Path) -> dict[str, Any] | None:
    """``summarize(s, done)`` written to ``out``/results.json (atomically) and returned; None, with the reason on
    stderr in one line, when the runs are not enough for it (its ValueError)."""
    try:
        res = summarize(s, done)
    except ValueError as e:
        print(f"growlm-experiment: error: {e}", file=sys.stderr)
        return None
    out.mkdir(parents=True, exist_ok=True)
    atomic.write_json(out / "results.json", res, overwrite=True)
    return res


def write(s: Settings, done: dict[str, dict], out: Path) -> int:
    """Write results.json, report.md and the plots into ``out``; 0, or 2 when the runs are not enough."""
    res = results_json(summarize, s, done, out)
    if res is None:
        return 2
    from growlm.eval.experiments import report_plots  # lazy: matplotlib, only when writing plots

    report_plots.plot_all(s, done, res, out)
    atomic.write_text(out / "report.md", markdown(s, res), overwrite=True)
    print(
        f"growlm-experiment: report in {out / 'report.md'}; best arm {res['best_arm']}: "
        f"{fmt_delta(next(a for a in res['arms'] if a['arm'] == res['best_arm']))} nats vs {res['comparator']['size']}"
    )
    return 0


def _md_setup(s: Settings, r: dict) -> list[str]:
    """report.md's title, setup and the envelope table."""
    budgets = list(r["envelope"])
    sizes = ", ".join(f"`{k}` ({v[0]} x {v[1]}, {v[2]} heads)" for k, v in s.sizes.items())
    lines = [
        "# Does growing beat the model you could have trained instead? (IsoFLOP envelope)",
        "",
        "Produced by `growlm-experiment` (eval/experiments/); every number here is computed from the committed "
        "curves in `curves/` (`growlm-experiment --report_only` rebuilds this file, results.json and the plots).",
        "",
        "## Setup",
        f"- Model family: GPT-2 blocks, sizes {sizes}; "
        f"growth target `{s.target}`. {s.vocab_size}-token ByteLevel BPE: the LM head is "
        f"{100 * r['head_fraction_of_target']:.1f}% of the target's training FLOPs per token.",
        f"- Budget C = {s.c_flops:.3g} FLOPs ({r['target_tokens_at_C']:,} tokens for the target); envelope budgets "
        f"{', '.join(f'{float(b):g} C' for b in budgets)}; every run has its own linear warm-up "
        f"({100 * s.warmup_frac:g}% of its steps) and cosine decay to 0 ending exactly at its budget. "
        f"Batch {s.batch} x {s.seq_len} tokens, AdamW (0.9, 0.95), weight decay 0.1, clipping 1.0, fp32, "
        f"device `{s.device}`; each run reads the training windows in a seeded order, at most twice over.",
        f"- Seeds: pilot seed {r['pilot_seed']}; main seeds {r['seeds']} (the same seed = the same batches in the "
        "same order for every size and arm). Growth with growlm's operators on the whole training state "
        "(weights, Adam moments and step, LR schedule position, masks).",
        f"- Validation: {s.final_windows} windows of {s.seq_len} tokens at evenly spaced offsets over all held-out "
        f"text (final points; curve points use the first {s.curve_windows} of an evenly spaced set). Eval noise "
        f"(standard error of a final loss): {r['eval_noise']['val_se_mean']:.4f} nats; the comparator's seed s.d.: "
        f"{r['eval_noise']['comparator_seed_sd']:.4f} nats. (The windows are the same for every run, so paired "
        "differences carry less eval noise than this.)",
        "",
        "## The envelope (best scratch size per budget, mean over seeds)",
        "",
        "| budget | " + " | ".join(s.sizes) + " | best |",
        "|---|" + "---|" * (len(s.sizes) + 1),
    ]
    for b, e in r["envelope"].items():
        cells = [f"{e['losses'][k]:.4f}" if k in e["losses"] else "-" for k in s.sizes]
        lines.append(f"| {float(b):g} C | " + " | ".join(cells) + f" | `{e['best_size']}` {e['loss']:.4f} |")
    n2 = r["envelope"].get("2.0", {}).get("n_seeds")
    if n2:
        n2 = ", ".join(f"`{k}` {v}" for k, v in n2.items())
        lines.append(f"\nAt 2 C the seed counts are {n2} (the arms' final sizes on every seed, the others on the first "
                     f"{s.budgets_2c_seeds}); that row's means are over those seeds.")  # fmt: skip
    return lines


def _md_primary(s: Settings, r: dict) -> list[str]:
    """report.md's primary comparison: each arm, each scratch size, the verdict."""
    comp = r["comparator"]
    lines: list[str] = []
    lines += [
        "",
        f"Comparator (chosen from the pilot, not per seed): `{comp['size']}`, loss at C {comp['loss_at_C_mean']:.4f} "
        f"(seed s.d. {comp['seed_sd']:.4f}).",
        "",
        "## Primary: each growth arm against the best scratch model at C",
        "",
        "Paired difference in final validation loss (arm - comparator, nats; negative = better), mean and 95% "
        "t-interval over seeds.",
        "",
        "| arm (final size) | growth at (x C) | LR | LR after growth | loss | delta vs envelope [95% CI] | beats it | "
        "saving vs envelope | saving vs same size [95% CI] | wall s (growth s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for a in r["arms"]:
        same = pct(a["saving_vs_same_size_mean"])
        if a["saving_vs_same_size_ci95_low"] is not None:
            same += (
                f" [{100 * a['saving_vs_same_size_ci95_low']:+.1f}, {100 * a['saving_vs_same_size_ci95_high']:+.1f}]"
            )
        if a["saving_vs_same_size_n"] < a["n_seeds"]:
            same += f" ({a['saving_vs_same_size_n']} of {a['n_seeds']} seeds inside the finished runs)"
        lines.append(f"| `{a['arm']}` (`{a['final_size']}`) | {', '.join(f'{g:.3g}' for g in a['growth_at_C'])} | "
                     f"{a['lr']:.1e} | "
                     f"{a['lr_policy']} | {a['final_loss_mean']:.4f} | {fmt_delta(a)} | "
                     f"{'yes' if a['beats_envelope'] else 'no'} | {pct(a['saving_vs_envelope_mean'])} | {same} | "
                     f"{a['wall_s_mean']:.1f} ({a['growth_wall_s_mean']:.2f}) |")  # fmt: skip
    lines += [
        "",
        "Scratch sizes at C against the comparator (context):",
        "",
        "| size | LR | loss at C | delta [95% CI] | wall s |",
        "|---|---|---|---|---|",
    ]
    for z in r["scratch"]:
        lines.append(f"| `{z['size']}` | {z['lr']:.1e} | {z['loss_by_budget']['1.0']:.4f} | "
                     f"{z['delta_vs_envelope_mean']:+.4f} [{z['delta_vs_envelope_ci95_low']:+.4f}, "
                     f"{z['delta_vs_envelope_ci95_high']:+.4f}] | {z['wall_s_mean']:.1f} |")  # fmt: skip
    best = next(a for a in r["arms"] if a["arm"] == r["best_arm"])
    verdict = ("beats the envelope: its interval lies below 0" if best["beats_envelope"] else
               f"does not beat the envelope: its interval's upper bound is {best['delta_vs_envelope_ci95_high']:+.4f} "
               "nats")  # fmt: skip
    lines += ["", f"**Verdict.** The best arm, `{best['arm']}` ({fmt_delta(best)} nats), {verdict}.", ""]
    return lines


def _md_pilot(s: Settings, r: dict) -> list[str]:
    """report.md's pilot: the LR sweep, the pilot seed's envelope, the crossovers, the LR policies."""
    lines: list[str] = []
    lines += [f"## Pilot (seed {r['pilot_seed']})", "", "LR sweep at C: final validation loss per peak LR "
              "(growth arms with LR policy 'continue'); the main runs use each row's best.", "",
              "| size / arm | " + " | ".join(["LR: loss"]) + " | best |", "|---|---|---|"]  # fmt: skip
    for who, sw in r["lr_sweep"].items():
        cells = ", ".join(f"{lr}: {v:.4f}" for lr, v in sorted(sw.items(), key=lambda kv: float(kv[0])))
        lines.append(f"| `{who}` | {cells} | {r['lr_best'][who]:.1e} |")
    lines += ["", "Scratch losses of the pilot seed at every measured budget (each size at its best LR; the sizes the "
              "arms grow between also past C, for the crossovers):", "",
              "| budget | " + " | ".join(s.sizes) + " |", "|---|" + "---|" * len(s.sizes)]  # fmt: skip
    for b, row in r["pilot_envelope"].items():
        lines.append(f"| {b} C | " + " | ".join(f"{row[k]:.4f}" if k in row else "-" for k in s.sizes) + " |")
    lines += ["", "Crossover budgets (where the bigger size's envelope point drops below the smaller's; each "
              f"growth happens there, kept within [{plan.GROW_MIN:g}, {plan.GROW_MAX:g}] C):", ""]  # fmt: skip
    for k, v in r["crossovers"].items():
        flag = f" (the crossover lies {v['flag']} the measured budgets)" if v["flag"] else ""
        lines.append(f"- `{k}`: {v['budget_C']:.3g} C{flag}")
    flags = [f"`{a['arm']}`: {f}" for a in r["arms"] for f in a["growth_flags"]]
    if flags:
        lines += ["", "Growth points moved or read outside the measured budgets:", *[f"- {f}" for f in flags]]
    lines += [
        "",
        "LR policy after growth (loss at C, pilot seed):",
        "",
        "| arm | continue | rewarm | chosen |",
        "|---|---|---|---|",
    ]
    for k, v in r["lr_policy"].items():
        lines.append(f"| `{k}` | {v['continue']:.4f} | {v['rewarm']:.4f} | {v['chosen']} |")
    return lines


def _md_levers(s: Settings, r: dict) -> list[str]:
    """report.md's levers, on the pilot seed and on the main seeds."""
    lines: list[str] = []
    lines += ["", "## Levers (pilot seed; one seed each, to be read against the seed s.d. "
              f"{r['comparator']['seed_sd']:.4f})", "", "| lever | budget (x C) | growth at (x C) | loss | base run | "
              "base loss | effect |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for lv in r["levers"]:
        lines.append(f"| {lv['what']} | {lv['budget_C']:g} | {', '.join(f'{g:.3g}' for g in lv['growth_at_C'])} | "
                     f"{lv['loss']:.4f} | `{lv['base']}` | {lv['base_loss']:.4f} | {lv['effect']:+.4f} |")  # fmt: skip
    flags = [f"{lv['lever']} ({lv['arm']}): {f}" for lv in r["levers"] for f in lv["growth_flags"]]
    if flags:
        lines += ["", "Lever growth points moved or read outside the measured budgets:", *[f"- {f}" for f in flags]]
    if r["levers_main"]:
        lines += ["", "The timing levers on the main seeds (paired with each arm's main runs; effect = lever - arm, "
                  "nats, mean and 95% t-interval; and the lever run against the comparator):", "",
                  "| lever | growth at (x C) | seeds | effect [95% CI] | delta vs envelope [95% CI] |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for lv in r["levers_main"]:
            lines.append(
                f"| {lv['what']} | {', '.join(f'{g:.3g}' for g in lv['growth_at_C'])} | {lv['n_seeds']} | "
                f"{lv['effect_mean']:+.4f} [{lv['effect_ci95_low']:+.4f}, {lv['effect_ci95_high']:+.4f}] | "
                f"{fmt_delta(lv)} |"
            )
    return lines


def _md_plots(s: Settings, r: dict) -> list[str]:
    """report.md's plots and run time."""
    lines: list[str] = []
    lines += ["", "## Plots", "", "![loss against FLOPs](loss_vs_flops.png)", "", "![LR sweep](lr_sweep.png)", "",
              "![paired differences and wall-clock](deltas.png)", "",
              f"Run time (sum of the runs' wall-clock, {s.device}): pilot {r['wall_s_runs_total']['pilot']:.0f} s, "
              f"main {r['wall_s_runs_total']['main']:.0f} s. Machines the runs were timed on (runs per machine): "
              + "; ".join(f"{ph}: " + ", ".join(f"{m} ({n})" for m, n in ms.items())
                          for ph, ms in r["machines"].items()) + ".", ""]  # fmt: skip
    return lines


def markdown(s: Settings, r: dict) -> str:
    """report.md from results.json's content."""
    return "\n".join([*_md_setup(s, r), *_md_primary(s, r), *_md_pilot(s, r), *_md_levers(s, r), *_md_plots(s, r)])
