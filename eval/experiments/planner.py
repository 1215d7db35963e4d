"""The one planner of a spec-file experiment (eval.experiments.spec): which runs are needed now, given the runs
finished so far, and what those decided. Pure (no torch at import); every decision is a function of finished runs,
so a resumed experiment plans exactly what an uninterrupted one would.

The steps, in order (each waits for the one before):

1. **LR sweeps** (pilot seed, at B): each envelope shape without a tuned LR on a grid of the spec's factor around
   its muP-scaled centre (``mup_centre``), widened one factor step past an edge while the best sits there
   (``sweep``).
2. **Screen**: every shape at its LR on the screen seeds at B; the ``envelope.best`` shapes with the lowest mean
   loss are the best shapes.
3. **Best shapes** on every main seed at B; the one with the lowest mean is the optimum S*, fixed in the
   pre-registration before any arm runs.
4. **Arms' pilot** (pilot seed, at B), one choice at a time: the peak LR (the arm's factors times its target's LR,
   widened at an edge) at its first growth point with its first LR policy and rule; then its other growth points at
   that LR; then its other LR policies after growth; then, after a width growth, its other LR rules. An arm's pilot
   loss is the lowest of its runs; the primary arm, the one with the lowest pilot loss, is fixed in the
   pre-registration before its main runs.
5. **Main**: the primary arm (its chosen growth point, LR, policy and rule) on every main seed at B; then, per seed,
   the best shapes at the budgets their envelope needs to bracket the arm's loss (``next_budget``: below B when the
   arm is above the envelope at B, else past it), and S* alone likewise, for the saving against S*.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from growlm.eval.experiments.runs import Run, flops_per_step, max_windows, parse_shape, shape_name
from growlm.eval.experiments.spec import Spec, shape_config


class DesignError(ValueError):
    """The spec asks for something its shapes cannot give (an arm's start that is not a valid shape)."""


@dataclass(frozen=True)
class Context:
    """An experiment: its spec, and where its runs' FLOPs come from (B = ``spec.budget_flops``)."""

    spec: Spec

    @property
    def budget_flops(self) -> float:
        return self.spec.budget_flops


def sweep(
    loss: Callable[[Run], float | None], make: Callable[[float], Run], grid: list[float], factor: float, widen: int
) -> tuple[list[Run], float | None, str | None]:
    """An LR sweep: ``make(lr)`` at each LR of ``grid``, then one ``factor`` step past an edge while the best sits at
    that edge (``widen`` steps at most; a grid of one LR is not widened).

    Returns:
        (the runs it needs now, the best LR once they have all finished, 'lowest' | 'highest' when that best LR is
        still at an end of the widened grid, else None).
    """
    lrs = sorted(grid)
    while True:
        runs = [make(lr) for lr in lrs]
        got = {r.lr: loss(r) for r in runs}
        if any(v is None for v in got.values()):
            return runs, None, None
        best = min(got, key=lambda x: (got[x], x))
        edge = None if len(lrs) < 2 else "lowest" if best == lrs[0] else "highest" if best == lrs[-1] else None
        if edge is None or len(lrs) - len(grid) >= widen:
            return runs, best, edge
        lrs = [lrs[0] / factor, *lrs] if edge == "lowest" else [*lrs, lrs[-1] * factor]


def mup_centre(shape: tuple[int, int], tuned: dict[tuple[int, int], float], width: int | None = None) -> float:
    """The centre of a new shape's LR grid: the tuned LR of a reference shape times its width / the new shape's
    (Adam's hidden-matrix LR scales as 1 / width: Yang et al. 2021, "Tensor Programs V", arXiv 2203.03466, table 3).
    The reference: with ``width`` None, the tuned shape of its depth nearest in width (no shape of its depth: of the
    nearest depth; ties: the smaller); else the tuned shape of n_embd ``width`` nearest in depth (ties: the
    shallower).

    Raises:
        ValueError: no tuned shape (of that width).
    """
    if width is not None:
        tuned = {k: v for k, v in tuned.items() if k[1] == width}
    if not tuned:
        raise ValueError("no shape has a tuned LR to centre a new shape's sweep on; give one shape's lr in the spec"
                         + (f" (of n_embd {width})" if width else ""))  # fmt: skip
    ref = min(tuned, key=lambda k: (abs(k[0] - shape[0]), abs(k[1] - shape[1]), k))
    return tuned[ref] * ref[1] / shape[1]


def next_budget(arm: float, at: Callable[[float], float | None], below: tuple, past: tuple) -> float | None:
    """The next budget (x B) at which a reference must run on a seed so that its losses bracket the arm's loss
    ``arm`` there: below B (``below``, nearest first) when the arm is above the reference at B, else past B, until a
    budget's loss lies on the arm's other side (or equals it). ``at(b)``: the reference's loss at budget b on the
    seed, None until it has run there; known at B. None when bracketed or when the budgets run out."""
    above = arm > at(1.0)
    for b in below if above else past:
        e = at(b)
        if e is None:
            return b
        if (e >= arm) if above else (e <= arm):
            return None
    return None


@dataclass
class ArmState:
    """One arm's shapes and pilot: start and target shape names, its variants tried (run name -> loss) and the
    chosen run (the lowest pilot loss) once its pilot is complete."""

    start: str
    target: str
    target_lr: float
    lr_edge: str | None = None
    tried: dict[str, float] = field(default_factory=dict)
    chosen: Run | None = None
    pilot_loss: float | None = None


@dataclass
class State:
    """What the finished runs decided so far (None / empty: not yet)."""

    lr: dict[str, float] = field(default_factory=dict)  # shape name -> peak LR
    lr_swept: dict[str, dict[float, float]] = field(default_factory=dict)  # shape swept here -> {lr: pilot loss}
    lr_edge: dict[str, str] = field(default_factory=dict)  # shape -> 'lowest' | 'highest': its best LR at an end
    screen: dict[str, float] = field(default_factory=dict)  # shape -> mean loss at B over the screen seeds
    best: list[str] = field(default_factory=list)
    main_mean: dict[str, float] = field(default_factory=dict)  # best shape -> mean loss at B over the main seeds
    optimum: str | None = None
    arms: dict[str, ArmState] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # arm -> why it cannot grow into this S*
    primary: str | None = None
    complete: bool = False


def names(spec: Spec) -> dict[str, str]:
    """Envelope label -> shape name (D<n_layer>W<n_embd>)."""
    return {z: shape_name(v.shape) for z, v in spec.envelope.shapes.items()}


def resolve(expr: Any, optimum: str) -> tuple[int, int]:
    """(n_layer, n_embd) of an arm's start or target (spec.ShapeExpr) once S* (``optimum``) is known."""
    if not isinstance(expr, str):
        return tuple(expr)
    n_layer, n_embd = parse_shape(optimum)
    return {"optimum": (n_layer, n_embd), "optimum/depth": (n_layer // 2, n_embd),
            "optimum/width": (n_layer, n_embd // 2), "optimum/both": (n_layer // 2, n_embd // 2),
            "optimum*depth": (2 * n_layer, n_embd)}[expr]  # fmt: skip


def _arm_shapes(spec: Spec, arm: Any, optimum: str) -> tuple[str, str]:
    """(start, target) shape names of an arm once S* is known.

    Raises:
        DesignError: a shape that the spec's head rule cannot build (n_embd not a multiple of head_size, n_layer < 1),
            or a start that is not smaller than its target.
    """
    start, target = resolve(arm.start, optimum), resolve(arm.target, optimum)
    h = spec.model.head_size
    for z in (start, target):
        if z[0] < 1 or z[1] < h or z[1] % h:
            raise DesignError(f"an arm's shape {z[0]} x {z[1]} (S* = {optimum}) is not a shape of head size {h}; "
                              "choose another start or target")  # fmt: skip
    if start[0] > target[0] or start[1] > target[1] or start == target:
        raise DesignError(f"an arm grows {start[0]} x {start[1]} into {target[0]} x {target[1]}: the target must "
                          "be larger in n_layer or n_embd and smaller in neither")  # fmt: skip
    return shape_name(start), shape_name(target)


def plan(ctx: Context, loss: Callable[[Run], float | None]) -> tuple[list[Run], State]:
    """The runs needed now given the finished ones (``loss``: a run's final loss, None when not finished), and what
    they decided (the module docstring's steps).

    Raises:
        ValueError: no shape has a tuned LR to centre on. (An arm whose shapes S* does not allow is skipped, its
            reason in ``State.skipped``.)
    """
    spec, st, need = ctx.spec, State(), []
    sw, pilot, seeds = spec.sweep, spec.seeds.pilot, range(spec.seeds.main)
    shapes = names(spec)
    tuned = {v.shape: v.lr for v in spec.envelope.shapes.values() if v.lr is not None}
    for z, v in spec.envelope.shapes.items():
        if v.lr is not None:
            st.lr[shapes[z]] = v.lr
            continue
        c = mup_centre(v.shape, tuned, spec.envelope.lr_centre_width)
        runs, lr, edge = sweep(loss, lambda x, n=shapes[z]: Run("pilot", pilot, 1.0, x, (n,)),
                               [c / sw.factor, c, c * sw.factor], sw.factor, sw.widen)  # fmt: skip
        need += runs
        st.lr_swept[shapes[z]] = {r.lr: x for r in runs if (x := loss(r)) is not None}
        if lr is not None:
            st.lr[shapes[z]] = lr
            if edge:
                st.lr_edge[shapes[z]] = edge
    if len(st.lr) < len(shapes):
        return need, st

    def at(z: str, k: int, b: float = 1.0) -> float | None:
        return loss(scratch(z, k, b))

    def scratch(z: str, k: int, b: float = 1.0) -> Run:
        return Run("main" if b == 1.0 else "bracket", k, b, st.lr[z], (z,))

    screen = [scratch(z, k) for z in shapes.values() for k in spec.seeds.screen]
    need += screen
    if any(loss(r) is None for r in screen):
        return need, st
    st.screen = {z: statistics.fmean(at(z, k) for k in spec.seeds.screen) for z in shapes.values()}
    st.best = sorted(st.screen, key=lambda z: (st.screen[z], z))[: spec.envelope.best]
    main = [scratch(z, k) for z in st.best for k in seeds]
    need += main
    if any(loss(r) is None for r in main):
        return need, st
    st.main_mean = {z: statistics.fmean(at(z, k) for k in seeds) for z in st.best}
    st.optimum = min(st.best, key=lambda z: (st.main_mean[z], z))
    if not spec.arms:
        st.complete = True
        return need, st
    for a, arm in spec.arms.items():
        try:
            start, target = _arm_shapes(spec, arm, st.optimum)
        except DesignError as e:  # the others go on; the report says why this one did not run
            st.skipped[a] = str(e)
            continue
        if target in st.lr:
            t_lr = st.lr[target]
        else:  # a target outside the envelope: its LR centred as a new shape's
            t_lr = mup_centre(parse_shape(target), {parse_shape(z): x for z, x in st.lr.items()})
        st.arms[a] = _arm_pilot(ctx, a, arm, start, target, t_lr, loss, need)
    if not st.arms or any(x.chosen is None for x in st.arms.values()):
        st.complete = not st.arms
        return need, st
    st.primary = min(st.arms, key=lambda a: (st.arms[a].pilot_loss, a))
    chosen = st.arms[st.primary].chosen
    arm_runs = [_seeded(chosen, k) for k in seeds]
    need += arm_runs
    if any(loss(r) is None for r in arm_runs):
        return need, st
    done = True
    for k, r in zip(seeds, arm_runs, strict=True):
        la = loss(r)
        for group in (st.best, [st.optimum]):
            while (b := next_budget(la, lambda b, g=group, k=k: _lowest(at, g, k, b), spec.bracket.below,
                                    spec.bracket.past)) is not None:  # fmt: skip
                runs = [scratch(z, k, b) for z in group]
                need += runs
                if any(loss(x) is None for x in runs):
                    done = False
                    break
    st.complete = done
    return need, st


def _lowest(at: Callable, group: list[str], k: int, b: float) -> float | None:
    """The lowest loss among ``group``'s runs at budget b on seed k, None until every one of them has run there."""
    got = [at(z, k, b) for z in group]
    return None if any(x is None for x in got) else min(got)


def _seeded(run: Run, seed: int) -> Run:
    """``run`` (an arm's chosen pilot variant) as a main run on ``seed``."""
    d = run.as_dict() | {"phase": "main", "seed": seed}
    return Run.from_dict(d)


def _arm_pilot(ctx: Context, a: str, arm: Any, start: str, target: str, t_lr: float, loss: Callable,
               need: list[Run]) -> ArmState:  # fmt: skip
    """An arm's pilot (the module docstring, step 4), its runs appended to ``need``."""
    spec = ctx.spec
    st = ArmState(start, target, t_lr)
    pilot, stages = spec.seeds.pilot, (start, target)
    g0 = arm.growth_at[0]

    p0, r0 = arm.policies[0], arm.lr_rules[0]  # the LR is swept with the first policy and rule

    def run(lr: float, g: float = g0, policy: str = p0, rule: str = r0) -> Run:
        return Run("pilot", pilot, 1.0, lr, stages, (g,), a, policy, rule)

    runs, lr, st.lr_edge = sweep(loss, run, [t_lr * f for f in arm.lr_factors], spec.sweep.factor, spec.sweep.widen)
    need += runs
    if lr is None:
        return st
    got = {r.lr: loss(r) for r in runs}
    variants = {r.name: (r, got[r.lr]) for r in runs}
    steps = [("g", [g for g in arm.growth_at]), ("policy", list(arm.policies)), ("rule", list(arm.lr_rules))]
    cur = {"g": g0, "policy": p0, "rule": r0}
    for key, options in steps:
        if key == "rule" and parse_shape(start)[1] == parse_shape(target)[1]:
            continue  # the LR rule after growth only differs after a width growth
        options = [o for o in dict.fromkeys([cur[key], *options])]
        cand = [run(lr, **{**cur, key: o}) for o in options]
        need += cand
        vals = [loss(r) for r in cand]
        if any(v is None for v in vals):
            return st
        for r, v in zip(cand, vals, strict=True):
            variants[r.name] = (r, v)
        cur[key] = options[min(range(len(options)), key=lambda i: (vals[i], i))]
    st.tried = {n: v for n, (_, v) in variants.items()}
    st.chosen = run(lr, **cur)  # each step kept the best so far: the lowest pilot loss of every variant tried
    st.pilot_loss = variants[st.chosen.name][1]
    return st


def max_train_windows(ctx: Context) -> int:
    """The most training windows a planned scratch run reads: the cheapest envelope shape at the largest budget a
    bracket may reach (``runs.max_windows``). An arm's small first stage reads more per FLOP; a run that would read
    the data a third time fails with its own message."""

    spec, t = ctx.spec, ctx.spec.train
    b = max((1.0, *spec.bracket.past)) * ctx.budget_flops
    costs = [flops_per_step(shape_config(spec, v.shape), t.seq_len, t.batch) for v in spec.envelope.shapes.values()]
    return max_windows(((c, b) for c in costs), t.batch)
