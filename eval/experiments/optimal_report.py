"""The report of the IsoFLOP experiment at the compute-optimal size (eval.experiments.optimal): results.json and
report.md, computed from the curves alone, so ``growlm-experiment --phase optimal --report_only`` rebuilds them from
the committed curves. The primary metric and what each number means are in eval.experiments.optimal's docstring.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from growlm.eval.experiments import analysis as an
from growlm.eval.experiments import plan
from growlm.eval.experiments.analysis import fmt_delta, pct, r4
from growlm.eval.experiments.optimal import (
    ENVELOPE,
    LATE_MAX,
    OPTIMAL_PROTOCOL,
    REFINE,
    TIMING,
    State,
    between_sizes,
    epochs,
    experiment_plan,
    lever_specs,
    lever_what,
    main_specs,
    refine_plan,
    refine_settings,
)
from growlm.eval.experiments.protocol import RunSpec, Settings
from growlm.eval.experiments.report import comparison_fields, lr_policy, lr_sweep, results_json
from growlm.model.config import param_count
from growlm.runtime import atomic


def refine_summary(
    s: Settings,
    st: State,
    refined: Mapping[str, dict],
    seeds: list[int],
    arm_losses: Mapping[str, list[float]],
    size_losses: Mapping[str, list[float]],
) -> dict[str, Any]:
    """results.json's ``refine``: each between size's LR sweep, LR and losses at B on ``seeds``; once every seed
    has them, the best size at B among the envelope's and these (lowest mean over ``seeds``, chosen after the fact)
    and each arm's paired difference against it (mean, 95% t-interval, ``beats``: the upper bound below 0).
    ``arm_losses`` / ``size_losses``: each arm's and envelope size's final losses at B on ``seeds``, in order."""
    r_s = refine_settings(s)
    specs, lrs = refine_plan(s, st, refined)
    sizes, per_seed = {}, {}
    for z, shape in between_sizes(s).items():
        sweep = {f"{sp.lr:.2e}": r4(v) for sp in specs if sp.size == z and sp.seed == s.pilot_seed
                 if (v := plan.final_loss(refined, sp)) is not None}  # fmt: skip
        lr = lrs.get(z)  # None until its sweep is complete
        got = [plan.final_loss(refined, RunSpec(REFINE, "scratch", k, 1.0, lr, size=z)) for k in seeds] if lr else []
        per_seed[z] = got if got and None not in got else None
        sizes[z] = {"shape": list(shape), "n_params": param_count(r_s.config(z), include_position_embeddings=False),
                    "lr": lr, "lr_sweep": dict(sorted(sweep.items(), key=lambda kv: float(kv[0]))),
                    "loss_at_B_mean": r4(statistics.fmean(per_seed[z])) if per_seed[z] else None}  # fmt: skip
    not_run = [sp.name for sp in specs if sp.name not in refined]
    out: dict[str, Any] = {"sizes": sizes, "runs_not_run": not_run,  # the current round's
                           "runs_left": len(not_run) + s.seeds * sum(z not in lrs for z in sizes),
                           "complete": all(per_seed.values())}  # fmt: skip
    if out["complete"]:
        cand = {**size_losses, **per_seed}
        best = min(cand, key=lambda z: statistics.fmean(cand[z]))
        out |= {"best_size_at_B": best, "best_loss_at_B": r4(statistics.fmean(cand[best])), "arms": {}}
        for a, la in arm_losses.items():
            m, lo, hi = an.mean_ci95([x - y for x, y in zip(la, cand[best], strict=True)])
            out["arms"][a] = {"delta_mean": r4(m), "delta_ci95_low": r4(lo), "delta_ci95_high": r4(hi),
                              "beats": hi is not None and hi < 0}  # fmt: skip
        out["epochs"] = {sp.name: float(f"{epochs(r_s, sp):.4g}") for sp in sorted(specs, key=lambda x: x.name)}
    return out


def _scratch_loss(done: Mapping[str, dict], st: State, z: str, b: float, k: int) -> float | None:
    """The final loss of size ``z`` trained from scratch to ``b`` B on main seed ``k`` (None: not run)."""
    return plan.final_loss(done, RunSpec("main", "scratch", k, b, st.lr[z], size=z))


def _arm_spec(st: State, a: str, k: int) -> RunSpec:
    """The main run of arm ``a`` on seed ``k``."""
    return RunSpec("main", "grow", k, 1.0, st.lr[a], arm=a, grow_flops=st.growth[a], policy=st.policy[a])


def _arm_rows(
    s: Settings,
    st: State,
    done: Mapping[str, dict],
    seeds: list[int],
    bud: tuple[float, ...],
    env_points: list[tuple[float, float]],
    comp_b: list[float],
    best_b: list[float],
) -> list[dict]:
    """results.json's ``arms``: each arm against the comparator, the envelope, the best size and its own size."""
    arms = []
    for a in s.arm_list():
        runs = [done[_arm_spec(st, a.name, k).name]["curve"] for k in seeds]
        la = [c["final"]["val_loss"] for c in runs]
        need = an.compute_to_reach(env_points, statistics.fmean(la))
        deltas = [x - y for x, y in zip(la, comp_b, strict=True)]
        same = []
        for k, x in zip(seeds, la, strict=True):
            pts = [(b, v) for b in bud if (v := _scratch_loss(done, st, a.stages[-1], b, k)) is not None]
            same.append(an.saving(1.0, an.compute_to_reach(pts, x)))
        same_ok = [v for v in same if v is not None]
        bm, blo, bhi = an.mean_ci95([x - y for x, y in zip(la, best_b, strict=True)])
        arms.append({"arm": a.name, "what": a.what, "stages": list(a.stages), "final_size": a.stages[-1],
                     "n_seeds": len(seeds), "lr": st.lr[a.name], "lr_policy": st.policy[a.name],
                     "growth_at_B": [round(f / s.c_flops, 4) for f in st.growth[a.name]],
                     "growth_flags": st.growth_flags[a.name], "final_loss_mean": r4(statistics.fmean(la)),
                     **comparison_fields(deltas, need, same_ok),
                     "delta_vs_best_size_at_B_mean": r4(bm), "delta_vs_best_size_at_B_ci95_low": r4(blo),
                     "delta_vs_best_size_at_B_ci95_high": r4(bhi),
                     "loss_change_at_growth_mean": r4(statistics.fmean(statistics.fmean(
                         g["loss_after"] - g["loss_before"] for g in c["growth"]) for c in runs)),
                     "wall_s_mean": r4(statistics.fmean(c["wall_s"] for c in runs), 2)})  # fmt: skip
    return arms


