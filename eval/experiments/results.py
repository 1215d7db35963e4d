"""results.json of a spec-file experiment, computed from its finished runs alone (``growlm-experiment SPEC
--report_only`` rebuilds it): the envelope's shapes and their LRs, the screen, the best shapes and S*, each arm's
pilot, and the primary comparison with its tests. Arithmetic in eval.experiments.analysis.

The primary comparison, per main seed k (paired: the same batches in the same order, the same initial draw):
- delta_k = L_arm(k) - L_S*(k) at B; its mean, 95% t-interval, sign test and Wilcoxon signed-rank test;
- saving_vs_envelope_k = 1 - B / C_k, C_k the compute at which the envelope of the best shapes on seed k (their
  lowest loss at each budget they ran at) reaches L_arm(k), log budget interpolated between the two budgets whose
  losses bracket it, never extrapolated (analysis.compute_to_reach; Shen et al. 2022, arXiv 2203.06211, section 4);
- saving_vs_target_k: the same against S* alone.
A seed whose budgets do not bracket the arm's loss has no saving; it is named under ``outside``.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from growlm.eval.experiments import analysis as an
from growlm.eval.experiments.analysis import ci, r4
from growlm.eval.experiments.planner import Context, State, names
from growlm.eval.experiments.runner import Store
from growlm.eval.experiments.runs import Run, parse_shape


def n_params(ctx: Context, z: str) -> int:
    """Parameters of a shape, without position embeddings (GPT-2's learned ones)."""
    from growlm.eval.experiments.spec import shape_config  # lazy: torch
    from growlm.model.config import param_count  # lazy: torch

    return param_count(shape_config(ctx.spec, parse_shape(z)), include_position_embeddings=False)


def missing_neighbours(ctx: Context, z: str) -> list[str]:
    """The shapes next to ``z`` (one layer more or fewer; the next width of the envelope's widths up or down, or a
    head size past its widest or narrowest) that the envelope lacks: a best shape with such a neighbour sits at an
    edge of the band, and a shape past it could be better still."""
    have = {tuple(v.shape) for v in ctx.spec.envelope.shapes.values()}
    widths = sorted({w for _, w in have})
    n_layer, n_embd = parse_shape(z)
    i = widths.index(n_embd)
    h = ctx.spec.model.head_size
    up = widths[i + 1] if i + 1 < len(widths) else n_embd + h
    down = widths[i - 1] if i else n_embd - h
    cand = [(n_layer - 1, n_embd), (n_layer + 1, n_embd), (n_layer, down), (n_layer, up)]
    return [f"{d} x {w}" for d, w in cand if d >= 1 and w >= h and (d, w) not in have]


def summarize(ctx: Context, store: Store, st: State, fixed: dict[str, Any] | None, spec_file: str) -> dict[str, Any]:
    """results.json's content (the module docstring). ``st``: the planner's state over ``store``; ``fixed``: the
    pre-registration's fixed decisions, which the report names beside the computed ones (None: no pre-registration
    beside the curves); ``spec_file``: the spec's file name (the report says how to rebuild it)."""
    spec = ctx.spec
    label = {v: z for z, v in names(spec).items()}
    seeds = list(range(spec.seeds.main))

    def at(z: str, k: int, b: float = 1.0, mark: bool = True) -> float | None:
        return store.loss(Run("main" if b == 1.0 else "bracket", k, b, st.lr[z], (z,)), mark)

    shapes = []
    for z, n in names(spec).items():
        main = [x for k in seeds if (x := at(n, k)) is not None] if n in st.lr else []
        shapes.append({"label": z, "shape": n, "n_layer": parse_shape(n)[0], "n_embd": parse_shape(n)[1],
                       "n_head": parse_shape(n)[1] // spec.model.head_size, "n_params": n_params(ctx, n),
                       "lr": st.lr.get(n), "lr_tuned_by": "spec" if spec.envelope.shapes[z].lr else "sweep",
                       "lr_at_edge": st.lr_edge.get(n),
                       "pilot_sweep": {f"{lr:.3e}": r4(x) for lr, x in sorted(st.lr_swept.get(n, {}).items())},
                       "screen_loss": r4(st.screen.get(n)), "main_seeds": len(main),
                       "main_loss": r4(statistics.fmean(main)) if main else None, "best": n in st.best})  # fmt: skip
    res: dict[str, Any] = {
        "experiment": spec.name, "spec_file": spec_file, "protocol": spec.protocol, "question": spec.question,
        "family": spec.model.family, "budget_flops": spec.budget_flops, "pilot_seed": spec.seeds.pilot,
        "screen_seeds": list(spec.seeds.screen), "main_seeds": spec.seeds.main,
        "envelope_shapes": [{"n_layer": x["n_layer"], "n_embd": x["n_embd"], "n_head": x["n_head"]} for x in shapes],
        "shapes": shapes, "best_shapes": st.best, "optimum": st.optimum,
        "optimum_label": label.get(st.optimum), "preregistered": fixed is not None, "fixed": fixed or {},
        "optimum_missing_neighbours": missing_neighbours(ctx, st.optimum) if st.optimum else [],
        "arms": {a: {"start": x.start, "target": x.target, "target_lr": x.target_lr, "lr_at_edge": x.lr_edge,
                     "pilot": {n: r4(v) for n, v in sorted(x.tried.items())}, "pilot_loss": r4(x.pilot_loss),
                     "chosen": x.chosen.as_dict() if x.chosen else None, "what": spec.arms[a].what}
                 for a, x in st.arms.items()},
        "arms_skipped": st.skipped, "primary_arm": st.primary, "complete": st.complete,
        "primary": None,
    }  # fmt: skip
    if st.primary is not None:
        res["primary"] = _primary(ctx, store, st, at)
    res["runs"] = _runs(store)
    return res


def _runs(store: Store) -> dict[str, Any]:
    """What the report read: the finished runs its decisions and comparisons looked up (trained here or by an
    earlier experiment), their wall time and machines; and the curves in this experiment's folder that nothing read
    (a run of an earlier plan, kept), by file name."""
    read = list(store.read.values())
    here = [*store.own.values(), *store.own_earlier]
    ids, done = {id(r) for r in here}, {id(r) for r in read}
    unread = sorted(r["spec"].name for r in here if id(r) not in done)
    return {"read": len(read), "trained_here": sum(id(r) in ids for r in read), "imported": store.imported,
            "wall_s_read": r4(sum(r["curve"]["wall_s"] for r in read), 1),
            "machines": dict(sorted(Counter(r["curve"].get("machine") or "unknown" for r in read).items())),
            "unread_here": unread}  # fmt: skip


def _primary(ctx: Context, store: Store, st: State, at: Any) -> dict[str, Any] | None:
    """The primary arm against S* and the envelope, over the main seeds whose arm run has finished."""
    spec = ctx.spec
    arm = st.arms[st.primary]
    budgets = sorted({*spec.bracket.below, 1.0, *spec.bracket.past})
    rows, deltas, sv_env, sv_tgt = [], [], [], []
    outside: dict[str, dict[str, str]] = {"envelope": {}, "target": {}}
    for k in range(spec.seeds.main):
        run = Run.from_dict(arm.chosen.as_dict() | {"phase": "main", "seed": k})
        la, lt = store.loss(run), at(st.optimum, k)
        if la is None or lt is None:
            continue
        row = {"seed": k, "arm_loss": r4(la, 5), "target_loss": r4(lt, 5), "delta": r4(la - lt, 5),
               "machine": store.get(run)["curve"].get("machine")}  # fmt: skip
        for ref, group, out in (("envelope", st.best, sv_env), ("target", [st.optimum], sv_tgt)):
            ran = [b for b in budgets if all(at(z, k, b, False) is not None for z in group)]  # whole budgets only
            pts = [(b, min(at(z, k, b) for z in group)) for b in ran]
            need = an.compute_to_reach(pts, la)
            sv = an.saving(1.0, need)
            if sv is None:
                lo, hi = pts[0], pts[-1]
                outside[ref][str(k)] = (f"above the {ref} at {lo[0]:g} B" if la > lo[1] else
                                        f"below the {ref} at {hi[0]:g} B")  # fmt: skip
            else:
                out.append(sv)
            row[ref] = {"losses": {f"{b:g}": r4(x, 5) for b, x in pts}, "compute_to_reach_B": r4(need),
                        "saving": r4(sv)}  # fmt: skip
        deltas.append(la - lt)
        rows.append(row)
    if len(rows) < 2:
        return {"arm": st.primary, "per_seed": rows, "n_seeds": len(rows)}

    def saving(values: list[float], ref: str) -> dict[str, Any]:
        base = ci(values) if len(values) else {"mean": None, "ci95": [None, None]}
        return {**base, "n": len(values), "outside": outside[ref]}

    env = saving(sv_env, "envelope")
    goal = (env["mean"] is not None and not env["outside"] and env["n"] == spec.seeds.main
            and env["mean"] >= spec.goal and (env["ci95"][0] or 0) > 0)  # fmt: skip
    return {"arm": st.primary, "run": arm.chosen.as_dict(), "n_seeds": len(rows), "per_seed": rows,
            "final_loss_mean": r4(statistics.fmean(r["arm_loss"] for r in rows)),
            "target_loss_mean": r4(statistics.fmean(r["target_loss"] for r in rows)),
            "delta_vs_target": ci(deltas), "n_negative": sum(d < 0 for d in deltas),
            "sign_test_p": r4(an.sign_test_p(deltas), 5), "wilcoxon_p": r4(an.wilcoxon_p(deltas), 5),
            "saving_vs_envelope": env, "saving_vs_target": saving(sv_tgt, "target"), "goal": spec.goal,
            "goal_met": goal}  # fmt: skip
