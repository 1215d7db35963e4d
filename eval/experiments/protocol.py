"""The IsoFLOP-envelope experiment's protocol: the model family, the budgets, the arms, the runs and their settings.
Pure data and arithmetic (no torch).

Question (DESIGN.md, "Does growth pay"): at the same total training FLOPs, does a grown model beat the best model
of *any* size trained from scratch? The **envelope** at a budget B is the lowest validation loss any scratch size
reaches with B FLOPs, each size with its own fully decayed LR schedule ending exactly at B (Hoffmann et al. 2022,
arXiv 2203.15556, "IsoFLOP profiles"). A growth arm trains small, grows with growlm's operators and ends at the
target size (one arm: at L2) with the same FLOPs C; it beats the envelope when its loss is below the best
scratch size's at C.

The model family (sizes named by depth): GPT-2 blocks of width 64 (4 heads) at depths 1, 2, 4, 8 (L1, L2, L4, L8),
plus L4n, 4 layers of width 32 (2 heads), for the width pair; a 320-token ByteLevel BPE (data.small_vocab), so the
tied LM head is 8.1% of the L4 target's FLOPs per token (``head_fraction``). FLOPs per token:
model.config.flops_per_token (6 N + attention).

Each run's settings are in its ``RunSpec``; the experiment-wide ones in ``Settings`` (one profile per machine
class). A curve stores both; curves made with other settings are refused, never mixed in.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from growlm.eval.experiments.runs import Job
from growlm.eval.experiments.runs import max_windows as _max_windows
from growlm.eval.experiments.runs import stage_steps as _stage_steps
from growlm.model.config import GPTConfig, flops_per_token

PROTOCOL = "isoflop-envelope-v1"  # bump when a change makes old curves incomparable


@dataclass(frozen=True)
class Settings:
    """Experiment-wide settings (one profile). Budgets are multiples of C = ``c_flops`` FLOPs.

    sizes: name -> (n_layer, n_embd, n_head); target: the final size of the growth arms but one (``depth-1-2``); each
    arm's same-size reference is its own final size.
    budgets: the envelope's budgets as fractions of C; ``budgets_2c_seeds``: how many seeds (the first ones) also run
    every size at 2 C (the target and every arm's final size run 2 C on every seed, so that same-size savings never
    extrapolate).
    lrs: the first LR grid of the pilot (a factor of 2 apart), widened at an edge by ``lr_widen`` steps at most in all.
    warmup_frac: linear warm-up as a fraction of a run's steps (at least 2 steps); the cosine decays to 0 at the
    run's last step. batch x seq_len tokens per optimizer step; AdamW betas (0.9, 0.95), eps 1e-8, weight decay 0.1
    on 2-D weights, gradient clipping at 1.0.
    curve_points: validation points per run (evenly spaced in FLOPs), each on ``curve_windows`` windows; the final
    point on ``final_windows`` windows spread evenly over all held-out text.
    arms: the growth arms (None: this module's ``ARMS``); protocol: the version every curve records; design: what
    another protocol derived these settings from (eval.experiments.optimal: the crossover map's choice). ``arms``
    and ``design`` enter ``as_dict`` only when set, so the curves of isoflop-envelope-v1 keep their settings.
    """

    profile: str = "cpu"
    vocab_size: int = 320
    seq_len: int = 64
    batch: int = 16
    sizes: dict[str, tuple[int, int, int]] = field(
        default_factory=lambda: {
            "L1": (1, 64, 4),
            "L2": (2, 64, 4),
            "L4": (4, 64, 4),
            "L8": (8, 64, 4),
            "L4n": (4, 32, 2),
        }  # fmt: skip
    )
    target: str = "L4"
    c_flops: float = 3.6e11
    budgets: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0)
    budgets_2c_seeds: int = 2
    seeds: int = 5
    pilot_seed: int = 100
    lrs: tuple[float, ...] = (2e-3, 4e-3, 8e-3)
    lr_widen: int = 2
    warmup_frac: float = 0.05
    rewarm_frac: float = 0.05
    curve_points: int = 8
    curve_windows: int = 64
    final_windows: int = 512
    device: str = "cpu"
    arms: tuple[Arm, ...] | None = None
    protocol: str = PROTOCOL
    design: dict[str, Any] | None = None

    def arm(self, name: str) -> Arm:
        """The growth arm called ``name`` among this protocol's arms (KeyError names them)."""
        arms = ARMS if self.arms is None else self.arms
        for a in arms:
            if a.name == name:
                return a
        raise KeyError(f"unknown arm {name!r}; arms: {tuple(a.name for a in arms)}")

    def arm_list(self) -> tuple[Arm, ...]:
        """This protocol's growth arms, in order."""
        return ARMS if self.arms is None else self.arms

    def config(self, size: str) -> GPTConfig:
        """The GPTConfig of a named size (dropout 0, n_positions = seq_len)."""
        n_layer, n_embd, n_head = self.sizes[size]
        return GPTConfig(n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_positions=self.seq_len,
                         vocab_size=self.vocab_size)  # fmt: skip

    def step_flops(self, size: str) -> int:
        """Training FLOPs of one optimizer step of ``size``: flops_per_token x batch x seq_len."""
        return flops_per_token(self.config(size), self.seq_len) * self.batch * self.seq_len

    def head_fraction(self, size: str | None = None) -> float:
        """The tied LM head's share of a size's training FLOPs per token: 6 V d / flops_per_token."""
        cfg = self.config(size or self.target)
        return 6 * cfg.vocab_size * cfg.n_embd / flops_per_token(cfg, self.seq_len)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready settings (tuples as lists), with the protocol version; ``arms`` and ``design`` only when set."""
        d = json.loads(json.dumps(asdict(self)))
        for k in ("arms", "design"):
            if d[k] is None:
                del d[k]
        return d


PROFILES = {
    "cpu": Settings(),
    # the GPU profile (not yet run on a GPU): 16 seeds; the same family at twice the width (L4n at 64), so 3.3-3.6x
    # the FLOPs per token, and about 4x the budget, so that every run reads the built-in corpus at most once
    # (plan.max_train_windows: 0.92 of a pass at the most)
    "gpu": Settings(
        profile="gpu",
        sizes={"L1": (1, 128, 4), "L2": (2, 128, 4), "L4": (4, 128, 4), "L8": (8, 128, 4), "L4n": (4, 64, 2)},
        c_flops=1.5e12,
        seeds=16,
        budgets_2c_seeds=4,
        final_windows=1024,
        device="cuda",
    ),  # fmt: skip
}


def quick(s: Settings) -> Settings:
    """The --quick version of a profile: the same protocol at toy size (width 16, 2 seeds, tiny budgets), seconds."""
    sizes = {"L1": (1, 16, 2), "L2": (2, 16, 2), "L4": (4, 16, 2), "L8": (8, 16, 2), "L4n": (4, 8, 1)}
    return replace(s, profile=s.profile + "-quick", sizes=sizes, seq_len=32, batch=4, c_flops=2.4e8, seeds=2,
                   budgets_2c_seeds=1, lrs=(2e-3, 4e-3, 8e-3), lr_widen=1, curve_points=4, curve_windows=8,
                   final_windows=32)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------- arms
DEPTH = {"family": "duplicate", "layer_order": "interleave", "exact": True}


@dataclass(frozen=True)
class Arm:
    """A growth arm: its stages (size names, the last one its final size) and each growth's operator options
    (``family`` plus growth.ops.make_rules options). Each growth happens where the pilot measured the crossover of
    its two sizes' envelopes (``analysis.crossover``)."""

    name: str
    stages: tuple[str, ...]
    ops: tuple[dict, ...]
    what: str


ARMS = (
    Arm("depth-x2", ("L2", "L4"), (DEPTH,),
        "depth x2, 2 -> 4 layers: each block duplicated next to itself, the copy's output projections zeroed "
        "(function preserved)"),
    Arm("multi-1-2-4", ("L1", "L2", "L4"), (DEPTH, DEPTH), "depth 1 -> 2 -> 4 layers, two duplications"),
    Arm("gstack-x4", ("L1", "L4"), ({"family": "duplicate", "layer_order": "stack", "exact": False},),
        "G_stack-style stacking x4 (Du et al. 2024, arXiv 2405.15319): the whole stack repeated, copies exact "
        "(function not preserved)"),
    Arm("width-x2", ("L4n", "L4"),
        ({"family": "duplicate", "pattern": "split", "alpha": 0.75, "symmetry": "noise", "noise_std": 1.0},),
        "width x2, 4 x 32 -> 4 x 64 (heads 2 -> 4): neurons split 0.75 / 0.25 plus zero-sum noise that breaks "
        "the copies' symmetry and keeps the function"),
    Arm("msg-depth", ("L2", "L4"), ({"family": "masked"},),
        "MSG masked depth growth 2 -> 4 (Yao et al. 2023, arXiv 2305.02869): new blocks gated by a mask ramped "
        "0 -> 1 over a quarter of the remaining run"),
    Arm("depth-1-2", ("L1", "L2"), (DEPTH,),
        "depth x2 out of the smallest size, 1 -> 2 layers: growth that ends at L2, short of the target "
        "(the operator of depth-x2)"),
)  # fmt: skip


def arm(name: str) -> Arm:
    """The arm of isoflop-envelope-v1 called ``name`` (KeyError names the arms)."""
    return Settings().arm(name)


# ---------------------------------------------------------------------------------------------------------- runs
@dataclass(frozen=True)
class RunSpec:
    """One training run. ``kind`` 'scratch' (``size`` set) or 'grow' (``arm`` set, ``grow_flops``: the cumulative
    FLOPs after which each growth happens). budget: fraction of C. lr: peak LR. policy: LR schedule after growth;
    moments: Adam-moment policy at growth (growth.ops.apply.OptimizerPolicy); ``symmetry`` overrides the width
    arm's symmetry breaking (a lever: 'none', 'noise', or 'noise:<s.d.>' for another noise scale). phase: 'pilot',
    'main' or 'map'; tag: a lever's name ('' for none)."""

    phase: str
    kind: str
    seed: int
    budget: float
    lr: float
    size: str = ""
    arm: str = ""
    grow_flops: tuple[float, ...] = ()
    policy: str = "continue"
    moments: str = "carry"
    symmetry: str = ""
    tag: str = ""

    @property
    def name(self) -> str:
        """The run's file stem: unique per spec, readable."""
        who = self.size if self.kind == "scratch" else self.arm
        extra = f"-{self.tag}" if self.tag else ""
        pol = f"-{self.policy}" if self.kind == "grow" else ""
        return f"{who}{pol}{extra}-B{self.budget:g}-lr{self.lr:.2e}-s{self.seed}"

    def as_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self)))

    def job(self, s: Settings) -> Job:
        """The Job this run trains by under settings ``s``: its stages' configs, each growth's operator options (the
        ``symmetry`` override applied; the noise and mask seed the run's seed), its steps (``run_steps``)."""
        stages = (self.size,) if self.kind == "scratch" else s.arm(self.arm).stages
        ops = []
        for op in () if self.kind == "scratch" else s.arm(self.arm).ops:
            op = dict(op)
            if self.symmetry:  # 'none', 'noise', or 'noise:<s.d.>' (the noise-scale lever)
                kind, _, std = self.symmetry.partition(":")
                op["symmetry"] = kind
                if std:
                    op["noise_std"] = float(std)
            if op["family"] == "masked" or op.get("symmetry") == "noise":
                op.setdefault("seed", self.seed)
            ops.append(op)
        return Job(tuple(s.config(z) for z in stages), tuple(stages), tuple(ops), tuple(run_steps(s, self)), self.lr,
                   self.seed, self.policy, self.moments, "keep", s)  # fmt: skip


