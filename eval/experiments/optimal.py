"""The IsoFLOP experiment where the growth target is the compute-optimal size (``growlm-experiment --phase
optimal``): planning, the design read off the crossover map, and the report. Pure (no torch); the runs are the
envelope experiment's (eval.experiments.train_run).

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
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from growlm.eval.experiments import analysis as an
from growlm.eval.experiments import plan
from growlm.eval.experiments.protocol import DEPTH, Arm, RunSpec, Settings, run_steps
from growlm.eval.experiments.report import comparison_fields, results_json
from growlm.model.config import param_count
from growlm.runtime import atomic

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
    past = next((x for x in SAME_SIZE if _windows(s, target, x) <= 2 * tw), None)
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


def _windows(s: Settings, size: str, budget: float) -> int:
    return run_steps(s, RunSpec("main", "scratch", 0, budget, 0.0, size=size))[-1] * s.batch


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
                _mark_edge(st, z, lr, need)
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
            _mark_edge(st, a.name, lr, need)
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


def _mark_edge(st: State, who: str, lr: float, sweep: list[RunSpec]) -> None:
    """Record in ``st.lr_edge`` when ``who``'s best LR ``lr`` is the lowest or highest of its complete sweep."""
    swept = sorted(sp.lr for sp in sweep)
    for end, x in (("lowest", swept[0]), ("highest", swept[-1])) if len(swept) > 1 else ():
        if math.isclose(lr, x):
            st.lr_edge[who] = end


def max_train_windows(s: Settings) -> int:
    """The most training windows any run reads: the cheapest envelope size's at its largest budget (the target's
    past B included), and each arm at B (the cheapest first stage bounds it)."""
    d = s.design
    runs = [(z, max(ENVELOPE)) for z in d["envelope"]]
    if d["same_size_budget"]:
        runs.append((s.target, d["same_size_budget"]))
    w = max(_windows(s, z, b) for z, b in runs)
    return max(w, *(_windows(s, a.stages[0], 1.0) for a in s.arm_list()))


def epochs(s: Settings, sp: RunSpec) -> float:
    """Passes over the training data of a run: its steps x batch windows / the token folder's training windows."""
    return run_steps(s, sp)[-1] * s.batch / s.design["train_windows"]


