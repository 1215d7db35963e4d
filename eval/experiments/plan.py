"""Which runs the IsoFLOP experiment needs, given the runs finished so far (pure; no torch).

Pilot (one seed, ``Settings.pilot_seed``), in rounds, each deciding from the finished runs of the ones before:
1. every scratch size at budget C over the LR grid, widened by a factor of 2 while the best LR sits at an edge;
2. every size at C/4 and C/2 at its best LR, and the sizes the arms grow between also at ``PROBE`` (2, 4, 8 C): the
   envelope points that give the crossover of each arm's two sizes;
3. every growth arm at C over the LR grid (LR policy 'continue', Adam moments carried), widened alike, each growth
   at the crossover budget of its two sizes (``growth_points``);
4. each arm at its best LR with the LR re-warmed after growth ('rewarm'), and the levers (``LEVERS``): depth-x2 and
   depth-1-2 grown earlier and later, and with Adam moments reset; width-x2 without symmetry breaking; depth-1-2 on
   the largest probe budget, grown at the measured L1->L2 crossover.
Main (``Settings.seeds`` seeds): every size at every budget at its pilot LR (2 C on the first ``budgets_2c_seeds``
seeds, and on every seed for the target and every arm's final size), every arm at C with its pilot LR and LR
policy, and the timing levers (``MAIN_LEVERS``), paired with their arms' runs. The comparator of the primary
metric is the size with the lowest pilot loss at C (chosen once, not per seed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from growlm.eval.experiments.analysis import best_lr, crossover
from growlm.eval.experiments.protocol import ARMS, Arm, RunSpec, Settings, arm, lr_grid_next, max_windows

GROW_MIN, GROW_MAX = 0.05, 0.75  # a growth point is kept within these fractions of the budget (flagged when moved)
PROBE = (2.0, 4.0, 8.0)  # pilot-seed budgets (x C) past C of the sizes the arms grow between: the crossovers
EARLY, LATEST = 0.5, 0.9  # the "early" and "latest" levers' growth points (x C); LATEST is past the GROW_MAX cap
BIG = PROBE[-1]  # the "big" lever's budget (x C)
LEVERS = {  # (arm, tag) -> what the lever changes
    ("depth-x2", "early"): f"depth-x2 grown at {EARLY:g} C",
    ("depth-x2", "latest"): f"depth-x2 grown at {LATEST:g} C (past the {GROW_MAX:g} C cap)",
    ("depth-x2", "reset"): "depth-x2 with Adam moments reset at growth",
    ("width-x2", "nosym"): "width-x2 without symmetry breaking (exact copies)",
    ("depth-1-2", "early"): f"depth-1-2 grown at {EARLY:g} C",
    ("depth-1-2", "latest"): f"depth-1-2 grown at {LATEST:g} C (past the {GROW_MAX:g} C cap)",
    ("depth-1-2", "reset"): "depth-1-2 with Adam moments reset at growth",
    ("depth-1-2", "big"): f"depth-1-2 on a budget of {BIG:g} C, grown at the L1->L2 crossover (kept within "
    f"[{GROW_MIN:g}, {GROW_MAX:g}] of that budget), against the best of the sizes probed at {BIG:g} C",
}
GROWN = frozenset(z for a in ARMS for z in a.stages)  # the sizes some arm grows from or to (probed past C)
MAIN_LEVERS = ("early", "latest")  # the timing levers that also run on every main seed (paired with the arm's runs)


class CurveMismatch(ValueError):
    """A finished curve has the name of a run the plan needs but another spec (e.g. another growth point)."""


def final_loss(done: Mapping[str, dict], spec: RunSpec) -> float | None:
    """The final validation loss of a finished run, None if it has not finished.

    Raises:
        CurveMismatch: the curve of that name was made for another spec (it is never read as this run's).
    """
    rec = done.get(spec.name)
    if rec is None:
        return None
    if not same_spec(rec["spec"], spec):
        diff = [k for k, v in spec.as_dict().items() if rec["spec"].as_dict().get(k) != v]
        raise CurveMismatch(f"the curve {spec.name} was made with another {', '.join(diff)} than this protocol's; "
                            "move it away (or use another --out) and rerun")  # fmt: skip
    return float(rec["curve"]["final"]["val_loss"])


def same_spec(a: RunSpec, b: RunSpec) -> bool:
    """Whether two specs name the same run: every field equal, growth points to 1e-9 relative (a crossover is
    interpolated through exp/log, which may differ in the last bit between machines)."""
    if replace(a, grow_flops=()) != replace(b, grow_flops=()) or len(a.grow_flops) != len(b.grow_flops):
        return False
    return all(math.isclose(x, y, rel_tol=1e-9) for x, y in zip(a.grow_flops, b.grow_flops, strict=True))


def check_finished(done: Mapping[str, dict], specs: list[RunSpec]) -> None:
    """Raise ``CurveMismatch`` when a finished curve has the name of one of ``specs`` but another spec (before any
    run starts, so that a stale curve is neither skipped into the results nor found only at the report)."""
    for sp in specs:
        final_loss(done, sp)


def lr_sweep(s: Settings, done: Mapping[str, dict], base: RunSpec) -> tuple[list[RunSpec], float | None]:
    """The LR sweep of one size or arm (``base`` with each LR of ``Settings.lrs``, widened by a factor of 2 while the
    best sits at an edge, ``lr_grid_next``): the specs it needs now and its best LR once it is complete."""
    specs = [replace(base, lr=lr) for lr in s.lrs]
    while True:
        losses = {sp.lr: final_loss(done, sp) for sp in specs}
        if any(v is None for v in losses.values()):
            return specs, None
        nxt = lr_grid_next(losses, s.lr_widen - (len(specs) - len(s.lrs)))
        if nxt is None:
            return specs, best_lr(losses)
        specs.append(replace(base, lr=nxt))


def mark_edge(lr_edge: dict[str, str], who: str, lr: float, sweep: list[RunSpec]) -> None:
    """Record in ``lr_edge`` when ``who``'s best LR ``lr`` is the lowest or highest of its complete sweep (the
    specs ``lr_sweep`` returned): 'lowest' or 'highest'."""
    swept = sorted(sp.lr for sp in sweep)
    for end, x in (("lowest", swept[0]), ("highest", swept[-1])) if len(swept) > 1 else ():
        if math.isclose(lr, x):
            lr_edge[who] = end


@dataclass
class PilotState:
    """What the finished pilot runs decided so far (None: not yet)."""

    lr: dict[str, float]  # size or arm -> best LR
    crossovers: dict[str, dict[str, Any]]  # "small->big" -> {budget, flag}
    growth: dict[str, tuple[float, ...]]  # arm -> growth points (FLOPs)
    growth_flags: dict[str, list[str]]
    policy: dict[str, str]  # arm -> 'continue' | 'rewarm'
    comparator: str | None
    complete: bool


def growth_points(s: Settings, a: Arm, cross: Mapping[str, dict], unit: str = "C") -> tuple[tuple, list[str]]:
    """The growth points of arm ``a`` (cumulative FLOPs): each growth at the crossover budget of its two
    sizes (``cross``: budgets in units of ``s.c_flops``, named ``unit`` in the flags), kept within [GROW_MIN,
    GROW_MAX] x ``s.c_flops`` and increasing; the flags name every point moved or read outside the measured budgets."""
    pts, flags = [], []
    for small, big in zip(a.stages, a.stages[1:], strict=False):
        c = cross[f"{small}->{big}"]
        f = c["budget"]
        if c["flag"]:
            flags.append(f"{small}->{big}: crossover {c['flag']} the measured budgets")
        g = min(max(f, GROW_MIN), GROW_MAX)
        if not math.isclose(g, f, rel_tol=1e-9):
            flags.append(f"{small}->{big}: growth moved from {f:.3g} {unit} to {g:.3g} {unit}")
        pts.append(g)
    for i in range(len(pts) - 2, -1, -1):  # keep increasing: an earlier growth goes to half of the next one
        if pts[i] >= pts[i + 1]:
            flags.append(
                f"growth {i + 1} moved from {pts[i]:.3g} {unit} to {pts[i + 1] / 2:.3g} {unit} (before the next)"
            )
            pts[i] = pts[i + 1] / 2
    return tuple(p * s.c_flops for p in pts), flags


def pilot(s: Settings, done: Mapping[str, dict]) -> tuple[list[RunSpec], PilotState]:
    """The pilot runs needed given the finished ones, and what they decided (see the module docstring)."""
    seed = s.pilot_seed
    specs: list[RunSpec] = []
    st = PilotState({}, {}, {}, {}, {}, None, False)
    for size in s.sizes:
        need, lr = lr_sweep(s, done, RunSpec("pilot", "scratch", seed, 1.0, 0.0, size=size))
        specs += need
        if lr is not None:
            st.lr[size] = lr
    if len(st.lr) < len(s.sizes):
        return specs, st
    st.comparator = min(s.sizes, key=lambda z: final_loss(done, RunSpec("pilot", "scratch", seed, 1.0, st.lr[z],
                                                                         size=z)))  # fmt: skip
    env: dict[str, dict[float, float]] = {}
    for size in s.sizes:
        budgets = (0.25, 0.5, 1.0, *(PROBE if size in GROWN else ()))
        runs = [RunSpec("pilot", "scratch", seed, b, st.lr[size], size=size) for b in budgets]
        specs += runs
        env[size] = {r.budget: final_loss(done, r) for r in runs}
    if any(v is None for e in env.values() for v in e.values()):
        return specs, st
    for a in ARMS:
        for small, big in zip(a.stages, a.stages[1:], strict=False):
            b, flag = crossover(env[small], env[big])
            st.crossovers[f"{small}->{big}"] = {"budget": b, "flag": flag}
    for a in ARMS:
        st.growth[a.name], st.growth_flags[a.name] = growth_points(s, a, st.crossovers)
        base = RunSpec("pilot", "grow", seed, 1.0, 0.0, arm=a.name, grow_flops=st.growth[a.name])
        need, lr = lr_sweep(s, done, base)
        specs += need
        if lr is not None:
            st.lr[a.name] = lr
    if any(a.name not in st.lr for a in ARMS):
        return specs, st
    finished = True
    for a in ARMS:
        cont = RunSpec("pilot", "grow", seed, 1.0, st.lr[a.name], arm=a.name, grow_flops=st.growth[a.name])
        rew = replace(cont, policy="rewarm")
        specs.append(rew)
        lc, lw = final_loss(done, cont), final_loss(done, rew)
        if lw is None:
            finished = False
        else:
            st.policy[a.name] = "rewarm" if lw < lc else "continue"
    specs += lever_specs(s, st)
    st.complete = finished and all(final_loss(done, sp) is not None for sp in specs)
    return specs, st


def lever_specs(s: Settings, st: PilotState) -> list[RunSpec]:
    """The lever runs (``LEVERS``), each at its arm's best LR with LR policy 'continue', in LEVERS' order."""
    out = []
    for arm_name, tag in LEVERS:
        a = arm(arm_name)
        base = RunSpec("pilot", "grow", s.pilot_seed, 1.0, st.lr[a.name], arm=a.name, grow_flops=st.growth[a.name],
                       tag=tag)  # fmt: skip
        if tag in ("early", "latest"):
            out.append(replace(base, grow_flops=((EARLY if tag == "early" else LATEST) * s.c_flops,)))
        elif tag == "reset":
            out.append(replace(base, moments="reset"))
        elif tag == "nosym":
            out.append(replace(base, symmetry="none"))
        elif tag == "big":
            out.append(replace(base, budget=BIG, grow_flops=(big_growth(st, a)[0] * s.c_flops,)))
        else:
            raise ValueError(f"lever {tag!r} has no rule")
    return out


def big_growth(st: PilotState, a: Arm) -> tuple[float, list[str]]:
    """The 'big' lever's growth point (x C): the crossover of the arm's two sizes, kept within [GROW_MIN, GROW_MAX]
    x BIG; with flags as ``growth_points`` gives them."""
    key = f"{a.stages[0]}->{a.stages[1]}"
    c, flags = st.crossovers[key], []
    if c["flag"]:
        flags.append(f"{key}: crossover {c['flag']} the measured budgets")
    g = min(max(c["budget"], GROW_MIN * BIG), GROW_MAX * BIG)
    if g != c["budget"]:
        flags.append(f"{key}: growth moved from {c['budget']:.3g} C to {g:.3g} C")
    return g, flags


def main_levers(s: Settings, st: PilotState, seed: int) -> list[RunSpec]:
    """The timing levers (``MAIN_LEVERS``) on main seed ``seed``: the pilot's lever specs with that seed."""
    return [replace(sp, phase="main", seed=seed, policy=st.policy[sp.arm]) for sp in lever_specs(s, st)
            if sp.tag in MAIN_LEVERS]  # fmt: skip


def max_train_windows(s: Settings) -> int:
    """The most training windows any run of the protocol reads (steps x batch): a scratch run of a size at its
    largest budget (``BIG`` for the sizes the arms grow between, else the largest of ``Settings.budgets``)."""
    return max_windows(s, ((z, BIG if z in GROWN else max(s.budgets)) for z in s.sizes))


def main_specs(s: Settings, st: PilotState) -> list[RunSpec]:
    """Every main run (needs a complete pilot)."""
    specs = []
    finals = {s.target} | {a.stages[-1] for a in ARMS}  # their same-size savings read 2 C on every seed
    for seed in range(s.seeds):
        for size in s.sizes:
            for b in s.budgets:
                if b == 2.0 and seed >= s.budgets_2c_seeds and size not in finals:
                    continue
                specs.append(RunSpec("main", "scratch", seed, b, st.lr[size], size=size))
        for a in ARMS:
            specs.append(RunSpec("main", "grow", seed, 1.0, st.lr[a.name], arm=a.name, grow_flops=st.growth[a.name],
                                 policy=st.policy[a.name]))  # fmt: skip
        specs += main_levers(s, st, seed)
    return specs