def settings_from_dict(d: dict[str, Any]) -> Settings:
    """The Settings a curve file stores (``Settings.as_dict``), lists back to tuples and arms to ``Arm``."""
    d = {k: v for k, v in d.items() if k not in ("data", "map")}
    d["sizes"] = {z: tuple(v) for z, v in d["sizes"].items()}
    for k in ("budgets", "lrs"):
        d[k] = tuple(d[k])
    if d.get("arms") is not None:
        d["arms"] = tuple(Arm(a["name"], tuple(a["stages"]), tuple(a["ops"]), a["what"]) for a in d["arms"])
    return Settings(**d)


def spec_from_dict(d: dict[str, Any]) -> RunSpec:
    """The RunSpec of a curve file's ``spec`` (lists back to tuples)."""
    d = dict(d)
    d["grow_flops"] = tuple(d.get("grow_flops", ()))
    return RunSpec(**d)


def stage_steps(s: Settings, stages: tuple[str, ...], grow_flops: tuple[float, ...], budget_flops: float) -> list:
    """Optimizer steps of each stage of a growth arm under an equal FLOPs budget (``runs.stage_steps`` with each
    named size's FLOPs per step)."""
    return _stage_steps([s.step_flops(z) for z in stages], grow_flops, budget_flops)


def max_windows(s: Settings, runs: Any) -> int:
    """The most training windows any of ``runs`` reads: (size name, budget x C) pairs of scratch runs
    (``runs.max_windows``)."""
    return _max_windows(((s.step_flops(z), b * s.c_flops) for z, b in runs), s.batch)


def run_steps(s: Settings, spec: RunSpec) -> list[int]:
    """The growth steps and total steps of a run (``[total]`` for a scratch run)."""
    stages = (spec.size,) if spec.kind == "scratch" else s.arm(spec.arm).stages
    return stage_steps(s, stages, spec.grow_flops, spec.budget * s.c_flops)


def lr_grid_next(tried: dict[float, float], widen_left: int) -> float | None:
    """The next LR to try when the best of ``tried`` (LR -> final loss) sits at an edge of the grid: half the
    smallest or twice the largest; None when the best is inside or no widening is left."""
    if widen_left <= 0 or len(tried) < 2:
        return None
    lrs = sorted(tried)
    best = min(tried, key=tried.get)
    if best == lrs[0]:
        return lrs[0] / 2
    if best == lrs[-1]:
        return lrs[-1] * 2
    return None
