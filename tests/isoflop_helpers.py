"""A fabricated crossover map for the IsoFLOP tests: a loss surface over sizes, budgets and LRs, and the map's
rounds run on it without training (eval/experiments/crossmap.py)."""

from __future__ import annotations

import math

from growlm.eval.experiments import crossmap
from growlm.eval.experiments import protocol as P
from growlm.eval.experiments.protocol import RunSpec

S = P.PROFILES["cpu"]
M = crossmap.MAP
# final loss = base - slope * log2(budget) at the best LR; slopes chosen so that L1 -> L2 cross at 6 C, L2 -> L4 at
# 24 C, L8 never overtakes L4 inside 64 C, and L4 beats L4n at every budget; the best LR is 2e-3 below 30 C and
# 1e-3 above; the second seed's losses sit 0.01 higher
BASE = {"L1": 3.0, "L2": 3.2, "L4": 3.5, "L8": 3.9, "L4n": 3.6}
SLOPE = {"L1": 0.15, "L4n": 0.2}
SLOPE["L2"] = 0.15 + 0.2 / math.log2(6.0)
SLOPE["L4"] = SLOPE["L2"] + 0.3 / math.log2(24.0)
SLOPE["L8"] = SLOPE["L4"] + 0.01


def fake_loss(spec: RunSpec) -> float:
    """The fabricated loss surface above."""
    best = 2e-3 if spec.budget < 30 else 1e-3
    loss = BASE[spec.size] - SLOPE[spec.size] * math.log2(spec.budget) + 0.05 * abs(math.log2(spec.lr / best))
    return loss + (0.01 if spec.seed == M.second_seed else 0.0)


def finish(specs: list[RunSpec], done: dict[str, dict]) -> None:
    for sp in specs:
        if sp.name not in done:
            done[sp.name] = {"spec": sp, "settings": {"data": {"train_windows": 400_000}},
                             "curve": {"final": {"val_loss": fake_loss(sp)}, "wall_s": 8.0 * sp.budget}}  # fmt: skip


def run_map(m=M) -> tuple[dict[str, dict], crossmap.MapState, int]:
    done: dict[str, dict] = {}
    rounds = 0
    while True:
        specs, st = crossmap.map_plan(S, m, done)
        todo = [sp for sp in specs if sp.name not in done]
        if not todo:
            return done, st, rounds
        rounds += 1
        finish(todo, done)
