"""The IsoFLOP experiment where the growth target is the compute-optimal size (``growlm-experiment --phase
optimal``): planning and the design read off the crossover map (its report: eval.experiments.optimal_report).
Pure (no torch); the runs are the envelope experiment's (eval.experiments.train_run).

Why (DESIGN.md, "Does growth pay"): a grown model can only beat the best scratch model at a budget where its target
is that best model. The crossover map (eval.experiments.crossmap) measures, for every size, the budget where it
overtakes the next smaller one, and chooses the main budget B and the target by rule (``crossmap.choose_target``).
This experiment runs there:

- **Settings** (``design``): C_opt = B x C FLOPs; the envelope's sizes are the target and its neighbours on the
  depth ladder, each at 0.25, 0.5 and 1 B (``ENVELOPE``); the target also past B (the largest of ``SAME_SIZE``
  that reads the data at most twice), so that the saving against the same size reads off finished runs.
- **Arms**, generated for the target: depth x2 from the next smaller depth (function-preserving duplication), the
  multi-stage path through every size the map found optimal on the way (when there is more than one), G_stack-style
  stacking from the smallest depth (Du et al. 2024, arXiv 2405.15319), width x2 with symmetry-breaking noise from
  the half-width size of the same depth, MSG masked depth growth (Yao et al. 2023, arXiv 2305.02869).
- **Growth points**: each growth at the map's crossover of its two sizes (in units of B, kept within
  [``plan.GROW_MIN``, ``plan.GROW_MAX``] of B and increasing, ``plan.growth_points``), never at probe runs of this
  experiment. A pair the map did not measure (the half-width size) grows where the target's depth pair crosses,
  flagged in the report.
- **Pilot** (the pilot seed): every envelope size's LR is the map's, tuned at B on the same seed, when the map tuned
  at B (else swept here around the map's nearest tuned LR); every arm's LR is swept at B on a factor-2 grid centred
  on the target's LR (widened at an edge), then each arm at its best LR with the LR re-warmed after growth.
- **Main** (``Settings.seeds`` fresh seeds): the envelope and every arm, paired by seed (the same batches).
- **Levers** (pilot seed, after the main runs): on the arm with the lowest pilot loss, growth at half and at twice
  its growth points, Adam moments reset, the LR re-warmed (the pilot's policy runs), and, where its pilot sweep's
  best LR sits at an end of the widened grid, the LR one grid step past that end; on the width arm the
  symmetry-breaking noise at a quarter and four times its scale and none.

- **Refine** (after the levers; its own settings and sub-folder ``refine/``, so the runs above stay valid): the
  ladder's sizes double in depth, so the best size a user could train at B may lie between two of them. For the
  comparator and each of its neighbours in the envelope, the depth at their geometric midpoint (rounded, when it
  is a new depth; same width and heads) is trained at B: its LR swept on the pilot seed from one neighbour's LR to
  the other's (``between_lrs``, widened at an edge), then on every main seed. The report gives each arm's paired
  difference against the best size at B with these added (chosen after the fact on the main seeds, which favours
  the envelope).

Primary metric (as in eval.experiments.report): the paired difference between an arm's final validation loss at B
and the comparator's, the comparator being the envelope size with the lowest map loss at B on the pilot seed
(chosen once); mean and 95% t-interval over the main seeds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from growlm.eval.experiments import analysis as an
from growlm.eval.experiments import plan
from growlm.eval.experiments.protocol import DEPTH, Arm, RunSpec, Settings, max_windows, run_steps

OPTIMAL_PROTOCOL = "isoflop-optimal-v1"  # bump when a change makes old curves incomparable
ENVELOPE = (0.25, 0.5, 1.0)  # the envelope's budgets, x B
SAME_SIZE = (2.0, 1.5, 1.25)  # the target's budget past B: the largest whose run reads the data at most twice
STACK = {"family": "duplicate", "layer_order": "stack", "exact": False}
WIDTH = {"family": "duplicate", "pattern": "split", "alpha": 0.75, "symmetry": "noise", "noise_std": 1.0}
MASKED = {"family": "masked"}
TIMING = {"early": 0.5, "late": 2.0}  # the timing levers: each growth point times this (then kept inside the run)
LATE_MAX = 0.9  # the latest a timing lever grows (x B)
NOISE = {"noise0.25": 0.25, "noise4": 4.0}  # the symmetry levers of the width arm: noise_std times this


class DesignError(ValueError):
    """The crossover map does not allow the experiment (no target, a target without a smaller size, a budget the
    map did not measure)."""


def design(base: Settings, r: Mapping[str, Any], target: str | None = None, budget: float | None = None) -> Settings:
    """The experiment's settings from a complete crossover map (map.json's content ``r``; ``crossmap.summarize``).

    Args:
        base: the profile the map ran with (its family, C, batch, seeds, LR grid).
        r: map.json's content (its ladders, losses, LRs, crossovers and choice).
        target, budget: override the map's choice (``r["choice"]``) of the target size and B (x C, a budget the
            map measured); None takes the map's.

    Returns:
        Settings with c_flops = B x C, the envelope's sizes plus the arms' sources, budgets ``ENVELOPE`` plus the
        target's budget past B, the arms (``arms_for``), the protocol ``OPTIMAL_PROTOCOL`` and ``design``: what
        decides the runs (B, the target, the envelope's sizes, the comparator, the map's crossovers in units of B,
        the map's LRs tuned at B, the centres of the LR sweeps run here, the token folder's training windows) and
        nothing descriptive, so that a map whose report is only reworded keeps its curves.

    Raises:
        DesignError: the map was made with another profile (C, pilot seed, a size's shape); it chose no target and
            none was given; the target has no smaller size on the depth ladder; B is not a budget of the map.
    """
    ch = r["choice"]
    bad = [z for z, v in r["sizes"].items() if tuple(base.sizes.get(z, ())) != tuple(v["shape"])]
    if bad or r["c_flops"] != base.c_flops or r["pilot_seed"] != base.pilot_seed:
        why = f"sizes {bad}" if bad else "C" if r["c_flops"] != base.c_flops else "pilot seed"
        raise DesignError(f"the map was made with another profile ({why} differ from the {base.profile} profile's); "
                          "give the map of this profile (--map, --profile, --quick)")  # fmt: skip
    target = target or ch["target"]
    b = float(budget if budget is not None else (ch["budget"] or 0.0))
    if target is None:
        raise DesignError(f"the crossover map chose no target ({ch['why']}); give --target and --budget")
    ladder = list(r["ladders"].get("depth", ()))
    if target not in ladder or ladder.index(target) == 0:
        raise DesignError(f"--target {target}: needs a smaller size on the map's depth ladder {ladder}; choose one "
                          f"of {ladder[1:]}")  # fmt: skip
    if f"{b:g}" not in r["envelope"]:
        raise DesignError(f"--budget {b:g}: the map measured budgets {[f'{x:g}' for x in r['budgets']]} (x C); "
                          "choose one of them")  # fmt: skip
    i = ladder.index(target)
    envelope = ladder[max(0, i - 1) : i + 2]
    loss_at_b = {z: r["sizes"][z]["points"][f"{b:g}"]["loss"] for z in envelope}
    comparator = min(loss_at_b, key=loss_at_b.get)
    sizes = {z: tuple(base.sizes[z]) for z in ladder}
    arms, half = arms_for(base, ladder, target, b, r)
    if half not in sizes:
        sizes[half] = half_width(base.sizes[target])
    used = {z for a in arms for z in a.stages} | set(envelope)
    sizes = {z: v for z, v in sizes.items() if z in used}
    cross = {}
    for a in arms:
        for x, y in zip(a.stages, a.stages[1:], strict=False):
            cross[f"{x}->{y}"] = _map_crossover(r, x, y, b, f"{ladder[i - 1]}->{target}")
    lr_from_map = {z: r["sizes"][z]["lr"][f"{b:g}"] for z in envelope if f"{b:g}" in r["sizes"][z]["lr"]}
    sweep_centre = {z: _nearest_lr(r["sizes"][z]["lr"], b) for z in envelope if z not in lr_from_map}
    t_lr = lr_from_map.get(target, _nearest_lr(r["sizes"][target]["lr"], b))
    s = replace(base, c_flops=b * r["c_flops"], sizes=sizes, target=target, budgets=ENVELOPE, budgets_2c_seeds=0,
                lrs=(t_lr / 2, t_lr, t_lr * 2), arms=arms, protocol=OPTIMAL_PROTOCOL)  # fmt: skip
    tw = int(r["train_windows"])
    past = next((x for x in SAME_SIZE if max_windows(s, [(target, x)]) <= 2 * tw), None)
    d = {"map_protocol": r["protocol"], "map_c_flops": r["c_flops"], "budget_C": b, "target": target,
         "envelope": envelope, "comparator": comparator, "same_size_budget": past, "crossovers": cross,
         "lr_from_map": lr_from_map, "lr_sweep_centre": sweep_centre, "train_windows": tw}  # fmt: skip
    budgets = ENVELOPE + ((past,) if past else ())
    return replace(s, budgets=budgets, design=d)


def choice_note(s: Settings, r: Mapping[str, Any]) -> dict[str, Any]:
    """How the target and B were chosen, for the report (not part of the settings): by the map's rule when they
    are the map's choice, else by flags; with the map's reasoning."""
    ch = r["choice"]
    ours = (ch["target"], ch["budget"]) == (s.target, s.design["budget_C"])
    return {"chosen_by": "the map's rule (crossmap.choose_target)" if ours else "flags (--target, --budget)",
            "map_choice": ch}  # fmt: skip


def _map_crossover(r: Mapping[str, Any], x: str, y: str, b: float, stand_in: str) -> dict[str, Any]:
    """The crossover of sizes x -> y in units of B: the map's own record of the pair; else computed from the map's
    pilot-seed losses of both sizes (``analysis.crossover``); else, for a size the map did not run, the crossover of
    the pair ``stand_in``, marked as such."""
    if f"{x}->{y}" in r["crossovers"]:
        c = r["crossovers"][f"{x}->{y}"]
        return {"budget": c["budget"] / b, "flag": c["flag"]}
    if x in r["sizes"] and y in r["sizes"]:
        pts = {z: {float(k): p["loss"] for k, p in r["sizes"][z]["points"].items()} for z in (x, y)}
        budget, flag = an.crossover(pts[x], pts[y])
        return {"budget": budget / b, "flag": flag}
    return dict(_map_crossover(r, *stand_in.split("->"), b, stand_in), stand_in=stand_in)


def _nearest_lr(lrs: Mapping[str, float], b: float) -> float:
    """The LR the map tuned at the budget nearest to ``b`` (x C) in log FLOPs (ties to the smaller)."""
    k = min(lrs, key=lambda x: (abs(math.log(float(x) / b)), float(x)))
    return float(lrs[k])


def half_width(shape) -> tuple[int, int, int]:
    """(n_layer, n_embd, n_head) of the half-width size of ``shape``: the same depth, half the width and heads."""
    n_layer, n_embd, n_head = shape
    return (n_layer, n_embd // 2, max(1, n_head // 2))


def arms_for(base: Settings, ladder: list[str], target: str, b: float, r: Mapping[str, Any]) -> tuple:
    """The growth arms into ``target`` (the module docstring's list) and the name of the half-width size.

    The multi-stage path is the depth ladder's sizes below the target that the map found best at some budget up to
    B (pilot seed), then the target; it is an arm only with at least two growths. G_stack stacks the smallest depth
    of the ladder up to the target's depth when that is a whole multiple (at least 2)."""
    i = ladder.index(target)
    prev = ladder[i - 1]
    n = {z: base.sizes[z][0] for z in ladder}
    arms = [Arm("depth-x2", (prev, target), (DEPTH,),
                f"depth x2, {n[prev]} -> {n[target]} layers: each block duplicated next to itself, the copy's output "
                "projections zeroed (function preserved)")]  # fmt: skip
    best = {e["size"] for x, e in r["envelope"].items() if float(x) <= b}
    path = [z for z in ladder[:i] if z in best] + [target]
    if len(path) >= 3:
        arms.append(Arm("multi-" + "-".join(str(n[z]) for z in path), tuple(path), (DEPTH,) * (len(path) - 1),
                        f"depth {' -> '.join(str(n[z]) for z in path)} layers: through every size the map found "
                        "optimal on the way, each grown at its crossover"))  # fmt: skip
    k = n[target] // n[ladder[0]]
    if k >= 2 and n[target] % n[ladder[0]] == 0:
        arms.append(Arm(f"gstack-x{k}", (ladder[0], target), (STACK,),
                        f"G_stack-style stacking x{k} (Du et al. 2024, arXiv 2405.15319): the whole "
                        f"{n[ladder[0]]}-layer stack repeated, copies exact (function not preserved)"))  # fmt: skip
    shape = half_width(base.sizes[target])
    half = next((z for z, v in base.sizes.items() if tuple(v) == shape), f"{target}n")
    arms.append(Arm("width-x2", (half, target), (WIDTH,),
                    f"width x2, {shape[0]} x {shape[1]} -> {shape[0]} x {2 * shape[1]} (heads {shape[2]} -> "
                    f"{base.sizes[target][2]}): neurons split 0.75 / 0.25 plus zero-sum noise that breaks the "
                    "copies' symmetry and keeps the function"))  # fmt: skip
    arms.append(Arm("msg-depth", (prev, target), (MASKED,),
                    f"MSG masked depth growth {n[prev]} -> {n[target]} (Yao et al. 2023, arXiv 2305.02869): new "
                    "blocks gated by a mask ramped 0 -> 1 over a quarter of the remaining run"))  # fmt: skip
    return tuple(arms), half


# ---------------------------------------------------------------------------------------------------------- plan
@dataclass
class State:
    """What the finished runs decided so far."""

    lr: dict[str, float]  # size or arm -> peak LR
    growth: dict[str, tuple[float, ...]]  # arm -> growth points (FLOPs)
    growth_flags: dict[str, list[str]]
    policy: dict[str, str]  # arm -> 'continue' | 'rewarm'
    primary: str | None  # the arm with the lowest pilot loss: the primary arm (chosen before any main seed), levers
    lr_edge: dict[str, str]  # size or arm swept here -> 'highest' | 'lowest': its best LR at that end of its sweep
    pilot_complete: bool
    main_complete: bool
    complete: bool


def growth_of(s: Settings) -> tuple[dict[str, tuple], dict[str, list[str]]]:
    """Each arm's growth points (FLOPs) and flags from the map's crossovers (``plan.growth_points``), with a flag
    for a pair the map did not measure."""
    cross = s.design["crossovers"]
    growth, flags = {}, {}
    for a in s.arm_list():
        growth[a.name], flags[a.name] = plan.growth_points(s, a, cross, unit="B")
        for x, y in zip(a.stages, a.stages[1:], strict=False):
            if "stand_in" in cross[f"{x}->{y}"]:
                flags[a.name].insert(0, f"{x}->{y}: not measured by the map; grown where "
                                        f"{cross[f'{x}->{y}']['stand_in']} crosses")  # fmt: skip
    return growth, flags


def main_specs(s: Settings, st: State) -> list[RunSpec]:
    """Every main run: the envelope on every seed (the target also past B), every arm at B."""
    d = s.design
    specs = []
    for seed in range(s.seeds):
        for z in d["envelope"]:
            for b in ENVELOPE + ((d["same_size_budget"],) if z == s.target and d["same_size_budget"] else ()):
                specs.append(RunSpec("main", "scratch", seed, b, st.lr[z], size=z))
        for a in s.arm_list():
            specs.append(RunSpec("main", "grow", seed, 1.0, st.lr[a.name], arm=a.name, grow_flops=st.growth[a.name],
                                 policy=st.policy[a.name]))  # fmt: skip
    return specs


def lever_specs(s: Settings, st: State) -> list[RunSpec]:
    """The levers (pilot seed; the module docstring): timing and moments on the best pilot arm, the noise scale
    of the width arm."""
    a = st.primary
    base = RunSpec("pilot", "grow", s.pilot_seed, 1.0, st.lr[a], arm=a, grow_flops=st.growth[a], policy=st.policy[a])
    out = []
    for tag, f in TIMING.items():
        pts = [min(g * f, LATE_MAX * s.c_flops) for g in st.growth[a]]
        if all(x < y for x, y in zip(pts, pts[1:], strict=False)) and pts != list(st.growth[a]):
            out.append(replace(base, grow_flops=tuple(pts), tag=tag))
    out.append(replace(base, moments="reset", tag="reset"))
    if a in st.lr_edge:  # tuned only up to its grid: one step past the end where its best sits
        up = st.lr_edge[a] == "highest"
        out.append(replace(base, lr=st.lr[a] * (2 if up else 0.5), tag="lr-x2" if up else "lr-half"))
    w = "width-x2"
    wbase = RunSpec("pilot", "grow", s.pilot_seed, 1.0, st.lr[w], arm=w, grow_flops=st.growth[w], policy=st.policy[w])
    out.append(replace(wbase, symmetry="none", tag="nosym"))
    for tag, f in NOISE.items():
        out.append(replace(wbase, symmetry=f"noise:{f * WIDTH['noise_std']:g}", tag=tag))
    return out


def lever_what(s: Settings, sp: RunSpec) -> str:
    """One line on what a lever run changes."""
    if sp.tag in TIMING:
        return f"{sp.arm} grown at {', '.join(f'{g / s.c_flops:.3g}' for g in sp.grow_flops)} B ({sp.tag})"
    if sp.tag == "reset":
        return f"{sp.arm} with Adam moments reset at growth"
    if sp.tag in ("lr-x2", "lr-half"):
        return f"{sp.arm} at peak LR {sp.lr:.1e}, one grid step past its best ({sp.tag[3:]}; the sweep's end)"
    if sp.tag == "nosym":
        return f"{sp.arm} without symmetry breaking (exact copies)"
    return f"{sp.arm} with symmetry-breaking noise s.d. {sp.symmetry.split(':')[1]} (default {WIDTH['noise_std']:g})"


def experiment_plan(s: Settings, done: Mapping[str, dict]) -> tuple[list[RunSpec], State]:
    """The runs needed now given the finished ones (pilot, then main, then levers), and what they decided.

    Raises:
        plan.CurveMismatch: a finished curve has a needed run's name but another spec.
    """
    d = s.design
    seed = s.pilot_seed
    growth, flags = growth_of(s)
    st = State(dict(d["lr_from_map"]), growth, flags, {}, None, {}, False, False, False)
    specs: list[RunSpec] = []
    for z in d["envelope"]:
        if z not in st.lr:
            lr0 = d["lr_sweep_centre"][z]
            need, lr = plan.lr_sweep(replace(s, lrs=(lr0 / 2, lr0, lr0 * 2)), done,
                                     RunSpec("pilot", "scratch", seed, 1.0, 0.0, size=z))  # fmt: skip
            specs += need
            if lr is not None:
                st.lr[z] = lr
                plan.mark_edge(st.lr_edge, z, lr, need)
    if s.target not in st.lr:
        return specs, st
    t_lr = st.lr[s.target]
    grid = replace(s, lrs=(t_lr / 2, t_lr, t_lr * 2))  # the arms' sweep, centred on the target's LR at B
    for a in s.arm_list():
        base = RunSpec("pilot", "grow", seed, 1.0, 0.0, arm=a.name, grow_flops=growth[a.name])
        need, lr = plan.lr_sweep(grid, done, base)
        specs += need
        if lr is not None:
            st.lr[a.name] = lr
            plan.mark_edge(st.lr_edge, a.name, lr, need)
    if any(z not in st.lr for z in [*d["envelope"], *(a.name for a in s.arm_list())]):
        return specs, st
    pilot_loss = {}
    for a in s.arm_list():
        cont = RunSpec("pilot", "grow", seed, 1.0, st.lr[a.name], arm=a.name, grow_flops=growth[a.name])
        rew = replace(cont, policy="rewarm")
        specs.append(rew)
        lc, lw = plan.final_loss(done, cont), plan.final_loss(done, rew)
        if lw is not None:
            st.policy[a.name] = "rewarm" if lw < lc else "continue"
            pilot_loss[a.name] = min(lc, lw)
    if len(st.policy) < len(s.arm_list()):
        return specs, st
    st.pilot_complete = True
    st.primary = min(pilot_loss, key=pilot_loss.get)
    main = main_specs(s, st)
    specs += main
    if any(plan.final_loss(done, sp) is None for sp in main):
        return specs, st
    st.main_complete = True
    levers = lever_specs(s, st)
    specs += levers
    st.complete = all(plan.final_loss(done, sp) is not None for sp in levers)
    return specs, st


REFINE = "refine"  # the phase, and the sub-folder of the output folder, of the runs between the ladder's sizes


def between_sizes(s: Settings) -> dict[str, tuple[int, int, int]]:
    """The sizes the refine runs add (the module docstring): for the comparator and each of its neighbours on the
    envelope's depth ladder, the depth round(sqrt(d_comparator x d_neighbour)) when no envelope size has it, at the
    comparator's width and heads; named ``L<depth>``. {} when every midpoint depth is on the ladder already."""
    env, comp = s.design["envelope"], s.design["comparator"]
    i = env.index(comp)
    have = {s.sizes[z][0] for z in env}
    out = {}
    for j in (i - 1, i + 1):
        if 0 <= j < len(env):
            depth = round(math.sqrt(s.sizes[comp][0] * s.sizes[env[j]][0]))
            if depth not in have:
                out[f"L{depth}"] = (depth, *s.sizes[comp][1:])
    return out


def between_lrs(a: float, b: float) -> tuple[float, ...]:
    """A between size's LR grid (peak LRs, ascending) from its two neighbours' peak LRs ``a`` and ``b`` (> 0): the
    factor-2 steps from the smaller to the larger, with their geometric mean added when they are one step apart (so
    that a value between them is tried); a factor-2 grid around them when they are equal."""
    lo, hi = sorted((a, b))
    n = round(math.log2(hi / lo))
    if n == 0:
        return (lo / 2, lo, lo * 2)
    if n == 1:
        return (lo, math.sqrt(lo * hi), hi)
    return tuple(lo * 2**k for k in range(n + 1))


def refine_settings(s: Settings) -> Settings:
    """The refine runs' settings: the experiment's with the between sizes added (``design["refine"]``: their
    names); stored in their curves, so they never mix with the experiment's own.

    Raises:
        DesignError: a between size's name ``L<depth>`` is taken in the profile by a size of another shape.
    """
    extra = between_sizes(s)
    clash = [z for z, v in extra.items() if z in s.sizes and tuple(s.sizes[z]) != v]
    if clash:
        raise DesignError(f"the refine sizes {clash} are named like sizes of another shape in the profile; rename "
                          "those sizes")  # fmt: skip
    return replace(s, sizes={**s.sizes, **extra}, design={**s.design, "refine": sorted(extra)})


def refine_plan(s: Settings, st: State, done: Mapping[str, dict]) -> tuple[list[RunSpec], dict[str, float]]:
    """The refine runs needed now given the finished ones (``done``: the refine curves), and the LR each between
    size's pilot sweep chose: each size's sweep on the pilot seed (the LRs of the comparator and of the neighbour
    it lies towards, ``between_lrs``; widened at an edge, ``plan.lr_sweep``), then the size at its best LR on every
    main seed. ``s``: the experiment's settings; ``st``: its complete state.

    Raises:
        plan.CurveMismatch: a refine curve has a needed run's name but another spec.
    """
    env, comp = s.design["envelope"], s.design["comparator"]
    i = env.index(comp)
    specs, lrs = [], {}
    for z, shape in between_sizes(s).items():
        side = env[i + 1] if shape[0] > s.sizes[comp][0] else env[i - 1]  # the neighbour it lies towards
        grid = between_lrs(st.lr[comp], st.lr[side])
        base = RunSpec(REFINE, "scratch", s.pilot_seed, 1.0, 0.0, size=z)
        need, lr = plan.lr_sweep(replace(s, lrs=grid), done, base)
        specs += need
        if lr is not None:
            lrs[z] = lr
            specs += [replace(base, seed=k, lr=lr) for k in range(s.seeds)]
    return specs, lrs


def max_train_windows(s: Settings) -> int:
    """The most training windows any run reads: the cheapest envelope size's at its largest budget (the target's
    past B included), and each arm at B (the cheapest first stage bounds it)."""
    d = s.design
    runs = [(z, max(ENVELOPE)) for z in d["envelope"]] + [(a.stages[0], 1.0) for a in s.arm_list()]
    return max_windows(s, runs + ([(s.target, d["same_size_budget"])] if d["same_size_budget"] else []))


def epochs(s: Settings, sp: RunSpec) -> float:
    """Passes over the training data of a run: its steps x batch windows / the token folder's training windows."""
    return run_steps(s, sp)[-1] * s.batch / s.design["train_windows"]


# -------------------------------------------------------------------------------------------------------- report
