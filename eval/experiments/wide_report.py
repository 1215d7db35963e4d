"""The wide envelope's report (eval.experiments.wide): ``wide/results.json`` and ``wide/report.md``, computed from the
curves alone (the wide runs', the experiment's and the refine runs'), so ``growlm-experiment --phase optimal
--report_only`` rebuilds them from the committed curves. The comparison is the one ``wide/preregistration.json``
fixed before the wide runs started (``wide.preregistration``, with its amendments); this module computes it and
nothing else.

The primary comparison, per main seed k (paired: the same batches in the same order):
- delta_k = L_arm(k) - L_comp(k) at B, the comparator the best shape (lowest mean loss at B over the seeds) among
  the best shapes; its mean, 95% t-interval, the sign test and the Wilcoxon signed-rank test;
- saving_k = 1 - B / C_k, C_k the compute at which the envelope of the best shapes on seed k (at each budget they
  ran at on that seed, their lowest loss: B, and below or past it as far as ``wide.next_budget`` went) reaches
  L_arm(k): log budget interpolated linearly between the two budgets whose losses bracket it
  (analysis.compute_to_reach; Shen et al. 2022, arXiv 2203.06211, section 4). Negative when the arm is above the
  envelope at B. A seed whose arm is above the envelope's loss at its smallest budget (saving below 1 - 1 / 0.5)
  or below it at 2 B (saving above 50%) has no value: the runs do not bracket it, and it is counted apart.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from growlm.eval.experiments import analysis as an
from growlm.eval.experiments import plan, wide
from growlm.eval.experiments.analysis import ci, p4, pv, r4
from growlm.eval.experiments.protocol import RunSpec, Settings
from growlm.runtime import atomic

WIDE_PROTOCOL = "isoflop-wide-envelope-v1"
GOAL = 0.10  # the saving the pre-registration names as the goal (a share of compute; its interval above 0 too)


def summarize(s: Settings, w_in: wide.Inputs, w_done: Mapping[str, dict]) -> dict[str, Any]:
    """wide/results.json's content from the finished runs (the module docstring says what each number is).

    Args:
        s: the experiment's settings.
        w_in: the experiment's and the refine runs' part (``wide.inputs``).
        w_done: the wide runs' curves, by name.

    Returns:
        the report's fields; ``primary`` is None until 2 main seeds have every run of the comparison.

    Raises:
        ValueError: the pilot of the new shapes is incomplete (nothing to report yet).
    """
    _, st = wide.wide_plan(s, w_in.known_lr, w_in.known, w_done, w_in.known_loss, w_in.primary, w_in.arm_loss)
    if not st.pilot_complete:
        raise ValueError("the wide envelope's pilot is incomplete: its report is written once every new shape's LR "
                         "is tuned (growlm-experiment --phase optimal resumes it)")  # fmt: skip

    def loss(z: str, k: int, b: float) -> float | None:
        mine = plan.final_loss(w_done, RunSpec(wide.WIDE, "scratch", k, b, st.lr[z], size=z))
        return mine if mine is not None or z not in w_in.known else w_in.known_loss(z, k, b)

    def arm_loss(k: int) -> float | None:
        return wide.seed_arm_loss(k, s, w_done, w_in.primary, w_in.arm_loss)

    def at_b(k: int) -> bool:
        """Seed k's arm and every best shape have run at B (its primary comparison can be read)."""
        return bool(st.best) and arm_loss(k) is not None and wide.envelope(st.best, k, loss)(1.0) is not None

    shapes = [_shape_row(s, st, z, w_done, loss) for z in st.shapes]
    seeds = [k for k in range(wide.n_seeds(s)) if at_b(k)]
    res: dict[str, Any] = {
        "protocol": WIDE_PROTOCOL, "budget_C": s.design["budget_C"], "budget_flops": s.c_flops,
        "primary_arm": w_in.primary.arm,
        "envelope_shapes": [{"n_layer": v[0], "n_embd": v[1], "n_head": v[2]} for v in st.shapes.values()],
        "rule": {"width_factors": list(wide.WIDTH_FACTORS), "param_factor": wide.PARAM_FACTOR,
                 "head_size": s.sizes[s.design["comparator"]][1] // s.sizes[s.design["comparator"]][2],
                 "screen_seeds": list(wide.SCREEN_SEEDS), "n_best": wide.N_BEST, "budgets": list(wide.BUDGETS)},
        "shapes": shapes, "pilot_seed": s.pilot_seed, "screen_complete": st.screen_complete,
        "best_shapes": list(st.best), "seeds": seeds, "n_seeds": len(seeds),
        "complete": st.complete and len(seeds) == wide.n_seeds(s),
        "runs": len(w_done), "wall_s_runs_total": r4(sum(r["curve"]["wall_s"] for r in w_done.values()), 1),
        "machines": _machines(s, w_in, w_done), "unread_runs": _unread(st.best, w_done, loss), "primary": None,
    }  # fmt: skip
    if len(seeds) >= 2:
        bracketed = [k for k in seeds if wide.next_budget(arm_loss(k), wide.envelope(st.best, k, loss)) is None]
        res |= _primary(w_in.primary.arm, st.best, seeds, bracketed, loss, arm_loss)
        res["comparator_missing_neighbours"] = wide.missing_neighbours(st.shapes[res["comparator"]], s, st.shapes)
    return res


