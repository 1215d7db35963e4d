"""The crossover map (``growlm-experiment --phase map``): at which training budget does each size of a ladder
overtake the next smaller one? Pure planning and arithmetic (no torch); the runs are the IsoFLOP experiment's
(eval.experiments.train_run) and the report is written from the curves alone.

Why (DESIGN.md, "Does growth pay"): a growth arm can only beat the IsoFLOP envelope at a budget where its target is
the envelope's best size. The map finds those budgets. For every size, scratch runs at budgets 1, 2, 4, ... 64 C,
each with its own full schedule ending at its budget (Hoffmann et al. 2022, arXiv 2203.15556, "IsoFLOP profiles");
the peak LR is tuned on a factor-2 grid (widened while the best sits at an edge) at the ``lr_budgets``, the
profile's grid at the first and a grid centred on the previous tuned budget's best LR at each later one, and each
other budget takes the LR of the tuned budget nearest to it in log FLOPs. The crossover of a pair of neighbouring
sizes is the budget where the larger one's final validation loss drops below the smaller one's, interpolated
log-linearly between the two measured budgets around the sign change (``analysis.crossover``), bracketed by them,
and flagged "below" or "beyond" when it lies outside the measured budgets. Pairs that cross are measured again on a
second seed; their interval spans both seeds' crossovers.

A run's epochs are its training windows over the token folder's (``epochs``); a map whose longest run would read
the data more than twice is refused before it starts, as the envelope experiment's is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from growlm.eval.experiments.analysis import crossover, r4
from growlm.eval.experiments.plan import final_loss, lr_sweep
from growlm.eval.experiments.protocol import RunSpec, Settings, max_windows, run_steps
from growlm.model.config import param_count
from growlm.runtime import atomic

MAP_PROTOCOL = "isoflop-map-v1"  # bump when a change makes old map curves incomparable


@dataclass(frozen=True)
class MapSettings:
    """What the map measures, beside the profile's ``Settings`` (family, C, batch, LR grid).

    budgets: the budgets (x C) every size runs at. lr_budgets: where each size's LR is tuned (a subset of
    budgets). ladders: name -> sizes from small to large; each neighbouring pair gets a crossover. second_seed: the
    seed that re-measures the pairs that cross (the first seed is the profile's pilot seed). extra: the extra
    training sources of the token folder (data.small_vocab ``--extra``), so that the longest runs read the data
    at most twice.
    """

    budgets: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
    lr_budgets: tuple[float, ...] = (8.0, 64.0)
    ladders: dict[str, tuple[str, ...]] = field(
        default_factory=lambda: {"depth": ("L1", "L2", "L4", "L8"), "width": ("L4n", "L4")}
    )
    second_seed: int = 101
    extra: tuple[str, ...] = ("wikipedia", "kernel_docs")

    def sizes(self) -> tuple[str, ...]:
        """Every size of every ladder, each once, in ladder order."""
        return tuple(dict.fromkeys(z for ladder in self.ladders.values() for z in ladder))

    def pairs(self) -> list[tuple[str, str]]:
        """(smaller, larger) neighbours of every ladder."""
        return [p for ladder in self.ladders.values() for p in zip(ladder, ladder[1:], strict=False)]

    def check(self, s: Settings) -> None:
        """Raises ValueError when a ladder names a size the profile lacks, a tuned budget is not measured, or a
        second seed equals the pilot seed."""
        missing = [z for z in self.sizes() if z not in s.sizes]
        if missing:
            raise ValueError(f"map ladders name sizes {missing} that the {s.profile} profile lacks")
        if not set(self.lr_budgets) <= set(self.budgets):
            raise ValueError(f"lr_budgets {self.lr_budgets} must be among budgets {self.budgets}")
        if self.second_seed == s.pilot_seed:
            raise ValueError(f"second_seed {self.second_seed} equals the pilot seed")


MAP = MapSettings()


def quick_map() -> MapSettings:
    """The --quick map: three budgets, the LR tuned at the middle one, no extra data (seconds per run)."""
    return MapSettings(budgets=(0.5, 1.0, 2.0), lr_budgets=(1.0,), extra=())


def settings_dict(s: Settings, m: MapSettings) -> dict[str, Any]:
    """The settings every map curve stores: the profile's (``Settings.as_dict``) with the map's protocol and
    ``map`` block; curves with other settings are refused, never mixed in (eval.experiments.runner)."""
    d = s.as_dict()
    d["protocol"] = MAP_PROTOCOL
    d["map"] = json.loads(json.dumps(asdict(m)))
    return d


def token_folder(s: Settings, m: MapSettings) -> Path:
    """The map's default token folder: growlm's cache, ``bpe<vocab>`` plus one ``-<source>`` per extra source."""
    from growlm.data.tokens import cache_dir  # lazy: only without --data

    return cache_dir() / "".join([f"bpe{s.vocab_size}", *(f"-{e}" for e in m.extra)])


def nearest_tuned(m: MapSettings, budget: float) -> float:
    """The tuned budget nearest to ``budget`` in log FLOPs (ties to the smaller)."""
    return min(m.lr_budgets, key=lambda b: (abs(math.log(b / budget)), b))


def max_train_windows(s: Settings, m: MapSettings) -> int:
    """The most training windows any map run reads: the cheapest size's run at the largest budget."""
    return max_windows(s, ((z, max(m.budgets)) for z in m.sizes()))


def epochs(s: Settings, spec: RunSpec, train_windows: int) -> float:
    """Passes over the training data of a run: its steps x batch windows / the folder's ``train_windows``."""
    return run_steps(s, spec)[-1] * s.batch / train_windows


@dataclass
class MapState:
    """What the finished map runs decided so far."""

    lr: dict[str, dict[float, float]]  # size -> tuned budget -> best LR
    loss: dict[int, dict[str, dict[float, float]]]  # seed -> size -> budget -> final validation loss
    crossovers: dict[str, dict[str, Any]]  # "small->big" -> crossover record (``_crossing``)
    complete: bool


def lr_at(m: MapSettings, st: MapState, size: str, budget: float) -> float:
    """The peak LR a size runs with at a budget: its best at the nearest tuned budget."""
    return st.lr[size][nearest_tuned(m, budget)]


def _crossing(m: MapSettings, loss: Mapping[int, Mapping[str, Mapping[float, float]]], small: str, big: str,
              seeds: list[int]) -> dict[str, Any]:  # fmt: skip
    """The crossover record of one pair over the seeds that measured both sizes: per seed (budget x C, flag), the
    measured budgets around the first seed's crossover, and the interval over the seeds' crossovers."""
    per = {}
    for seed in seeds:
        b, flag = crossover(loss[seed][small], loss[seed][big])
        per[seed] = {"budget": b, "flag": flag}
    first = per[seeds[0]]
    bs = sorted(m.budgets)
    if first["flag"] == "below":
        bracket = [None, bs[0]]
    elif first["flag"] == "beyond":
        bracket = [bs[-1], None]
    else:
        hi = min(b for b in bs if b >= first["budget"])
        bracket = [max(b for b in bs if b < hi), hi]
    inside = [p["budget"] for p in per.values() if not p["flag"]]
    interval = [min(inside), max(inside)] if len(inside) == len(per) else None
    flags = sorted({p["flag"] for p in per.values() if p["flag"]})
    return {"budget": first["budget"], "flag": first["flag"], "bracket": bracket, "seeds": per,
            "interval": interval, "seed_flags": flags}  # fmt: skip


def map_plan(s: Settings, m: MapSettings, done: Mapping[str, dict]) -> tuple[list[RunSpec], MapState]:
    """The map runs needed given the finished ones, and what they decided (the module docstring's order: LR sweeps
    at the tuned budgets, every budget at the nearest tuned LR (a size as soon as its own sweeps are done, so that
    one size's sweep does not hold the others back), crossovers on the pilot seed, the crossing pairs on the second
    seed).

    Raises:
        plan.CurveMismatch: a finished curve has a needed run's name but another spec.
    """
    seed = s.pilot_seed
    specs: list[RunSpec] = []
    st = MapState({z: {} for z in m.sizes()}, {seed: {z: {} for z in m.sizes()}}, {}, False)
    for size in m.sizes():
        grid = s.lrs
        for tb in sorted(m.lr_budgets):
            need, lr = lr_sweep(replace(s, lrs=grid), done, RunSpec("map", "scratch", seed, tb, 0.0, size=size))
            specs += need
            if lr is None:
                break
            st.lr[size][tb] = lr
            grid = (lr / 2, lr, lr * 2)  # the next tuned budget's grid is centred on this one's best

    def measure(seed_: int, sizes: list[str]) -> bool:
        table = st.loss.setdefault(seed_, {})
        ok = True
        for size in sizes:
            for b in m.budgets:
                sp = RunSpec("map", "scratch", seed_, b, lr_at(m, st, size, b), size=size)
                specs.append(sp)
                v = final_loss(done, sp)
                if v is None:
                    ok = False
                else:
                    table.setdefault(size, {})[b] = v
        return ok

    tuned = [z for z in m.sizes() if len(st.lr[z]) == len(m.lr_budgets)]
    if not measure(seed, tuned) or len(tuned) < len(m.sizes()):  # a tuned size's budgets run beside the others' sweeps
        return specs, st
    crossing = [(a, b) for a, b in m.pairs() if not crossover(st.loss[seed][a], st.loss[seed][b])[1]]
    again = list(dict.fromkeys(z for pair in crossing for z in pair))
    if again and not measure(m.second_seed, again):
        return specs, st
    for a, b in m.pairs():
        seeds = [seed] + ([m.second_seed] if (a, b) in crossing else [])
        st.crossovers[f"{a}->{b}"] = _crossing(m, st.loss, a, b, seeds)
    st.complete = True
    return specs, st


def summarize(s: Settings, m: MapSettings, done: Mapping[str, dict], train_windows: int) -> dict[str, Any]:
    """map.json's content from the finished curves: per size its parameters, tuned LRs and per budget (x C) the
    pilot seed's final loss, LR, epochs and wall seconds (second-seed losses beside them); per pair the crossover;
    per budget the envelope's best size.

    Raises:
        ValueError: the map is incomplete.
    """
    _, st = map_plan(s, m, done)
    if not st.complete:
        raise ValueError("the map is incomplete; run growlm-experiment --phase map (it resumes) before the report")
    sizes = {}
    for size in m.sizes():
        pts = {}
        for b in m.budgets:
            sp = RunSpec("map", "scratch", s.pilot_seed, b, lr_at(m, st, size, b), size=size)
            rec = done[sp.name]["curve"]
            pts[f"{b:g}"] = {
                "loss": round(st.loss[s.pilot_seed][size][b], 4),
                "loss_second_seed": r4(st.loss.get(m.second_seed, {}).get(size, {}).get(b)),
                "lr": sp.lr,
                "epochs": float(f"{epochs(s, sp, train_windows):.4g}"),
                "wall_s": round(rec["wall_s"], 3),
            }
        sizes[size] = {"params": param_count(s.config(size)), "shape": list(s.sizes[size]),
                       "lr": {f"{k:g}": v for k, v in st.lr[size].items()}, "points": pts}  # fmt: skip
    envelope = {}
    for b in m.budgets:
        best = min(m.sizes(), key=lambda z: st.loss[s.pilot_seed][z][b])
        envelope[f"{b:g}"] = {"size": best, "loss": round(st.loss[s.pilot_seed][best][b], 4)}
    out = {"protocol": MAP_PROTOCOL, "c_flops": s.c_flops, "budgets": list(m.budgets),
            "lr_budgets": list(m.lr_budgets), "pilot_seed": s.pilot_seed, "second_seed": m.second_seed,
            "train_windows": train_windows, "ladders": {k: list(v) for k, v in m.ladders.items()},
            "sizes": sizes, "crossovers": st.crossovers, "envelope": envelope,
            "runs": sum(1 for r in done.values() if r["spec"].phase == "map")}  # fmt: skip
    out["choice"] = choose_target(out)
    return out


def choose_target(r: dict[str, Any]) -> dict[str, Any]:
    """The main experiment's budget B and growth target from a complete map (``summarize``'s content), by rule. The
    candidates are the (size, budget) pairs where the size is the envelope's best (pilot seed) and has a smaller
    neighbour in a ladder to grow from. A candidate is *confirmed* when the second seed measured the size and at
    least one other size at that budget and agrees that the size is best, and every crossover into the size lies at
    or below the budget and every crossover out of it (to its next larger neighbour) above it. The choice is the
    confirmed candidate of the largest size (by parameters; then by name) at the budget where it leads the
    runner-up by the widest margin; without a confirmed candidate, the same rule over all of them, marked
    unconfirmed.

    Returns:
        {"target", "budget" (x C), "budget_flops", "margin" (nats), "runner_up", "grow_from" (the target's smaller
        neighbours), "confirmed", "why"}; target and budget None, with the reason in "why", when no size with a
        smaller neighbour is ever the best.
    """
    loss = {z: {b: p["loss"] for b, p in v["points"].items()} for z, v in r["sizes"].items()}
    second = {z: {b: p["loss_second_seed"] for b, p in v["points"].items()} for z, v in r["sizes"].items()}
    pairs = [(a, b) for ladder in r["ladders"].values() for a, b in zip(ladder, ladder[1:], strict=False)]
    options = []
    for b, e in r["envelope"].items():
        target = e["size"]
        if not any(big == target for _, big in pairs):
            continue
        others = {o: v[b] for o, v in loss.items() if o != target}
        runner_up = min(others, key=others.get)
        t2 = second[target][b]
        compared = [o for o in others if t2 is not None and second[o][b] is not None]
        seconds_ok = bool(compared) and all(second[o][b] > t2 for o in compared)
        into = [r["crossovers"][f"{x}->{y}"] for x, y in pairs if y == target]
        out_of = [r["crossovers"][f"{x}->{y}"] for x, y in pairs if x == target]
        inside = all(c["flag"] == "below" or (not c["flag"] and c["budget"] <= float(b)) for c in into) and all(
            c["flag"] == "beyond" or (not c["flag"] and c["budget"] > float(b)) for c in out_of
        )
        margin = others[runner_up] - loss[target][b]
        options.append((seconds_ok and inside, r["sizes"][target]["params"], target, margin, b, runner_up))
    if not options:
        return {"target": None, "budget": None, "budget_flops": None, "margin": None, "runner_up": None,
                "grow_from": [], "confirmed": False, "why": "no size with a smaller neighbour is the envelope's best "
                "at any measured budget: growth has no compute-optimal target inside the map"}  # fmt: skip
    ok, _, target, margin, b, runner_up = max(options, key=lambda o: (o[0], o[1], o[2], o[3]))
    why = (
        f"`{target}` is the largest size that is the envelope's best at a measured budget"
        f"{' with the second seed and the crossovers agreeing' if ok else ''}; at {b} C it leads `{runner_up}` by "
        f"{margin:.4f} nats, its widest lead"
    )
    why += "" if ok else " (not confirmed by the second seed or by the measured crossovers: read with care)"
    return {"target": target, "budget": float(b), "budget_flops": float(b) * r["c_flops"], "margin": round(margin, 4),
            "runner_up": runner_up, "grow_from": sorted({x for x, y in pairs if y == target}), "confirmed": ok,
            "why": why}  # fmt: skip


def _where(c: dict[str, Any]) -> str:
    """A crossover as a table cell: '5.3 C (4-8 C measured; seeds 5.3-6.1 C)' or 'beyond 64 C'."""
    if c["flag"] == "beyond":
        return f"beyond {c['bracket'][0]:g} C"
    if c["flag"] == "below":
        return f"below {c['bracket'][1]:g} C"
    text = f"{c['budget']:.3g} C ({c['bracket'][0]:g}-{c['bracket'][1]:g} C measured"
    if c["interval"] is not None and len(c["seeds"]) > 1:
        text += f"; seeds {c['interval'][0]:.3g}-{c['interval'][1]:.3g} C"
    elif c["seed_flags"]:
        text += f"; second seed {', '.join(c['seed_flags'])} the measured budgets"
    return text + ")"


def markdown(r: dict[str, Any]) -> str:
    """map.md from map.json's content."""
    budgets = [f"{b:g}" for b in r["budgets"]]
    lines = ["# Where does each size overtake the next smaller one? (crossover map)", "",
             "Produced by `growlm-experiment --phase map` (eval/experiments/crossmap.py); every number is computed "
             "from the committed curves in `curves/map/` (`--phase map --report_only` rebuilds this file, map.json "
             "and map.png).", "",
             f"C = {r['c_flops']:.3g} FLOPs. Every run has its own warm-up and cosine decay ending at its budget; the "
             f"peak LR is tuned at {', '.join(f'{b:g} C' for b in r['lr_budgets'])} (factor-2 grid, widened at an "
             "edge) and each other budget uses the LR of the nearest tuned budget (its loss there is at most a "
             "tuned run's: an upper bound; --phase optimal tunes the LRs at its own budget again). Parameters here "
             "include the position embeddings. Seed "
             f"{r['pilot_seed']}; pairs that cross are re-measured on seed {r['second_seed']}.", "",
             "## Final validation loss (nats per token)", "",
             "| size | params | " + " | ".join(f"{b} C" for b in budgets) + " |",
             "|---|---|" + "---|" * len(budgets)]  # fmt: skip
    for size, z in r["sizes"].items():
        cells = [f"{z['points'][b]['loss']:.4f}" for b in budgets]
        lines.append(f"| `{size}` | {z['params']:,} | " + " | ".join(cells) + " |")
    best = [f"`{r['envelope'][b]['size']}`" for b in budgets]
    lines += ["| **best** | | " + " | ".join(best) + " |", "", "## Crossovers", "",
              "| pair | crossover |", "|---|---|"]  # fmt: skip
    for pair, c in r["crossovers"].items():
        lines.append(f"| `{pair}` | {_where(c)} |")
    ch = r["choice"]
    lines += ["", "## The main experiment's budget and target", ""]
    if ch["target"] is None:
        lines.append(f"None: {ch['why']}.")
    else:
        lines.append(f"B = {ch['budget']:g} C ({ch['budget_flops']:.3g} FLOPs), target `{ch['target']}`, grown from "
                     f"{', '.join(f'`{z}`' for z in ch['grow_from'])}: {ch['why']} (rule: "
                     "`crossmap.choose_target`).")  # fmt: skip
    lines += ["", "## Epochs over the training data and LRs", "",
              "| size | LR (tuned budget: LR) | epochs at " + ", ".join(f"{b} C" for b in budgets) + " |",
              "|---|---|---|"]  # fmt: skip
    for size, z in r["sizes"].items():
        lrs = ", ".join(f"{b} C: {lr:.1e}" for b, lr in z["lr"].items())
        eps = ", ".join(f"{z['points'][b]['epochs']:.3g}" for b in budgets)
        lines.append(f"| `{size}` | {lrs} | {eps} |")
    lines.append("")
    return "\n".join(lines)


def plot(r: dict[str, Any], path) -> None:
    """map.png: final validation loss against training FLOPs, one line per size (second-seed points hollow),
    crossovers marked."""
    import matplotlib  # lazy: about 1 s, plots only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after the Agg backend is chosen

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
    c = r["c_flops"]
    for size, z in r["sizes"].items():
        xs = [float(b) * c for b in z["points"]]
        line = ax.plot(xs, [p["loss"] for p in z["points"].values()], marker="o", label=f"{size} ({z['params']:,})")
        second = [(x, p["loss_second_seed"]) for x, p in zip(xs, z["points"].values(), strict=True)
                  if p["loss_second_seed"] is not None]  # fmt: skip
        if second:
            ax.scatter(*zip(*second, strict=True), facecolors="none", edgecolors=line[0].get_color())
    for pair, cr in r["crossovers"].items():
        if not cr["flag"]:
            ax.axvline(cr["budget"] * c, ls="--", lw=0.8, color="grey")
            ax.text(cr["budget"] * c, ax.get_ylim()[1], pair, rotation=90, va="top", ha="right", fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs")
    ax.set_ylabel("final validation loss (nats/token)")
    ax.set_title("Crossover map: each size at budgets 1..64 C (hollow: second seed)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def eta_line(s: Settings, done: Mapping[str, dict], todo: list[RunSpec], parallel: int, unit: str = "C") -> str:
    """The progress line: runs done, runs left and the time left, estimated from the finished runs' measured
    seconds per unit of budget (median) over ``parallel`` workers; '?' before any run has finished. ``unit``: what
    a run's budget counts ('C', or 'B' in the optimal phase)."""
    rates = sorted(r["curve"]["wall_s"] / r["spec"].budget for r in done.values() if r["spec"].budget > 0)
    left = sum(sp.budget for sp in todo)
    if not rates:
        eta = "?"
    else:
        sec = rates[len(rates) // 2] * left / max(1, min(parallel, len(todo)))
        eta = f"{sec / 3600:.1f} h" if sec >= 3600 else f"{sec / 60:.0f} min" if sec >= 60 else f"{sec:.0f} s"
    return f"{len(done)} runs done, {len(todo)} to run ({left:g} {unit} of budget, about {eta} left)"


def train_windows_of(done: Mapping[str, dict]) -> int:
    """The token folder's training windows, as the map curves recorded it (``settings["data"]["train_windows"]``).

    Raises:
        ValueError: no curve records it, or two curves disagree.
    """
    seen = {r["settings"].get("data", {}).get("train_windows") for r in done.values()}
    if len(seen) != 1 or None in seen:
        raise ValueError(f"the map curves record the training windows as {sorted(seen, key=str)}; need one value")
    return int(seen.pop())


def write(s: Settings, m: MapSettings, done: Mapping[str, dict], out: Path) -> int:
    """Write map.json, map.md and map.png into ``out`` from the finished curves (atomically, each file whole).
    Returns 0, or 2 with a one-line reason on stderr when the map is incomplete."""
    import sys  # lazy: only for the message

    try:
        r = summarize(s, m, done, train_windows_of(done))
    except ValueError as e:
        print(f"growlm-experiment: error: {e}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    atomic.write_json(out / "map.json", r, overwrite=True)
    atomic.write_text(out / "map.md", markdown(r), overwrite=True)
    plot(r, out / "map.png")
    print(f"growlm-experiment: crossover map -> {out / 'map.md'}")
    return 0