def _scratch_rows(s: Settings, st: State, done: Mapping[str, dict], seeds: list[int], bud: tuple[float, ...],
                  means: dict[float, dict[str, float]], comp_b: list[float]) -> list[dict]:  # fmt: skip
    """results.json's ``scratch``: each envelope size against the comparator."""
    d = s.design
    scratch_out = []
    for z in d["envelope"]:
        lz = [_scratch_loss(done, st, z, 1.0, k) for k in seeds]
        m, lo, hi = an.mean_ci95([x - y for x, y in zip(lz, comp_b, strict=True)])
        scratch_out.append({"size": z, "shape": list(s.sizes[z]), "lr": st.lr[z],
                            "n_params": param_count(s.config(z), include_position_embeddings=False),
                            "loss_by_budget": {f"{b:g}": r4(means[b].get(z)) for b in bud},
                            "delta_vs_envelope_mean": r4(m), "delta_vs_envelope_ci95_low": r4(lo),
                            "delta_vs_envelope_ci95_high": r4(hi)})  # fmt: skip
    return scratch_out


def _levers(s: Settings, st: State, done: Mapping[str, dict], lever_runs: list[RunSpec]) -> list[dict[str, Any]]:
    """The pilot seed's levers that have run, each against the arm's pilot run (once the main runs are complete)."""
    levers = []
    if st.main_complete:
        for sp in lever_runs:
            lv = plan.final_loss(done, sp)
            if lv is None:
                continue
            base = RunSpec("pilot", "grow", s.pilot_seed, 1.0, st.lr[sp.arm], arm=sp.arm, grow_flops=st.growth[sp.arm],
                           policy=st.policy[sp.arm])  # fmt: skip
            lb = plan.final_loss(done, base)
            levers.append({"lever": sp.tag, "arm": sp.arm, "what": lever_what(s, sp),
                           "growth_at_B": [round(f / s.c_flops, 4) for f in sp.grow_flops], "loss": r4(lv),
                           "base": base.name, "base_loss": r4(lb), "effect": r4(lv - lb)})  # fmt: skip
    return levers