def _unread(best: list[str], w_done: Mapping[str, dict], loss: Callable) -> list[dict[str, Any]]:
    """The wide runs away from B that no table or comparison reads: a budget's envelope on a seed is read only once
    every best shape has run there (``wide.envelope``), so a run there alone (one left from an earlier plan) is kept
    and named, not used. Each: shape, seed, budget (x B), final loss."""
    rows = []
    for rec in w_done.values():
        z, k, b = rec["spec"].size, rec["spec"].seed, rec["spec"].budget
        if b != 1.0 and (z not in best or wide.envelope(best, k, loss)(b) is None):
            rows.append({"shape": z, "seed": k, "budget": b, "final_loss": r4(loss(z, k, b), 5)})
    return sorted(rows, key=lambda x: (x["seed"], x["budget"], x["shape"]))


def _machines(s: Settings, w_in: wide.Inputs, w_done: Mapping[str, dict]) -> dict[str, dict[str, Any]]:
    """Where the runs ran: the primary arm's main seeds by machine, and the wide runs counted by machine."""
    arm: dict[str, list[int]] = {}
    for k in range(wide.n_seeds(s)):
        m = w_in.arm_machine(k) if k < s.seeds else wide.machine(w_done, replace(w_in.primary, phase=wide.WIDE, seed=k))
        if m is not None:
            arm.setdefault(m, []).append(k)
    runs = Counter(rec["curve"].get("machine") or "unknown" for rec in w_done.values())
    return {"arm_seeds": arm, "wide_runs": dict(sorted(runs.items()))}


def _shape_row(s: Settings, st: wide.WideState, z: str, w_done: Mapping[str, dict], loss: Callable) -> dict:
    """One shape of the envelope: its shape, parameters, LR, the pilot's sweep (new shapes) and the screen."""
    v = st.shapes[z]
    sweep = {sp.lr: rec["curve"]["final"]["val_loss"] for rec in w_done.values()
             if (sp := rec["spec"]).size == z and sp.seed == s.pilot_seed and sp.budget == 1.0}  # fmt: skip
    return {"name": z, "n_layer": v[0], "n_embd": v[1], "n_head": v[2], "n_params": wide.n_params(v, s),
            "trained_by": "wide" if z in st.new else "experiment", "lr": st.lr[z], "lr_at_edge": st.lr_edge.get(z),
            "pilot_sweep": {f"{lr:.3e}": r4(x) for lr, x in sorted(sweep.items())},
            "screen_loss": r4(st.screen_loss.get(z)),
            "screen_losses": [r4(loss(z, k, 1.0)) for k in wide.SCREEN_SEEDS], "best": z in st.best}  # fmt: skip