# -------------------------------------------------------------------------------------------------------- report
def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(float(x), nd)


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
        sweep = {f"{sp.lr:.2e}": _r(v) for sp in specs if sp.size == z and sp.seed == s.pilot_seed
                 if (v := plan.final_loss(refined, sp)) is not None}  # fmt: skip
        lr = lrs.get(z)  # None until its sweep is complete
        got = [plan.final_loss(refined, RunSpec(REFINE, "scratch", k, 1.0, lr, size=z)) for k in seeds] if lr else []
        per_seed[z] = got if got and None not in got else None
        sizes[z] = {"shape": list(shape), "n_params": param_count(r_s.config(z), include_position_embeddings=False),
                    "lr": lr, "lr_sweep": dict(sorted(sweep.items(), key=lambda kv: float(kv[0]))),
                    "loss_at_B_mean": _r(statistics.fmean(per_seed[z])) if per_seed[z] else None}  # fmt: skip
    not_run = [sp.name for sp in specs if sp.name not in refined]
    out: dict[str, Any] = {"sizes": sizes, "runs_not_run": not_run,  # the current round's
                           "runs_left": len(not_run) + s.seeds * sum(z not in lrs for z in sizes),
                           "complete": all(per_seed.values())}  # fmt: skip
    if out["complete"]:
        cand = {**size_losses, **per_seed}
        best = min(cand, key=lambda z: statistics.fmean(cand[z]))
        out |= {"best_size_at_B": best, "best_loss_at_B": _r(statistics.fmean(cand[best])), "arms": {}}
        for a, la in arm_losses.items():
            m, lo, hi = an.mean_ci95([x - y for x, y in zip(la, cand[best], strict=True)])
            out["arms"][a] = {"delta_mean": _r(m), "delta_ci95_low": _r(lo), "delta_ci95_high": _r(hi),
                              "beats": hi is not None and hi < 0}  # fmt: skip
        out["epochs"] = {sp.name: float(f"{epochs(r_s, sp):.4g}") for sp in sorted(specs, key=lambda x: x.name)}
    return out


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

    def scratch(z: str, b: float, k: int) -> float | None:
        return plan.final_loss(done, RunSpec("main", "scratch", k, b, st.lr[z], size=z))

    def arm_spec(a: str, k: int) -> RunSpec:
        return RunSpec("main", "grow", k, 1.0, st.lr[a], arm=a, grow_flops=st.growth[a], policy=st.policy[a])

    means = {b: {z: statistics.fmean(v) for z in d["envelope"]
                 if (v := [x for k in seeds if (x := scratch(z, b, k)) is not None])} for b in bud}  # fmt: skip
    env = an.envelope({b: m for b, m in means.items() if b in ENVELOPE})
    env_points = [(b, loss) for b, (_, loss) in env.items()]
    comp = d["comparator"]
    comp_b = [scratch(comp, 1.0, k) for k in seeds]
    best_b = [scratch(env[1.0][0], 1.0, k) for k in seeds]  # the best size over the main seeds, chosen after the fact
    arms = []
    for a in s.arm_list():
        runs = [done[arm_spec(a.name, k).name]["curve"] for k in seeds]
        la = [c["final"]["val_loss"] for c in runs]
        need = an.compute_to_reach(env_points, statistics.fmean(la))
        deltas = [x - y for x, y in zip(la, comp_b, strict=True)]
        same = []
        for k, x in zip(seeds, la, strict=True):
            pts = [(b, v) for b in bud if (v := scratch(a.stages[-1], b, k)) is not None]
            same.append(an.saving(1.0, an.compute_to_reach(pts, x)))
        same_ok = [v for v in same if v is not None]
        bm, blo, bhi = an.mean_ci95([x - y for x, y in zip(la, best_b, strict=True)])
        arms.append({"arm": a.name, "what": a.what, "stages": list(a.stages), "final_size": a.stages[-1],
                     "n_seeds": len(seeds), "lr": st.lr[a.name], "lr_policy": st.policy[a.name],
                     "growth_at_B": [round(f / s.c_flops, 4) for f in st.growth[a.name]],
                     "growth_flags": st.growth_flags[a.name], "final_loss_mean": _r(statistics.fmean(la)),
                     **comparison_fields(deltas, need, same_ok),
                     "delta_vs_best_size_at_B_mean": _r(bm), "delta_vs_best_size_at_B_ci95_low": _r(blo),
                     "delta_vs_best_size_at_B_ci95_high": _r(bhi),
                     "loss_change_at_growth_mean": _r(statistics.fmean(statistics.fmean(
                         g["loss_after"] - g["loss_before"] for g in c["growth"]) for c in runs)),
                     "wall_s_mean": _r(statistics.fmean(c["wall_s"] for c in runs), 2)})  # fmt: skip
    scratch_out = []
    for z in d["envelope"]:
        lz = [scratch(z, 1.0, k) for k in seeds]
        m, lo, hi = an.mean_ci95([x - y for x, y in zip(lz, comp_b, strict=True)])
        scratch_out.append({"size": z, "shape": list(s.sizes[z]), "lr": st.lr[z],
                            "n_params": param_count(s.config(z), include_position_embeddings=False),
                            "loss_by_budget": {f"{b:g}": _r(means[b].get(z)) for b in bud},
                            "delta_vs_envelope_mean": _r(m), "delta_vs_envelope_ci95_low": _r(lo),
                            "delta_vs_envelope_ci95_high": _r(hi)})  # fmt: skip
    sweep: dict[str, dict[str, float]] = {}
    for rec in done.values():
        sp = rec["spec"]
        if sp.phase == "pilot" and sp.policy == "continue" and not sp.tag:
            sweep.setdefault(sp.size or sp.arm, {})[f"{sp.lr:.2e}"] = _r(rec["curve"]["final"]["val_loss"])
    sweep = {k: dict(sorted(v.items(), key=lambda kv: float(kv[0]))) for k, v in sorted(sweep.items())}
    policy = {}
    for a in s.arm_list():
        base = RunSpec("pilot", "grow", s.pilot_seed, 1.0, st.lr[a.name], arm=a.name, grow_flops=st.growth[a.name])
        policy[a.name] = {"continue": _r(plan.final_loss(done, base)),
                          "rewarm": _r(plan.final_loss(done, replace(base, policy="rewarm"))),
                          "chosen": st.policy[a.name]}  # fmt: skip
    levers, lever_runs = [], lever_specs(s, st)
    if st.main_complete:
        for sp in lever_runs:
            lv = plan.final_loss(done, sp)
            if lv is None:
                continue
            base = RunSpec("pilot", "grow", s.pilot_seed, 1.0, st.lr[sp.arm], arm=sp.arm, grow_flops=st.growth[sp.arm],
                           policy=st.policy[sp.arm])  # fmt: skip
            lb = plan.final_loss(done, base)
            levers.append({"lever": sp.tag, "arm": sp.arm, "what": lever_what(s, sp),
                           "growth_at_B": [round(f / s.c_flops, 4) for f in sp.grow_flops], "loss": _r(lv),
                           "base": base.name, "base_loss": _r(lb), "effect": _r(lv - lb)})  # fmt: skip
    best = min(arms, key=lambda x: x["delta_vs_envelope_mean"])
    primary = next(a for a in arms if a["arm"] == st.primary)
    refine = None
    data = next(iter(done.values()))["settings"].get("data")
    if other := [n for n, rec in sorted((refined or {}).items()) if rec["settings"].get("data") != data]:
        raise ValueError(f"the refine curve {other[0]} comes from another token folder than the experiment's curves; "
                         "move the refine/ folder away (a rerun trains its runs again)")  # fmt: skip
    if refined is not None and st.complete:
        arm_l = {a.name: [done[arm_spec(a.name, k).name]["curve"]["final"]["val_loss"] for k in seeds]
                 for a in s.arm_list()}  # fmt: skip
        refine = refine_summary(s, st, refined, seeds, arm_l, {z: [scratch(z, 1.0, k) for k in seeds]
                                                               for z in d["envelope"]})  # fmt: skip
    skipped = [t for t in TIMING if t not in {sp.tag for sp in lever_runs}] if st.main_complete else []
    not_run = [sp.tag for sp in lever_runs if plan.final_loss(done, sp) is None]
    ses = [rec["curve"]["final"]["val_se"] for rec in done.values() if rec["spec"].phase == "main"]
    return {
        "protocol": OPTIMAL_PROTOCOL, "settings": s.as_dict(),
        "data": data,
        "budget_flops": s.c_flops, "budget_C": d["budget_C"], "C_flops": d["map_c_flops"], "target": s.target,
        **(note or {}), "comparator": comp,
        "envelope": {f"{b:g}": {"budget_flops": b * s.c_flops, "best_size": z, "loss": _r(loss),
                                "losses": {k: _r(v) for k, v in means[b].items()}} for b, (z, loss) in env.items()},
        "envelope_at_B": {"size": env[1.0][0], "loss": _r(env[1.0][1]), "comparator_loss": _r(statistics.fmean(comp_b)),
                          "comparator_seed_sd": _r(statistics.stdev(comp_b), 5)},
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
        "eval_noise": {"final_windows": s.final_windows, "val_se_mean": _r(statistics.fmean(ses), 5)},
        "wall_s_runs_total": {ph: _r(sum(r["curve"]["wall_s"] for r in done.values() if r["spec"].phase == ph), 1)
                              for ph in ("pilot", "main")},
    }  # fmt: skip


