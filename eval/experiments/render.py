"""report.md of a spec-file experiment, from its results.json content alone (eval.experiments.results), and the
pre-registration file: written before the first run, decisions appended as they are fixed, never rewritten."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from growlm.eval.experiments.analysis import p4, pct, pv
from growlm.runtime import atomic

PREREG = "preregistration.json"


def _ci_pct(c: dict[str, Any]) -> str:
    lo, hi = c["ci95"]
    return pct(c["mean"], "n/a") + ("" if lo is None else f" [{100 * lo:+.1f}%, {100 * hi:+.1f}%]")


def markdown(r: dict[str, Any]) -> str:
    """report.md from results.json's content ``r``."""
    lines = [f"# {r['question']}", "",
             f"Experiment `{r['experiment']}` ({r['protocol']}; family {r['family']}), produced by "
             f"`growlm-experiment` from the spec `{r['spec_file']}`; every number is computed from the curves "
             f"(`growlm-experiment --spec {r['spec_file']} --report_only` rebuilds this file and results.json)."
             + (" The decisions were fixed in `preregistration.json` before the runs that depend on them."
                if r["preregistered"] else " No pre-registration is beside it."), "",
             f"B = {r['budget_flops']:.4g} FLOPs; pilot seed {r['pilot_seed']}, screen seeds {r['screen_seeds']}, "
             f"main seeds 0-{r['main_seeds'] - 1}.", "",
             "## The envelope at B", "",
             "| shape | n_layer x n_embd (n_head) | parameters | LR | pilot sweep (LR: loss) | screen loss | main loss "
             "(seeds) | best |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for x in r["shapes"]:
        lr = "-" if x["lr"] is None else f"{x['lr']:.3g}" + (f" ({x['lr_at_edge']} of its grid)" if x["lr_at_edge"]
                                                              else "")  # fmt: skip
        sweep = ", ".join(f"{k}: {v:.4f}" for k, v in x["pilot_sweep"].items()) or (
            "tuned before (the spec's LR)" if x["lr_tuned_by"] == "spec" else "-"
        )
        main = f"{p4(x['main_loss'], '-')} ({x['main_seeds']})" if x["main_seeds"] else "-"
        lines.append(f"| `{x['label']}` | {x['n_layer']} x {x['n_embd']} ({x['n_head']}) | {x['n_params']:,} | {lr} | "
                     f"{sweep} | {p4(x['screen_loss'], '-')} | {main} | {'yes' if x['best'] else ''} |")  # fmt: skip
    if r["optimum"] is None:
        return "\n".join([*lines, "", "**Not finished**: the optimum S* is not known yet.", ""])
    edge = r["optimum_missing_neighbours"]
    name = f"{r['optimum']}`" if r["optimum_label"] == r["optimum"] else f"{r['optimum_label']}` ({r['optimum']})"
    lines += ["", f"**S\\* = `{name}**, the lowest mean loss at B over the main seeds "
              f"among the best shapes {', '.join(f'`{z}`' for z in r['best_shapes'])}."
              + (f" It sits at an edge of the band: {', '.join(edge)} are not in the envelope, and a shape past that "
                 "edge could be better still (favours the arm)." if edge else "")]  # fmt: skip
    if r["arms"]:
        lines += ["", "## The arms' pilot (pilot seed, at B)", "",
                  "| arm | start -> target | runs (loss) | pilot loss |", "|---|---|---|---|"]  # fmt: skip
        for a, x in r["arms"].items():
            tried = "; ".join(f"`{n}` {v:.4f}" for n, v in x["pilot"].items() if v is not None) or "-"
            lines.append(
                f"| `{a}`: {x['what']} | {x['start']} -> {x['target']} | {tried} | {p4(x['pilot_loss'], '-')} |"
            )
    for a, why in r["arms_skipped"].items():
        lines.append(f"\nArm `{a}` did not run: {why}.")
    p = r["primary"]
    if p is None or "delta_vs_target" not in p:
        return "\n".join([*lines, "", "**Not finished**: the primary comparison needs at least 2 main seeds.", ""])
    d, env, tgt = p["delta_vs_target"], p["saving_vs_envelope"], p["saving_vs_target"]
    lines += ["", f"## The primary arm `{p['arm']}` against S\\* and the envelope ({p['n_seeds']} seeds)", "",
              "| seed | arm loss | S* loss | delta | envelope (x B: loss) | saving vs envelope | saving vs S* |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for x in p["per_seed"]:
        e = ", ".join(f"{b}: {v:.4f}" for b, v in x["envelope"]["losses"].items())
        lines.append(f"| {x['seed']} | {x['arm_loss']:.4f} | {x['target_loss']:.4f} | {x['delta']:+.4f} | {e} | "
                     f"{pct(x['envelope']['saving'], 'n/a')} | {pct(x['target']['saving'], 'n/a')} |")  # fmt: skip
    out = "".join(f"; seed {k}: {w}" for ref in (env, tgt) for k, w in ref["outside"].items())
    lines += ["", f"- Loss against S\\* at B: {d['mean']:+.4f} nats, 95% t-interval [{d['ci95'][0]:+.4f}, "
              f"{d['ci95'][1]:+.4f}]; {p['n_negative']} of {p['n_seeds']} seeds below it; sign test p = "
              f"{pv(p['sign_test_p'])}, Wilcoxon signed-rank p = {pv(p['wilcoxon_p'])} (two-sided).",
              f"- Saving of compute against the envelope of the best shapes: {_ci_pct(env)} over {env['n']} seeds; "
              f"against S\\* alone: {_ci_pct(tgt)} over {tgt['n']} seeds{out}.", "",
              f"**Verdict.** The pre-registered goal (a saving of at least {100 * p['goal']:.0f}% against the "
              "envelope, its interval above 0, on every main seed) is " + ("met." if p["goal_met"] else "not met.")
              + ("" if r["complete"] else " Not complete: more runs are to come."), ""]  # fmt: skip
    ru = r["runs"]
    unread = (f" Kept, read by no step or comparison: {', '.join(f'`{n}`' for n in ru['unread_here'])}."
              if ru["unread_here"] else "")  # fmt: skip
    lines += [f"## Cost\nThis report reads {ru['read']} finished runs, {ru['trained_here']} of them trained into "
              f"this experiment's folder and the others by earlier experiments ({ru['wall_s_read'] / 3600:.1f} hours "
              "of run wall time in all). Where they ran: "
              + "; ".join(f"{m} ({n})" for m, n in ru["machines"].items())
              + ". Runs on different CPUs round differently, and a run at a high LR can then drift from its twin: a "
              "seed whose runs ran on two CPUs carries that noise in its pair." + unread, ""]  # fmt: skip
    return "\n".join(lines)


def spec_sha(path: Path) -> str:
    """sha256 of the spec file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def prereg_new(spec: Any, path: Path) -> dict[str, Any]:
    """The pre-registration of a spec: what it fixes before any run (the question, the comparisons, the goal, the
    spec's checksum), ``fixed`` decisions appended later, ``amendments`` appended by hand (each with date, when it
    was made, the change, why and which way it moves the result; and the new spec's ``spec_sha256``)."""
    return {"experiment": spec.name, "protocol": spec.protocol, "question": spec.question,
            "spec_sha256": spec_sha(path), "goal": spec.goal,
            "comparisons": ["the optimum S*: the lowest mean loss at B over the main seeds among the best shapes of "
                            "the screen, fixed before any arm runs",
                            "the primary arm: the lowest pilot loss, fixed before its main runs",
                            "per main seed: the primary arm's loss at B against S*'s (mean, 95% t-interval, sign "
                            "and Wilcoxon tests), and its saving of compute against the envelope of the best shapes "
                            "and against S* alone, read between bracketing budgets, never extrapolated"],
            "fixed": [], "amendments": []}  # fmt: skip


class PreregError(ValueError):
    """The pre-registration file disagrees with the spec or with what the curves decide."""


def prereg_check(pre: dict[str, Any], spec_path: Path, report_only: bool) -> None:
    """Raises PreregError when the spec file changed since the pre-registration (or its last amendment), or, unless
    only the report is rebuilt, when an earlier protocol wrote the pre-registration (it fixed its comparison in its
    own terms; the spec re-expresses that finished experiment, whose report it rebuilds, and runs nothing more)."""
    if "spec_sha256" not in pre:
        if report_only:
            return
        raise PreregError(f"{spec_path.parent / PREREG} was written by an earlier protocol: this finished experiment "
                          "is rebuilt with --report_only, and runs nothing more")  # fmt: skip
    want = ([a["spec_sha256"] for a in pre["amendments"] if "spec_sha256" in a] or [pre["spec_sha256"]])[-1]
    if spec_sha(spec_path) != want:
        raise PreregError(f"{spec_path} changed after its pre-registration; restore it, or append an amendment "
                          f"(date, made, change, why, spec_sha256) to {PREREG}")  # fmt: skip


def prereg_fix(where: Path, pre: dict[str, Any], what: str, value: Any, before: str) -> dict[str, Any]:
    """Append the decision ``what`` = ``value`` to the pre-registration (fixed before ``before``) unless it is
    there already; the file is read again first (an amendment appended by hand meanwhile is kept), and written
    atomically. Raises PreregError when it is fixed there with another value."""
    pre = read_json(where) if where.is_file() else pre
    have = {f["what"]: f["value"] for f in pre["fixed"]}
    if what in have:
        if have[what] != value:
            raise PreregError(f"{where} fixes {what} = {have[what]!r}, the curves now give {value!r}; restore the "
                              "curves, or append an amendment that says why")  # fmt: skip
        return pre
    made = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    pre = {**pre, "fixed": [*pre["fixed"], {"what": what, "value": value, "made": made, "before": before}]}
    atomic.write_json(where, pre, overwrite=True)
    return pre


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())