def _primary(
    arm: str, best: list[str], seeds: list[int], bracketed: list[int], loss: Callable, arm_loss: Callable
) -> dict[str, Any]:
    """The comparator among the best shapes and the primary comparison over ``seeds`` (the arm and every best shape
    run at B), the saving over ``bracketed`` (those of them whose runs away from B are done; the rest pending)."""
    ran = {b: [k for k in seeds if wide.envelope(best, k, loss)(b) is not None] for b in wide.BUDGETS}
    by_budget = {b: {z: statistics.fmean(loss(z, k, b) for k in ks) for z in best} for b, ks in ran.items() if ks}
    comp = min(best, key=lambda z: (by_budget[1.0][z], z))
    rows, deltas, savings, outside = [], [], [], {}
    for k in seeds:
        la, lc, env = arm_loss(k), loss(comp, k, 1.0), wide.envelope(best, k, loss)
        points = [(b, x) for b in wide.BUDGETS if (x := env(b)) is not None]
        need = an.compute_to_reach(points, la) if k in bracketed else None
        sv = an.saving(1.0, need)
        if sv is not None:
            savings.append(sv)
        elif k in bracketed:  # the budgets ran out on one side of the arm's loss
            b, where = (points[0][0], "above") if la > points[0][1] else (points[-1][0], "below")
            outside[str(k)] = f"{where} the envelope at {b:g} B"
        deltas.append(la - lc)
        rows.append({"seed": k, "arm_loss": r4(la, 5), "comparator_loss": r4(lc, 5), "delta": r4(la - lc, 5),
                     "envelope": {f"{b:g}": r4(x, 5) for b, x in points}, "compute_to_reach_B": r4(need),
                     "saving": r4(sv), "bracketed": k in bracketed})  # fmt: skip
    sv_ci = ci(savings) if savings else {"mean": None, "ci95": [None, None]}
    return {
        "comparator": comp,
        "best_shapes_by_budget": {f"{b:g}": {z: r4(x) for z, x in m.items()} for b, m in by_budget.items()},
        "seeds_by_budget": {f"{b:g}": ks for b, ks in ran.items() if ks},
        "primary": {
            "arm": arm, "final_loss_mean": r4(statistics.fmean(arm_loss(k) for k in seeds)),
            "comparator_loss_mean": r4(by_budget[1.0][comp]), "per_seed": rows,
            "delta_vs_comparator": ci(deltas), "n_negative": sum(d < 0 for d in deltas),
            "sign_test_p": r4(an.sign_test_p(deltas), 5), "wilcoxon_p": r4(an.wilcoxon_p(deltas), 5),
            "saving_vs_envelope": {**sv_ci, "n": len(savings), "outside": outside,
                                   "pending": [k for k in seeds if k not in bracketed]},
            "goal_met": sv_ci["mean"] is not None and not outside and len(bracketed) == len(seeds)
                        and sv_ci["mean"] >= GOAL and (sv_ci["ci95"][0] or 0) > 0,
        },
    }  # fmt: skip


def _machines_line(m: Mapping[str, Any]) -> str:
    """Where the runs ran, in words, with what that means for a paired comparison."""
    arm = "; ".join(f"{name} (seeds {', '.join(map(str, ks))})" for name, ks in m["arm_seeds"].items()) or "none yet"
    runs = "; ".join(f"{name} ({n})" for name, n in m["wide_runs"].items())
    return (
        f"Where the runs ran: the primary arm on {arm}; the wide runs on {runs}. Runs on different CPUs round "
        "differently, and a run at a high LR can then drift from its twin (docs/evaluation.md, what reproduces): "
        "a seed whose arm and shapes ran on two CPUs carries that noise in its pair, and the intervals with it."
    )