def _fmt_delta(a: Mapping[str, Any]) -> str:
    return (f"{a['delta_vs_envelope_mean']:+.4f} [{a['delta_vs_envelope_ci95_low']:+.4f}, "
            f"{a['delta_vs_envelope_ci95_high']:+.4f}]")  # fmt: skip


def _pct(x: float | None) -> str:
    return "n/a (outside the finished runs)" if x is None else f"{100 * x:+.1f}%"


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
        f"every size and arm. Epochs over the training split per run: {min(ep.values()):.3g} to "
        f"{max(ep.values()):.3g} (every run in results.json `epochs`).",
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
        same = _pct(a["saving_vs_same_size_mean"])
        if a["saving_vs_same_size_n"] < a["n_seeds"]:
            same += (f" ({a['saving_vs_same_size_n']} of {a['n_seeds']} seeds inside the finished runs; the others "
                     "saved more than the longest run measures, so this understates the saving)")  # fmt: skip
        grown_at = ", ".join(f"{g:.3g}" for g in a["growth_at_B"])
        stages = " -> ".join(a["stages"])
        lines.append(
            f"| `{a['arm']}` ({stages}) | {grown_at} | {a['lr']:.1e} | {a['lr_policy']} | "
            f"{a['final_loss_mean']:.4f} | {_fmt_delta(a)} | {'yes' if a['beats_envelope'] else 'no'} | "
            f"{_pct(a['saving_vs_envelope_mean'])} | {same} |"
        )
    p = next(a for a in r["arms"] if a["arm"] == r["primary_arm"])
    verdict = ("beats the envelope: its interval lies below 0" if p["beats_envelope"] else
               f"does not beat the envelope: its interval's upper bound is {p['delta_vs_envelope_ci95_high']:+.4f} "
               "nats")  # fmt: skip
    lines += ["", f"**Verdict.** At B = {d['budget_C']:g} C the primary arm, `{p['arm']}` (the lowest pilot loss, "
              f"chosen before any main seed; {_fmt_delta(p)} nats), {verdict}."]  # fmt: skip
    if r["n_seeds"] < 5:
        lines.append(f"Only {r['n_seeds']} seeds: too few for the claim, which needs at least 5.")
    if r["best_arm"] != r["primary_arm"]:
        b_ = next(a for a in r["arms"] if a["arm"] == r["best_arm"])
        lines.append(f"The arm with the lowest main mean is `{b_['arm']}` ({_fmt_delta(b_)}); chosen after the fact, "
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
             "| size (n_layer x n_embd) | parameters | LR sweep (pilot) | LR | loss at B (main mean) |",
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
    print(f"growlm-experiment: report in {out / 'report.md'}; primary arm {p['arm']}: {_fmt_delta(p)} nats vs "
          f"{res['comparator']} at {s.design['budget_C']:g} C")  # fmt: skip
    return 0