def _refine(s: Settings, st: State, done: Mapping[str, dict], refined: Mapping[str, dict] | None, seeds: list[int],
            data: Any) -> dict | None:  # fmt: skip
    """The refine runs' summary (``refine_summary``), None when not read or the experiment is incomplete.

    Raises:
        ValueError: a refine curve comes from another token folder.
    """
    d = s.design
    refine = None
    if other := [n for n, rec in sorted((refined or {}).items()) if rec["settings"].get("data") != data]:
        raise ValueError(f"the refine curve {other[0]} comes from another token folder than the experiment's curves; "
                         "move the refine/ folder away (a rerun trains its runs again)")  # fmt: skip
    if refined is not None and st.complete:
        arm_l = {a.name: [done[_arm_spec(st, a.name, k).name]["curve"]["final"]["val_loss"] for k in seeds]
                 for a in s.arm_list()}  # fmt: skip
        refine = refine_summary(s, st, refined, seeds, arm_l, {z: [_scratch_loss(done, st, z, 1.0, k) for k in seeds]
                                                               for z in d["envelope"]})  # fmt: skip
    return refine


def summarize(
    s: Settings,
    done: Mapping[str, dict],
    note: Mapping[str, Any] | None = None,
    refined: Mapping[str, dict] | None = None,
) -> dict[str, Any]:
    """results.json's content from the finished curves (the main runs of every seed that has all of them);
    ``note``: how the target and B were chosen (``choice_note``), copied in; ``refined``: the refine runs' curves
    (``refine_summary``; None: not read, and ``refine`` is left out).

    Raises:
        ValueError: the pilot is incomplete, fewer than 2 seeds have every main run, or a refine curve comes from
            another token folder.
    """
    _, st = experiment_plan(s, done)
    if not st.pilot_complete:
        raise ValueError("the pilot is incomplete; run growlm-experiment --phase optimal (it resumes) first")
    d = s.design
    main = main_specs(s, st)
    seeds = [k for k in range(s.seeds) if all(sp.name in done for sp in main if sp.seed == k)]
    if len(seeds) < 2:
        raise ValueError(f"{len(seeds)} seeds have every main run; the report needs at least 2")
    bud = ENVELOPE + ((d["same_size_budget"],) if d["same_size_budget"] else ())

    means = {b: {z: statistics.fmean(v) for z in d["envelope"]
                 if (v := [x for k in seeds if (x := _scratch_loss(done, st, z, b, k)) is not None])}
             for b in bud}  # fmt: skip
    env = an.envelope({b: m for b, m in means.items() if b in ENVELOPE})
    env_points = [(b, loss) for b, (_, loss) in env.items()]
    comp = d["comparator"]
    comp_b = [_scratch_loss(done, st, comp, 1.0, k) for k in seeds]
    best_b = [_scratch_loss(done, st, env[1.0][0], 1.0, k) for k in seeds]  # the best size over the main seeds
    arms = _arm_rows(s, st, done, seeds, bud, env_points, comp_b, best_b)
    scratch_out = _scratch_rows(s, st, done, seeds, bud, means, comp_b)
    sweep = lr_sweep(done, st.growth, sorted({sp.size or sp.arm for sp in (r["spec"] for r in done.values())}))
    policy = lr_policy(s, st, done)
    lever_runs = lever_specs(s, st)
    levers = _levers(s, st, done, lever_runs)
    best = min(arms, key=lambda x: x["delta_vs_envelope_mean"])
    primary = next(a for a in arms if a["arm"] == st.primary)
    data = next(iter(done.values()))["settings"].get("data")
    refine = _refine(s, st, done, refined, seeds, data)
    skipped = [t for t in TIMING if t not in {sp.tag for sp in lever_runs}] if st.main_complete else []
    not_run = [sp.tag for sp in lever_runs if plan.final_loss(done, sp) is None]
    ses = [rec["curve"]["final"]["val_se"] for rec in done.values() if rec["spec"].phase == "main"]
    return {
        "protocol": OPTIMAL_PROTOCOL, "settings": s.as_dict(),
        "data": data,
        "budget_flops": s.c_flops, "budget_C": d["budget_C"], "C_flops": d["map_c_flops"], "target": s.target,
        **(note or {}), "comparator": comp,
        "envelope": {f"{b:g}": {"budget_flops": b * s.c_flops, "best_size": z, "loss": r4(loss),
                                "losses": {k: r4(v) for k, v in means[b].items()}} for b, (z, loss) in env.items()},
        "envelope_at_B": {"size": env[1.0][0], "loss": r4(env[1.0][1]), "comparator_loss": r4(statistics.fmean(comp_b)),
                          "comparator_seed_sd": r4(statistics.stdev(comp_b), 5)},
        "seeds": seeds, "pilot_seed": s.pilot_seed, "n_seeds": len(seeds),
        "arms": arms, "scratch": scratch_out, "primary_arm": primary["arm"],
        "primary_arm_beats_envelope": primary["beats_envelope"], "best_arm": best["arm"],
        "best_arm_beats_envelope": best["beats_envelope"],
        "lr_sweep": sweep, "lr_best": dict(st.lr), "lr_at_edge": dict(sorted(st.lr_edge.items())),
        "lr_from_map": d["lr_from_map"], "lr_policy": policy,
        "levers": levers, "levers_skipped": skipped, "levers_not_run": not_run,
        **({"refine": refine, "primary_arm_beats_refined_envelope": refine["arms"][st.primary]["beats"]
            if refine["complete"] else None} if refine is not None else {}),
        "epochs": {name: float(f"{epochs(s, rec['spec']):.4g}") for name, rec in sorted(done.items())},
        "eval_noise": {"final_windows": s.final_windows, "val_se_mean": r4(statistics.fmean(ses), 5)},
        "wall_s_runs_total": {ph: r4(sum(r["curve"]["wall_s"] for r in done.values() if r["spec"].phase == ph), 1)
                              for ph in ("pilot", "main")},
    }  # fmt: skip