def _unread_line(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    runs = ", ".join(
        f"`{x['shape']}` at {x['budget']:g} B on seed {x['seed']} (loss {x['final_loss']:.4f})" for x in rows
    )
    return (
        " Kept, read by no table or comparison (every best shape must have run at a budget on a seed before the "
        f"envelope there is read): {runs}."
    )


def markdown(s: Settings, r: Mapping[str, Any]) -> str:
    """wide/report.md from wide/results.json's content."""
    ru = r["rule"]
    lines = [
        "# The wide envelope at B: every shape a user could train instead",
        "",
        "Produced by `growlm-experiment --phase optimal` (eval/experiments/wide.py, after the experiment and its "
        "refine runs); every number here is computed from the committed curves (`curves/` here, `../curves/`, "
        "`../refine/curves/`) and `--phase optimal --report_only` rebuilds this file and results.json. The comparison "
        "was fixed in `preregistration.json` before any wide run started; a change made later is appended there "
        "as an amendment, with when, why and which way it moves the result.",
        "",
        "## Shapes",
        "Every n_layer from 1 to twice the comparator's and n_embd of "
        f"{', '.join(f'{f:g}' for f in ru['width_factors'])} x the comparator's (one head size, {ru['head_size']}), "
        f"whose parameters (without position embeddings) lie within a factor {ru['param_factor']:g} of the "
        f"comparator's: {len(r['envelope_shapes'])} shapes of {len({x['n_embd'] for x in r['envelope_shapes']})} "
        f"widths. A new shape's LR was swept on the pilot seed ({r['pilot_seed']}) at B on a factor-2 grid centred "
        "on the nearest depth's tuned LR times the comparator's width over its own, widened at an edge; the shapes "
        "the experiment trained keep their tuned LRs. Screen: every shape's mean final loss at B over main seeds "
        f"{ru['screen_seeds']}.",
        "",
        "| shape | n_layer x n_embd (n_head) | parameters | LR | pilot loss at B | screen loss at B | best |",
        "|---|---|---|---|---|---|---|",
    ]
    for x in r["shapes"]:
        pilot = min(x["pilot_sweep"].values()) if x["pilot_sweep"] else None
        edge = f" ({x['lr_at_edge']} of its grid)" if x["lr_at_edge"] else ""
        lines.append(f"| `{x['name']}` | {x['n_layer']} x {x['n_embd']} ({x['n_head']}) | {x['n_params']:,} | "
                     f"{x['lr']:.3g}{edge} | {p4(pilot) if pilot is not None else 'experiment'} | "
                     f"{p4(x['screen_loss'])} | {'yes' if x['best'] else ''} |")  # fmt: skip
    if not r["screen_complete"]:
        lines += ["", "The screen is not complete: the best shapes are not chosen yet."]
    if r["primary"] is None:
        lines += ["", "**Not finished.** The primary comparison needs at least 2 main seeds with the arm and every "
                      f"best shape at B ({r['runs']} wide runs so far).", ""]  # fmt: skip
        return "\n".join(lines)
    p, sv = r["primary"], r["primary"]["saving_vs_envelope"]
    d = p["delta_vs_comparator"]
    lines += [
        "",
        f"## The best shapes around B ({len(r['seeds'])} main seeds with the arm and every best shape at B: "
        f"{r['seeds']})",
        f"The {len(r['best_shapes'])} shapes with the lowest screen loss, mean final loss at each budget over the "
        "seeds that ran it; the comparator is the best of them at B (chosen after the seeds ran, which favours the "
        "envelope). A seed runs away from B only as far as its envelope needs to bracket the arm's loss (below B "
        "where the arm lost at B, past it where it won), so the columns average different seeds, chosen by the "
        "outcome: a row is not a loss-against-compute curve.",
        "",
        "| shape | "
        + " | ".join(f"{b} B ({len(r['seeds_by_budget'][b])} seeds)" for b in r["best_shapes_by_budget"])
        + " |",
        "|---|" + "---|" * len(r["best_shapes_by_budget"]),
    ]
    for z in r["best_shapes"]:
        cells = " | ".join(p4(m[z]) for m in r["best_shapes_by_budget"].values())
        lines.append(f"| `{z}`{' (comparator)' if z == r['comparator'] else ''} | {cells} |")
    if r["comparator_missing_neighbours"]:
        edge = ", ".join(r["comparator_missing_neighbours"])
        lines += ["", f"The comparator sits at an edge of the envelope: next to it on the rule's grid, {edge} are not "
                      "in it. A shape past that edge could be better still; that can only lower the envelope, so it "
                      "favours the arm, not the envelope."]  # fmt: skip
    lines += [
        "",
        f"## The primary arm `{p['arm']}` against the wide envelope",
        "",
        "| seed | arm loss at B | comparator loss at B | delta | envelope loss (budget x B: loss) | compute to reach "
        "(x B) | saving |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for x in p["per_seed"]:
        need = "n/a" if x["compute_to_reach_B"] is None else f"{x['compute_to_reach_B']:.3f}"
        saving = "pending" if not x["bracketed"] else "n/a" if x["saving"] is None else f"{100 * x['saving']:+.1f}%"
        env = ", ".join(f"{b}: {v:.4f}" for b, v in x["envelope"].items())
        lines.append(f"| {x['seed']} | {x['arm_loss']:.4f} | {x['comparator_loss']:.4f} | {x['delta']:+.4f} | "
                     f"{env} | {need} | {saving} |")  # fmt: skip
    out = "".join(f"; seed {k}: {why}" for k, why in sorted(sv["outside"].items(), key=lambda kv: int(kv[0])))
    if sv["pending"]:
        out += f"; pending (the runs away from B not all done): seeds {', '.join(map(str, sv['pending']))}"
    if sv["mean"] is None:
        sv_text = "n/a (no seed's arm loss lies between the envelope's at two of its budgets yet)"
    else:
        lo, hi = sv["ci95"]
        sv_text = f"{100 * sv['mean']:+.1f}%" + ("" if lo is None else f" [{100 * lo:+.1f}%, {100 * hi:+.1f}%]")
    lines += [
        "",
        f"- Loss against the comparator `{r['comparator']}` at B: {d['mean']:+.4f} nats, 95% t-interval "
        f"[{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]; {p['n_negative']} of {len(r['seeds'])} seeds below it; "
        f"sign test p = {pv(p['sign_test_p'])}, Wilcoxon signed-rank p = {pv(p['wilcoxon_p'])} (two-sided).",
        f"- Saving of compute against the envelope of the best shapes (per seed, 1 - B / the compute at which their "
        f"lowest loss at each budget reaches the arm's; a share of compute, between -100% and +50% where the "
        f"budgets bracket it): {sv_text} over {sv['n']} seeds{out}. Taking each seed's lowest of "
        f"{len(r['best_shapes'])} shapes favours the envelope.",
        "",
        f"**Verdict.** The pre-registered goal (a saving of at least {100 * GOAL:.0f}% with the interval above 0) is "
        + ("met." if p["goal_met"] else "not met.")
        + ("" if r["complete"] else " The comparison is not complete: more runs are to come."),
        "",
        f"## Cost\n{r['runs']} wide runs, {r['wall_s_runs_total'] / 3600:.1f} hours of run wall time (2 at a time on "
        f"2 cores).{_unread_line(r['unread_runs'])}",
        "",
        _machines_line(r["machines"]),
        "",
    ]
    return "\n".join(lines)


def write(s: Settings, w_in: wide.Inputs, w_done: Mapping[str, dict], out: Path) -> int:
    """Write results.json and report.md into ``out`` (the wide/ folder) atomically; 0, also when the pilot is not
    complete yet (nothing is written then and a line says so)."""
    try:
        res = summarize(s, w_in, w_done)
    except ValueError as e:
        print(f"growlm-experiment: no wide envelope report yet: {e}")
        return 0
    atomic.write_json(out / "results.json", res, overwrite=True)
    atomic.write_text(out / "report.md", markdown(s, res), overwrite=True)
    p = res["primary"]
    what = ("the primary comparison needs 2 seeds with every run" if p is None else
            f"{p['arm']} {p['delta_vs_comparator']['mean']:+.4f} nats vs {res['comparator']} over {res['n_seeds']} "
            f"seeds, saving {p['saving_vs_envelope']['mean']}")  # fmt: skip
    print(f"growlm-experiment: wide envelope report in {out / 'report.md'}; {what}")
    return 0
