"""The wide envelope at B (``growlm-experiment --phase optimal``, after the refine runs; sub-folder ``wide/``): every
shape a user could reasonably train at the experiment's budget B, not only the depth ladder's, so that a growth arm
is compared with the best model that could have been trained instead. Pure (no torch).

Why: the depth ladder holds one width. At B the loss is flat over a range of parameter counts, so shapes of other
widths could be better than the ladder's best by the margin a growth arm wins by.

- **Shapes** (``wide_shapes``): every (n_layer, n_embd) with n_layer in 1 .. 2 x the comparator's depth and n_embd
  in ``WIDTH_FACTORS`` x the comparator's width (rounded to a multiple of its head size), whose parameter count
  (without position embeddings) lies within a factor ``PARAM_FACTOR`` of the comparator's; n_head = n_embd / the
  comparator's head size (one head size for every shape). A shape the ladder or the refine runs already trained
  keeps its name and its runs; the others are named ``D<n_layer>W<n_embd>``.
- **Pilot** (the pilot seed, at B): each new shape's LR swept on a factor-2 grid centred on ``centre_lr`` (the LR
  of the trained size of the nearest depth at the comparator's width, times comparator width / n_embd: Adam's
  hidden-matrix LR scales as 1 / width, Yang et al. 2021, "Tensor Programs V", arXiv 2203.03466, table 3), widened
  while the best sits at an edge (``plan.lr_sweep``).
- **Screen**: each new shape at its LR on the main seeds ``SCREEN_SEEDS`` (the ladder's sizes have every main seed).
- **Best shapes**: the ``N_BEST`` shapes with the lowest mean final loss at B over ``SCREEN_SEEDS`` run on every
  main seed (``n_seeds``) at B, and the primary arm runs on the main seeds the experiment did not have. Then, per
  seed, the best shapes run at the budgets their envelope needs to bracket the arm's loss there (``next_budget``):
  ``BELOW_B`` when the arm is above the envelope at B, else ``PAST_B``, nearest budget first and no further than
  needed (a run the experiment or the refine runs already made is not repeated).

The comparison itself is fixed in advance by the pre-registration file the phase writes before any of its runs
(``preregistration``); a change made after that is appended to it as an amendment (``AMENDMENTS``), with when and
why, and the original text stays as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from growlm.eval.experiments import optimal, plan, planner
from growlm.eval.experiments.protocol import RunSpec, Settings, max_windows
from growlm.model.config import param_count

WIDE = "wide"  # the phase, and the sub-folder of the output folder, of the wide envelope's runs
WIDTH_FACTORS = (0.75, 1.0, 1.25, 1.5, 2.0)  # the shapes' widths, x the comparator's
PARAM_FACTOR = 2.25  # a shape's parameters within this factor of the comparator's (either way)
SCREEN_SEEDS = (0, 1)  # the main seeds every new shape runs on before the best ones are chosen
N_BEST = 3  # the shapes (best mean loss at B over the screen seeds) that run on every main seed
PAST_B = (1.25, 1.5, 2.0)  # the budgets past B (x B) of the best shapes, nearest first (a seed whose arm is below B's)
BELOW_B = (0.75, 0.5)  # the budgets below B, nearest first (a seed whose arm is above the envelope's loss at B)
BUDGETS = tuple(sorted((*BELOW_B, 1.0, *PAST_B)))  # every budget a best shape may run at (x B)
AMENDMENTS = (
    {
        "date": "2026-12-07",
        "made": "after the screen (every shape on main seeds 0 and 1, which chose the best shapes), prompted by "
                "the arm's losing to each best shape at B on both of those seeds, and before any other main seed's "
                "run of the best shapes or of the arm had finished; one run of the first plan past B had (1 x 128 "
                "at 2 B on seed 0, final loss 2.369): it is kept, and no comparison reads it",
        "change": "per main seed, the best shapes run at B and then, nearest budget first and only as far as their "
                  f"envelope needs to bracket the arm's loss on that seed, at {list(BELOW_B)} x B when the arm's "
                  f"loss is above the envelope's at B, else at {list(PAST_B)} x B; the saving is read off those "
                  "budgets by the same interpolation, and a seed they do not bracket is counted apart as before",
        "why": "on both screen seeds the arm's final loss at B was above each of the best three shapes': the compute "
               "the envelope needs to reach it lies below B, where the plan had no run, so the saving would have "
               "been 'none' on such seeds while the runs past B (142.5 B of the 171.5 B the main phase planned) "
               "could not bracket it. Which way it moves the result: under the first plan a seed whose arm lost at "
               "B was left out of the mean saving, which then averaged only the seeds the arm won; now it enters as "
               "a negative saving, which counts against the arm. Below B the best shapes keep the LR tuned at B, "
               "which can only raise their loss there and so favours the arm",
    },
    {
        "date": "2026-12-07",
        "made": "after every run had finished, on a review of this record; it changes nothing in the plan or the "
                "analysis",
        "change": "a correction of the first amendment's 'made': the arm's main seeds 0-4 are the experiment's own "
                  "runs, finished before the wide runs started, so when the plan was amended the arm's losses at B "
                  "were known on seeds 2, 3 and 4 as well (2.4736, 2.4817, 2.4657), where no best shape had run; "
                  "what had not finished was any run of the best shapes on seeds 2-9 and the arm's runs on the new "
                  "seeds 5-9",
        "why": "the record must say what was known when the plan changed. Which way it could move the result: the "
               "amended rule reads, per seed, only on which side of the envelope at B the arm lies, which no run "
               "known then showed for seeds 2-9",
    },
)  # fmt: skip
SEED_FACTOR = 2  # main seeds of the primary comparison: this times the experiment's (10 for its 5)


def next_budget(arm: float, envelope: Callable[[float], float | None]) -> float | None:
    """The next budget at which the best shapes must run on a seed so that their envelope brackets the arm's loss
    there: away from B towards the arm's loss (``BELOW_B`` when the arm is above the envelope at B, else
    ``PAST_B``), nearest first, until a budget's envelope loss lies on the arm's other side (or equals it).

    Args:
        arm: the arm's final loss at B on the seed (nats).
        envelope: budget (x B) -> the best shapes' lowest final loss at that budget on the seed, None until every
            best shape has run there; known at B.

    Returns:
        the budget (x B) to run next, or None when the envelope brackets the arm's loss or the budgets run out.
    """
    return planner.next_budget(arm, envelope, BELOW_B, PAST_B)


def n_seeds(s: Settings) -> int:
    """The main seeds of the wide envelope's comparison: ``SEED_FACTOR`` times the experiment's."""
    return SEED_FACTOR * s.seeds


def n_params(shape: tuple[int, int, int], s: Settings) -> int:
    """Parameters of a shape (n_layer, n_embd, n_head) under the experiment's vocabulary, without position
    embeddings (the count the report gives)."""
    probe = replace(s, sizes={"x": tuple(shape)})
    return param_count(probe.config("x"), include_position_embeddings=False)


def wide_shapes(s: Settings, known: Mapping[str, tuple[int, int, int]]) -> dict[str, tuple[int, int, int]]:
    """The wide envelope's shapes (the module docstring's rule), by name, ordered by (n_layer, n_embd).

    Args:
        s: the experiment's settings (its design's comparator and sizes).
        known: the sizes trained already (the ladder's and the refine runs'): a shape among them keeps its name.

    Returns:
        name -> (n_layer, n_embd, n_head) for every shape in the band, the comparator included.
    """
    comp = s.design["comparator"]
    depth, width, heads = s.sizes[comp]
    head = width // heads
    budget = n_params(s.sizes[comp], s)
    names = {tuple(v): z for z, v in known.items()}
    out = {}
    for n_layer in range(1, 2 * depth + 1):
        for f in WIDTH_FACTORS:
            n_embd = max(head, round(f * width / head) * head)
            shape = (n_layer, n_embd, n_embd // head)
            if 1 / PARAM_FACTOR <= n_params(shape, s) / budget <= PARAM_FACTOR:
                out[names.get(shape, f"D{n_layer}W{n_embd}")] = shape
    return out


def missing_neighbours(
    shape: tuple[int, int, int], s: Settings, shapes: Mapping[str, tuple[int, int, int]]
) -> list[str]:
    """The shapes next to ``shape`` on the rule's grid (one layer more or fewer, the next width factor up or down)
    that are not in the envelope ``shapes``, each as 'n_layer x n_embd (why)': a best shape with such a neighbour
    sits at an edge of the envelope, and a shape past that edge could be better still.

    Args:
        shape: (n_layer, n_embd, n_head), one of ``shapes``.
        s: the experiment's settings (its comparator's width and head size).
        shapes: the envelope's shapes (``wide_shapes``).
    """
    _, width, heads = s.sizes[s.design["comparator"]]
    head = width // heads
    widths = sorted({max(head, round(f * width / head) * head) for f in WIDTH_FACTORS})
    have = {(v[0], v[1]) for v in shapes.values()}
    n_layer, n_embd, _ = shape
    i = widths.index(n_embd)
    out = []
    below = widths[i - 1] if i else None
    above = widths[i + 1] if i + 1 < len(widths) else None
    steps = ((n_layer - 1, n_embd, ""), (n_layer + 1, n_embd, ""), (n_layer, below, "narrower than the width grid"),
             (n_layer, above, "wider than the width grid"))  # fmt: skip
    for d, w, past in steps:
        if w is None:
            out.append(past)
        elif d >= 1 and (d, w) not in have:
            out.append(f"{d} x {w} (outside the " + ("depth range)" if d > 2 * s.sizes[s.design["comparator"]][0]
                                                       else "parameter band)"))  # fmt: skip
    return out


def centre_lr(shape: tuple[int, int, int], comp_width: int, lrs: Mapping[tuple[int, int, int], float]) -> float:
    """The centre of a new shape's LR grid (the module docstring): the tuned LR of the trained size at the
    comparator's width whose depth is nearest (ties: the shallower), times comparator width / the shape's width.

    Args:
        shape: (n_layer, n_embd, n_head).
        comp_width: the comparator's n_embd.
        lrs: tuned peak LR of each trained size, by shape.

    Raises:
        ValueError: no trained size has the comparator's width.
    """
    same = {k[0]: v for k, v in lrs.items() if k[1] == comp_width}
    if not same:
        raise ValueError(f"no trained size is {comp_width} wide")
    d = min(same, key=lambda x: (abs(x - shape[0]), x))
    return same[d] * comp_width / shape[1]


def wide_settings(s: Settings, known: Mapping[str, tuple[int, int, int]]) -> Settings:
    """The wide runs' settings: the experiment's with the new shapes added (``design["wide"]``: every shape's name
    and the rule's constants); stored in their curves, so they never mix with the experiment's own.

    Raises:
        ValueError: a new shape's name is taken in the profile by a size of another shape.
    """
    shapes = wide_shapes(s, known)
    new = {z: v for z, v in shapes.items() if z not in known}
    clash = [z for z, v in new.items() if z in s.sizes and tuple(s.sizes[z]) != v]
    if clash:
        raise ValueError(f"the wide shapes {clash} are named like sizes of another shape in the profile")
    rule = {"shapes": list(shapes), "width_factors": list(WIDTH_FACTORS), "param_factor": PARAM_FACTOR,
            "screen_seeds": list(SCREEN_SEEDS)}  # fmt: skip
    return replace(s, sizes={**s.sizes, **known, **new}, design={**s.design, "wide": rule})


@dataclass
class WideState:
    """What the finished wide runs decided so far."""

    shapes: dict[str, tuple[int, int, int]]  # every shape of the wide envelope
    new: list[str]  # the shapes this phase trains (not trained by the ladder or the refine runs)
    lr: dict[str, float]  # shape -> peak LR (the trained sizes' from their own sweeps)
    lr_edge: dict[str, str]  # new shape -> 'highest' | 'lowest': its best LR at that end of its widened sweep
    pilot_complete: bool
    screen_complete: bool
    screen_loss: dict[str, float] = field(default_factory=dict)  # shape -> mean final loss at B over SCREEN_SEEDS
    best: list[str] = field(default_factory=list)  # the N_BEST shapes, best first (once the screen is complete)
    complete: bool = False


KnownLoss = Callable[[str, int, float], "float | None"]  # (trained size, seed, budget x B) -> its run's final loss


@dataclass(frozen=True)
class Inputs:
    """What the wide envelope takes from the experiment and its refine runs (``inputs``)."""

    known: dict[str, tuple[int, int, int]]  # the trained sizes' shapes (the ladder's and the refine runs'), by name
    known_lr: dict[str, float]  # their tuned peak LRs, by name
    known_loss: KnownLoss  # a trained size's final loss on a main seed at a budget (x B), None when not run
    primary: RunSpec  # the primary arm's main run on seed 0
    arm_loss: Callable[[int], float | None]  # the primary arm's final loss at B on an experiment's main seed
    arm_machine: Callable[[int], str | None] = lambda k: None  # the CPU or GPU that ran it (its curve's machine)


def inputs(s: Settings, st: optimal.State, done: Mapping[str, dict], refined: Mapping[str, dict]) -> Inputs:
    """The wide envelope's inputs from the experiment's finished runs (``done``, its complete state ``st``) and
    the refine runs' (``refined``).

    Raises:
        plan.CurveMismatch: a needed refine curve has another spec.
    """
    _, r_lrs = optimal.refine_plan(s, st, refined)
    r_s = optimal.refine_settings(s)
    known = {z: tuple(s.sizes[z]) for z in s.design["envelope"]} | {z: tuple(r_s.sizes[z]) for z in r_lrs}
    known_lr = {z: st.lr[z] for z in s.design["envelope"]} | r_lrs

    def known_loss(z: str, k: int, b: float) -> float | None:
        if z in r_lrs:
            return plan.final_loss(refined, RunSpec(optimal.REFINE, "scratch", k, b, r_lrs[z], size=z))
        return plan.final_loss(done, RunSpec("main", "scratch", k, b, st.lr[z], size=z))

    a = st.primary
    primary = RunSpec("main", "grow", 0, 1.0, st.lr[a], arm=a, grow_flops=st.growth[a], policy=st.policy[a])
    return Inputs(known, known_lr, known_loss, primary, lambda k: plan.final_loss(done, replace(primary, seed=k)),
                  lambda k: machine(done, replace(primary, seed=k)))  # fmt: skip


def machine(done: Mapping[str, dict], spec: RunSpec) -> str | None:
    """The machine (``curve["machine"]``: CPU or GPU, cores) a finished run ran on; None when not run."""
    rec = done.get(spec.name)
    return None if rec is None else rec["curve"].get("machine")


def wide_plan(
    s: Settings,
    known_lr: Mapping[str, float],
    known: Mapping[str, tuple[int, int, int]],
    done: Mapping[str, dict],
    known_loss: KnownLoss | None = None,
    primary: RunSpec | None = None,
    arm_loss: Callable[[int], float | None] | None = None,
) -> tuple[list[RunSpec], WideState]:
    """The wide runs needed now given the finished ones (``done``: the wide curves): each new shape's LR sweep on
    the pilot seed at B, then each new shape at its best LR on ``SCREEN_SEEDS``, then (with ``known_loss``) the
    best shapes on every main seed at B and ``primary`` on the main seeds the experiment did not have, and on each
    seed whose arm and best shapes have run at B, the best shapes at that seed's ``next_budget``.

    Args:
        s: the experiment's settings.
        known_lr: the tuned LR of every trained size (the experiment's sizes and the refine runs'), by name.
        known: the trained sizes' shapes, by name.
        done: the finished wide runs, by name.
        known_loss: the final loss of a trained size's run the experiment or the refine runs made (None: not run);
            without it the plan stops after the screen.
        primary: the primary arm's main run on seed 0 (its LR, growth points and LR policy); its runs here take
            the seeds from ``s.seeds`` to ``n_seeds(s)``.
        arm_loss: the primary arm's final loss at B on a main seed the experiment ran (``Inputs.arm_loss``); without
            it (or ``primary``) no seed gets runs other than at B, and the state is never ``complete``.

    Raises:
        plan.CurveMismatch: a wide curve has a needed run's name but another spec.
    """
    w_s = wide_settings(s, known)
    shapes = {z: w_s.sizes[z] for z in w_s.design["wide"]["shapes"]}
    new = [z for z in shapes if z not in known]
    comp_width = s.sizes[s.design["comparator"]][1]
    by_shape = {tuple(known[z]): lr for z, lr in known_lr.items() if z in known}
    st = WideState(shapes, new, {z: known_lr[z] for z in shapes if z in known}, {}, False, False)
    specs: list[RunSpec] = []
    for z in new:
        c = centre_lr(shapes[z], comp_width, by_shape)
        need, lr = plan.lr_sweep(replace(s, lrs=(c / 2, c, c * 2)), done, RunSpec(WIDE, "scratch", s.pilot_seed, 1.0,
                                                                                  0.0, size=z))  # fmt: skip
        specs += need
        if lr is not None:
            st.lr[z] = lr
            plan.mark_edge(st.lr_edge, z, lr, need)
    if any(z not in st.lr for z in new):
        return specs, st
    st.pilot_complete = True
    screen = [RunSpec(WIDE, "scratch", k, 1.0, st.lr[z], size=z) for k in SCREEN_SEEDS for z in new]
    specs += screen
    st.screen_complete = all(plan.final_loss(done, sp) is not None for sp in screen)
    if not st.screen_complete or known_loss is None:
        return specs, st

    def loss(z: str, k: int, b: float) -> float | None:
        """A shape's final loss on seed ``k`` at ``b`` x B: its own run here, else the experiment's or refine's."""
        mine = plan.final_loss(done, RunSpec(WIDE, "scratch", k, b, st.lr[z], size=z))
        return mine if mine is not None or z not in known else known_loss(z, k, b)

    for z in shapes:
        got = [loss(z, k, 1.0) for k in SCREEN_SEEDS]
        if all(v is not None for v in got):
            st.screen_loss[z] = sum(got) / len(got)
    st.best = sorted(st.screen_loss, key=lambda z: (st.screen_loss[z], z))[:N_BEST]
    more = [RunSpec(WIDE, "scratch", k, 1.0, st.lr[z], size=z) for z in st.best for k in range(n_seeds(s))
            if loss(z, k, 1.0) is None]  # fmt: skip
    if primary is not None:
        more += [replace(primary, phase=WIDE, seed=k) for k in range(s.seeds, n_seeds(s))]
    bracketed = 0
    for k in range(n_seeds(s)):
        la, env = seed_arm_loss(k, s, done, primary, arm_loss), envelope(st.best, k, loss)
        if la is None or env(1.0) is None:
            continue
        if (b := next_budget(la, env)) is None:
            bracketed += 1
        else:
            more += [RunSpec(WIDE, "scratch", k, b, st.lr[z], size=z) for z in st.best if loss(z, k, b) is None]
    specs += more
    st.complete = bracketed == n_seeds(s) and all(plan.final_loss(done, sp) is not None for sp in more)
    return specs, st


def seed_arm_loss(
    k: int,
    s: Settings,
    done: Mapping[str, dict],
    primary: RunSpec | None,
    arm_loss: Callable[[int], float | None] | None,
) -> float | None:
    """The primary arm's final loss at B on main seed ``k``: the experiment's run (``arm_loss``) on its seeds, the
    wide run of ``primary`` past them; None when not run (or not given)."""
    if k < s.seeds:
        return arm_loss(k) if arm_loss is not None else None
    return plan.final_loss(done, replace(primary, phase=WIDE, seed=k)) if primary is not None else None


def envelope(
    best: list[str], k: int, loss: Callable[[str, int, float], float | None]
) -> Callable[[float], float | None]:
    """budget (x B) -> the lowest final loss of the ``best`` shapes on seed ``k`` at that budget (``loss(shape,
    seed, budget)``), None until every one of them has run there."""

    def at(b: float) -> float | None:
        got = [loss(z, k, b) for z in best]
        return None if any(v is None for v in got) else min(got)

    return at


def max_train_windows(s: Settings, shapes: Mapping[str, tuple[int, int, int]]) -> int:
    """The most training windows a wide run reads: the cheapest shape at the largest budget past B."""
    return max_windows(replace(s, sizes={**s.sizes, **shapes}), ((z, max(PAST_B)) for z in shapes))


def preregistration(s: Settings, primary: str, shapes: Mapping[str, tuple[int, int, int]]) -> dict[str, Any]:
    """The comparison the wide envelope decides, fixed before any new main seed runs (written to
    ``wide/preregistration.json`` by growlm-experiment and committed with it): the plan as it stands, which a new
    experiment writes. An experiment that fixed the first plan keeps its file, amended (``accepted_preregistrations``).

    Args:
        s: the experiment's settings.
        primary: the primary arm (chosen on the pilot seed before any main seed ran).
        shapes: the wide envelope's shapes (``wide_shapes``).
    """
    return {
        "primary_arm": primary,
        "budget_C": s.design["budget_C"],
        "main_seeds": list(range(n_seeds(s))),
        "envelope_shapes": [{"name": z, "n_layer": v[0], "n_embd": v[1], "n_head": v[2]} for z, v in shapes.items()],
        "best_shapes": f"the {N_BEST} shapes with the lowest mean final loss at B over main seeds "
                       f"{list(SCREEN_SEEDS)}, each at its pilot LR; they run on every main seed at B, then per seed "
                       "at the budgets their envelope needs to bracket the arm's loss on that seed, nearest first: "
                       f"{list(BELOW_B)} x B when the arm's loss is above the envelope's at B, else {list(PAST_B)} "
                       "x B",
        "comparator": "the best shape at B: the lowest mean final loss over every main seed among the best shapes "
                      "(chosen after the main seeds ran, which favours the envelope)",
        "primary_comparison": f"per main seed, the {primary} arm's final validation loss at B minus the "
                              "comparator's (paired by seed: the same batches); mean, 95% t-interval, a two-sided "
                              "sign test and a two-sided Wilcoxon signed-rank test over the main seeds",
        "saving": "per main seed, 1 - B / the compute the best shapes need to reach the arm's loss on that seed: "
                  "the envelope of the best shapes' runs on that seed (their lowest loss at each budget), log budget "
                  "interpolated linearly between the two budgets whose losses bracket the arm's (none when no pair "
                  "brackets it, so the saving lies in [-100%, +50%] or is none); mean and 95% t-interval over the "
                  "main seeds",
        "goal": "a saving of at least 10% of compute with the interval above 0; if the win does not survive, that "
                "is the result",
    }  # fmt: skip


def accepted_preregistrations(
    s: Settings, primary: str, shapes: Mapping[str, tuple[int, int, int]]
) -> list[dict[str, Any]]:
    """The pre-registrations an existing ``wide/preregistration.json`` may hold: the plan as it stands
    (``preregistration``), or the first plan (runs past B only) with ``AMENDMENTS`` appended, its text unchanged."""
    now = preregistration(s, primary, shapes)
    first = now | {
        "best_shapes": f"the {N_BEST} shapes with the lowest mean final loss at B over main seeds "
                       f"{list(SCREEN_SEEDS)}, each at its pilot LR; they run on every main seed at B and at "
                       f"{list(PAST_B)} x B",
        "saving": "per main seed, 1 - B / the compute the best shapes need to reach the arm's loss on that seed: "
                  "the envelope of the best shapes' runs at B and past B (their lowest loss at each budget), log "
                  "budget interpolated linearly between the two budgets whose losses bracket the arm's (none when "
                  "no pair brackets it); mean and 95% t-interval over the main seeds",
    }  # fmt: skip
    return [now, first | {"amendments": list(AMENDMENTS)}]