def markdown(s: Settings, r: Mapping[str, Any]) -> str:
    """report.md from results.json's content."""
    d = s.design
    env_sizes = d["envelope"]
    ep = r["epochs"]
    lines = [
        "# Growing into the compute-optimal model: the IsoFLOP experiment at the map's budget",
        "",
        "Produced by `growlm-experiment --phase optimal` (eval/experiments/optimal.py); every number here is computed "
        "from the committed curves in `curves/` (`--phase optimal --report_only` rebuilds this file and "
        "results.json).",
        "",
        "## Setup",
        f"- Budget B = {d['budget_C']:g} C = {r['budget_flops']:.3g} FLOPs (C = {r['C_flops']:.3g}); target "
        f"`{r['target']}`, chosen by {r.get('chosen_by', 'flags')}"
        + (f" (the map's rule: {r['map_choice']['why']})" if "map_choice" in r else "")
        + ".",
        f"- Envelope: {', '.join(f'`{z}` ({s.sizes[z][0]} x {s.sizes[z][1]})' for z in env_sizes)} at "
        f"{', '.join(f'{b:g} B' for b in ENVELOPE)}"
        + (f"; the target also at {d['same_size_budget']:g} B" if d["same_size_budget"] else "")
        + f". Comparator (the envelope size with the lowest map loss at B, pilot seed): `{r['comparator']}`.",
        f"- Seeds: pilot {r['pilot_seed']}; main {r['seeds']}. Each seed reads the same batches in the same order for "
        f"every size and arm. Epochs over the training split per run: {min(ep.values()):.4g} to "
        f"{max(ep.values()):.4g} (every run in results.json `epochs`). Runs reproduce bit for bit on one CPU; another "
        "CPU's kernels round differently, and a run at a high LR can then diverge chaotically from its twin "
        "(docs/evaluation.md gives a measured case): compare means over seeds, not single runs.",
        "- LRs: the envelope sizes' from the map where it tuned them at B ("
        + (", ".join(f"`{z}` {v:.1e}" for z, v in r["lr_from_map"].items()) or "none")
        + "), the arms' swept at B on the pilot seed.",
        "",
        "## The envelope at B and below (mean over seeds)",
        "",
        "| budget | " + " | ".join(env_sizes) + " | best |",
        "|---|" + "---|" * (len(env_sizes) + 1),
    ]
    for b, e in r["envelope"].items():
        cells = [f"{e['losses'][z]:.4f}" if z in e["losses"] else "-" for z in env_sizes]
        lines.append(f"| {float(b):g} B | " + " | ".join(cells) + f" | `{e['best_size']}` {e['loss']:.4f} |")
    lines += ["", "## Primary: each growth arm against the comparator at B", "",
              "Paired difference in final validation loss (arm - comparator, nats; negative = better), mean and 95% "
              "t-interval over seeds.", "",
              "| arm (stages) | growth at (x B) | LR | after growth | loss | delta vs envelope [95% CI] | beats it | "
              "saving vs envelope | saving vs same size |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for a in r["arms"]:
        same = pct(a["saving_vs_same_size_mean"])
        if a["saving_vs_same_size_n"] < a["n_seeds"]:
            same += (f" ({a['saving_vs_same_size_n']} of {a['n_seeds']} seeds inside the finished runs; the others "
                     "saved more than the longest run measures, so this understates the saving)")  # fmt: skip
        grown_at = ", ".join(f"{g:.3g}" for g in a["growth_at_B"])
        stages = " -> ".join(a["stages"])
        lines.append(
            f"| `{a['arm']}` ({stages}) | {grown_at} | {a['lr']:.1e} | {a['lr_policy']} | "
            f"{a['final_loss_mean']:.4f} | {fmt_delta(a)} | {'yes' if a['beats_envelope'] else 'no'} | "
            f"{pct(a['saving_vs_envelope_mean'])} | {same} |"
        )
    p = next(a for a in r["arms"] if a["arm"] == r["primary_arm"])
    verdict = ("beats the envelope: its interval lies below 0" if p["beats_envelope"] else
               f"does not beat the envelope: its interval's upper bound is {p['delta_vs_envelope_ci95_high']:+.4f} "
               "nats")  # fmt: skip
    lines += ["", f"**Verdict.** At B = {d['budget_C']:g} C the primary arm, `{p['arm']}` (the lowest pilot loss, "
              f"chosen before any main seed; {fmt_delta(p)} nats), {verdict}."]  # fmt: skip
    if r["n_seeds"] < 5:
        lines.append(f"Only {r['n_seeds']} seeds: too few for the claim, which needs at least 5.")
    if r["best_arm"] != r["primary_arm"]:
        b_ = next(a for a in r["arms"] if a["arm"] == r["best_arm"])
        lines.append(f"The arm with the lowest main mean is `{b_['arm']}` ({fmt_delta(b_)}); chosen after the fact, "
                     f"its interval is not adjusted for choosing among {len(r['arms'])} arms.")  # fmt: skip
    if r["comparator"] != r["target"]:
        lines.append(f"The comparator `{r['comparator']}` is not the target: at B the target is not the best size "
                     "on the map's pilot seed, so this is not growth into the compute-optimal size.")  # fmt: skip
    if r["envelope_at_B"]["size"] != r["comparator"]:
        lines.append(f"Over the main seeds the best size at B is `{r['envelope_at_B']['size']}` "
                     f"({r['envelope_at_B']['loss']:.4f}), not the comparator: the deltas are against the "
                     "comparator, chosen once from the map. Against that size (chosen after the fact on the same "
                     "seeds, which favours the envelope), each arm's paired difference [95% CI]: "
                     + "; ".join(f"`{a['arm']}` {a['delta_vs_best_size_at_B_mean']:+.4f} "
                                 f"[{a['delta_vs_best_size_at_B_ci95_low']:+.4f}, "
                                 f"{a['delta_vs_best_size_at_B_ci95_high']:+.4f}]" for a in r["arms"])
                     + ".")  # fmt: skip
    lines += ["", "Saving vs envelope: the compute the envelope needs for the arm's mean loss, interpolated in log "
              "FLOPs between its budgets (never extrapolated); n/a for an arm below the envelope's loss at B, whose "
              "saving the same-size column gives.", ""]  # fmt: skip
    flags = [f"`{a['arm']}`: {f}" for a in r["arms"] for f in a["growth_flags"]]
    if flags:
        lines += ["Growth points moved, or read outside the map's budgets:", *[f"- {f}" for f in flags], ""]
    lines += _refine_lines(r)
    lines += [f"## Pilot (seed {r['pilot_seed']})", "", "LR sweep at B (final loss per peak LR; arms with the LR "
              "continued after growth):", "", "| size / arm | LR: loss | best |", "|---|---|---|"]  # fmt: skip
    for who, sw in r["lr_sweep"].items():
        cells = ", ".join(f"{lr}: {v:.4f}" for lr, v in sw.items())
        lines.append(f"| `{who}` | {cells} | {r['lr_best'][who]:.1e} |")
    if r.get("lr_at_edge"):
        lines += ["", "Best LR at an end of the widened grid, so tuned only up to the grid (the sweep widens "
                  f"{s.lr_widen} times at most): "
                  + ", ".join(f"`{k}` ({r['lr_best'][k]:.1e}, the {v} tried)" for k, v in r["lr_at_edge"].items())
                  + ". A wider grid could only lower these pilot losses."]  # fmt: skip
        for lv in r["levers"]:
            if lv["lever"] in ("lr-x2", "lr-half"):
                lines[-1] += (f" One grid step past the end, `{lv['arm']}`'s pilot loss changes by {lv['effect']:+.4f} "
                              "nats (the LR lever below).")  # fmt: skip
    lines += ["", "| arm | LR continued | LR re-warmed | chosen |", "|---|---|---|---|"]
    for k, v in r["lr_policy"].items():
        lines.append(f"| `{k}` | {v['continue']:.4f} | {v['rewarm']:.4f} | {v['chosen']} |")
    if r["levers"]:
        lines += ["", f"## Levers (pilot seed, one run each; read against the comparator's seed s.d. "
                  f"{r['envelope_at_B']['comparator_seed_sd']:.4f})", "",
                  "| lever | loss | base loss | effect |", "|---|---|---|---|"]  # fmt: skip
        for lv in r["levers"]:
            lines.append(f"| {lv['what']} | {lv['loss']:.4f} | {lv['base_loss']:.4f} | {lv['effect']:+.4f} |")
        for tag in r["levers_skipped"]:
            lines.append(f"\nThe '{tag}' timing lever was not run: its growth points, kept within {LATE_MAX:g} B, "
                         "would not increase or would not move.")  # fmt: skip
    if r.get("levers_not_run"):
        lines += ["", f"Levers not run yet (they follow the main seeds; `--phase optimal` resumes them): "
                  f"{', '.join(r['levers_not_run'])}."]  # fmt: skip
    lines += ["", f"Run time (sum of the runs' wall-clock, {s.device}): pilot {r['wall_s_runs_total']['pilot']:.0f} s, "
              f"main {r['wall_s_runs_total']['main']:.0f} s.", ""]  # fmt: skip
    return "\n".join(lines)


def _refine_lines(r: Mapping[str, Any]) -> list[str]:
    """report.md's section on the sizes between the ladder's (results.json ``refine``); none without them."""
    rf = r.get("refine")
    if not rf:
        return []
    if not rf["sizes"]:
        why = "their geometric midpoints round onto the ladder"
        return ["## The envelope refined at B", "", f"No depth lies between the comparator's and its neighbours' "
                f"({why}): the refined envelope is the envelope.", ""]  # fmt: skip
    lines = ["## The envelope refined at B: sizes between the ladder's", "",
             "The ladder doubles the depth, so the best size a user could train at B may lie between two of its "
             "sizes. Each size at the geometric midpoint of the comparator's depth and a neighbour's, trained at B "
             "(LR swept on the pilot seed, then every main seed):", "",
             "| size (n_layer x n_embd) | parameters (without position embeddings) | LR sweep (pilot) | LR | loss at B "
             "(main mean) |",
             "|---|---|---|---|---|"]  # fmt: skip
    for z, v in rf["sizes"].items():
        sweep = ", ".join(f"{lr}: {x:.4f}" for lr, x in v["lr_sweep"].items()) or "-"
        loss = "-" if v["loss_at_B_mean"] is None else f"{v['loss_at_B_mean']:.4f}"
        lr = "-" if v["lr"] is None else f"{v['lr']:.1e}"
        lines.append(f"| `{z}` ({v['shape'][0]} x {v['shape'][1]}) | {v['n_params']:,} | {sweep} | {lr} | {loss} |")
    if not rf["complete"]:
        return lines + ["", f"Refine runs not run yet ({rf['runs_left']}; `--phase optimal` runs them after the "
                        "levers).", ""]  # fmt: skip
    p = rf["arms"][r["primary_arm"]]
    verdict = ("beats it: its interval lies below 0" if p["beats"] else
               f"does not beat it: its interval's upper bound is {p['delta_ci95_high']:+.4f} nats")  # fmt: skip
    lines += ["", f"The best size at B with these added is `{rf['best_size_at_B']}` ({rf['best_loss_at_B']:.4f}, "
              "the lowest mean over the main seeds: chosen after the fact, which favours the envelope). Each arm's "
              "paired difference against it [95% CI]: "
              + "; ".join(f"`{a}` {v['delta_mean']:+.4f} [{v['delta_ci95_low']:+.4f}, {v['delta_ci95_high']:+.4f}]"
                          for a, v in rf["arms"].items()) + ".", "",
              f"**Refined verdict.** Against the best size at B, between the ladder's sizes included, the primary "
              f"arm `{r['primary_arm']}` ({p['delta_mean']:+.4f} [{p['delta_ci95_low']:+.4f}, "
              f"{p['delta_ci95_high']:+.4f}] nats) {verdict}.", ""]  # fmt: skip
    return lines


def write(
    s: Settings,
    done: Mapping[str, dict],
    out: Path,
    note: Mapping[str, Any] | None = None,
    refined: Mapping[str, dict] | None = None,
) -> int:
    """Write results.json and report.md into ``out`` (atomically); 0, or 2 with a one-line reason on stderr.
    ``note``: how the target and B were chosen (``choice_note``); ``refined``: the refine runs' curves."""
    res = results_json(lambda s_, d_: summarize(s_, d_, note, refined), s, done, out)
    if res is None:
        return 2
    atomic.write_text(out / "report.md", markdown(s, res), overwrite=True)
    p = next(a for a in res["arms"] if a["arm"] == res["primary_arm"])
    print(f"growlm-experiment: report in {out / 'report.md'}; primary arm {p['arm']}: {fmt_delta(p)} nats vs "
          f"{res['comparator']} at {s.design['budget_C']:g} C")  # fmt: skip
    return 0
