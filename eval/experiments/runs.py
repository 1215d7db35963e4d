"""What a run is, independent of the experiment that asks for it (pure; no torch at import).

A ``Job`` is everything a run trains by, resolved: the model config of each stage, each growth's operator options,
the steps, the LR, the seed and the policies, and the settings every run shares. Two runs with the same Job and the
same token folder are the same run, whichever experiment planned them: ``job_key`` is that identity, and
``runner.Store`` finds a finished run by it among this experiment's curves and those it imports (the curves of
earlier experiments, in their own format), so a run is never trained twice.

A ``Run`` is a spec-file experiment's run (eval.experiments.spec): its stages are shapes named ``D<n_layer>W<n_embd>``
(the spec's head rule gives the rest), its budget and growth points are multiples of the experiment's B.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

TRAIN_FIELDS = ("seq_len", "batch", "warmup_frac", "rewarm_frac", "curve_points", "curve_windows", "final_windows",
                "device")  # fmt: skip


@dataclass(frozen=True)
class Job:
    """Everything one run trains by, resolved: the model config of each stage (any family of model.registry) and its
    name (``stage_names``), the operator options of each growth (``family`` plus growth.ops.make_rules options, the
    noise seed included), the global step after which each growth happens and then the total step count
    (``steps``), the peak LR, the seed (init and batch order), the LR policy after growth ('continue' | 'rewarm'),
    the Adam-moment policy ('carry' | 'reset'), the LR rule after a width growth ('keep' | 'mup': the hidden
    matrices' LR times old n_embd / new n_embd, Yang et al. 2021, arXiv 2203.03466, table 3), and the settings every
    run shares (``train``: an object with the ``TRAIN_FIELDS``)."""

    configs: tuple[Any, ...]
    stage_names: tuple[str, ...]
    ops: tuple[dict, ...]
    steps: tuple[int, ...]
    lr: float
    seed: int
    policy: str = "continue"
    moments: str = "carry"
    lr_rule: str = "keep"
    train: Any = None


def job_key(job: Job) -> str:
    """The identity of a run (canonical JSON): configs, operators, steps, LR (12 significant digits), seed, policies
    and the shared settings; stage names are labels and do not enter it."""
    return json.dumps({"configs": [c.to_dict() for c in job.configs], "ops": list(job.ops), "steps": list(job.steps),
                       "lr": float(f"{job.lr:.12g}"), "seed": job.seed, "policy": job.policy,
                       "moments": job.moments, "lr_rule": job.lr_rule,
                       "train": {k: getattr(job.train, k) for k in TRAIN_FIELDS}}, sort_keys=True)  # fmt: skip


def stage_steps(costs: list[int], grow_flops: tuple[float, ...], budget_flops: float) -> list[int]:
    """Optimizer steps of each stage under an equal FLOPs budget: stage i (``costs[i]`` FLOPs per step) trains until
    the run has spent ``grow_flops[i]`` FLOPs (rounded to whole steps, at least one), the last stage spends what is
    left of the budget.

    Returns: the global step after which each growth happens, then the total step count (len(costs) values).

    Raises:
        ValueError: growth points that do not increase, or that leave the last stage no step.
    """
    if len(grow_flops) != len(costs) - 1:
        raise ValueError(f"{len(costs)} stages need {len(costs) - 1} growth points, got {len(grow_flops)}")
    if len(costs) == 1:
        return [max(1, round(budget_flops / costs[0]))]
    steps, spent, prev_f, step = [], 0.0, 0.0, 0
    for cost, f in zip(costs, grow_flops, strict=False):
        if f <= prev_f:
            raise ValueError(f"growth points {list(grow_flops)} must increase")
        n = max(1, round((f - spent) / cost))
        step += n
        spent += n * cost
        steps.append(step)
        prev_f = f
    n_last = round((budget_flops - spent) / costs[-1])
    if n_last < 1:
        raise ValueError(f"the small stages spend {spent:.3e} of {budget_flops:.3e} FLOPs; grow earlier")
    return [*steps, step + n_last]


def max_windows(runs: Any, batch: int) -> int:
    """The most training windows any of ``runs`` reads (steps x batch): each a scratch run given as (FLOPs per step,
    budget in FLOPs), its steps as ``stage_steps`` counts them. The one bound every protocol's data check uses."""
    return max(stage_steps([cost], (), budget)[-1] for cost, budget in runs) * batch


SHAPE_NAME = re.compile(r"D(\d+)W(\d+)")


def shape_name(shape: tuple[int, int]) -> str:
    """'D<n_layer>W<n_embd>'."""
    return f"D{shape[0]}W{shape[1]}"


def parse_shape(name: str) -> tuple[int, int]:
    """(n_layer, n_embd) of a 'D<n_layer>W<n_embd>' name.

    Raises:
        ValueError: not such a name.
    """
    m = SHAPE_NAME.fullmatch(name)
    if not m:
        raise ValueError(f"{name!r} is not a shape name D<n_layer>W<n_embd>")
    return int(m[1]), int(m[2])


@dataclass(frozen=True)
class Run:
    """One run of a spec-file experiment. phase: the curve folder ('pilot', 'screen', 'main', 'bracket'); stages:
    shape names, the last the final shape; budget and grow_at: multiples of B; arm: the spec's arm ('' for a scratch
    run); policy, lr_rule, moments: as ``Job``; tag: a label that keeps two runs' files apart."""

    phase: str
    seed: int
    budget: float
    lr: float
    stages: tuple[str, ...]
    grow_at: tuple[float, ...] = ()
    arm: str = ""
    policy: str = "continue"
    lr_rule: str = "keep"
    moments: str = "carry"
    tag: str = ""

    @property
    def name(self) -> str:
        """The run's file stem: unique per run of one experiment, readable."""
        if not self.arm:
            return f"{self.stages[0]}-B{self.budget:g}-lr{self.lr:.3e}-s{self.seed}"
        g = "_".join(f"{x:g}" for x in self.grow_at)
        extra = f"-{self.tag}" if self.tag else ""
        return (f"{self.arm}-{'-'.join(self.stages)}-g{g}-{self.policy}-{self.lr_rule}{extra}-B{self.budget:g}-"
                f"lr{self.lr:.3e}-s{self.seed}")  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self)))

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Run:
        """The Run of a curve file's ``spec`` (lists back to tuples).

        Raises:
            TypeError, ValueError: not a Run's fields.
        """
        d = dict(d)
        for k in ("stages", "grow_at"):
            d[k] = tuple(d.get(k, ()))
        run = Run(**d)
        for z in run.stages:
            parse_shape(z)
        return run

    def job(self, ctx: Any) -> Job:
        """The Job of this run under an experiment ``ctx`` (``plan.Context``: its spec and B)."""
        from growlm.eval.experiments.spec import shape_config  # lazy: torch, only where a run's configs are built

        spec = ctx.spec
        configs = tuple(shape_config(spec, parse_shape(z)) for z in self.stages)
        ops = ()
        if self.arm:
            op = dict(spec.arms[self.arm].op)
            if op["family"] == "masked" or op.get("symmetry") == "noise":
                op.setdefault("seed", self.seed)
            ops = (op,) * (len(self.stages) - 1)
        t = spec.train
        costs = [flops_per_step(c, t.seq_len, t.batch) for c in configs]
        steps = stage_steps(costs, tuple(g * ctx.budget_flops for g in self.grow_at), self.budget * ctx.budget_flops)
        return Job(configs, self.stages, ops, tuple(steps), self.lr, self.seed, self.policy, self.moments,
                   self.lr_rule, t)  # fmt: skip


def flops_per_step(cfg: Any, seq_len: int, batch: int) -> int:
    """Training FLOPs of one optimizer step: model.config.flops_per_token (6 N + attention) x batch x seq_len."""
    from growlm.model.config import flops_per_token  # lazy: torch

    return flops_per_token(cfg, seq_len) * batch * seq_len


def same_data(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two curves' ``data`` fingerprints name the same token folder (the split checksums)."""
    keys = ("vocab_size", "train_sha256", "val_sha256")
    return a is not None and b is not None and all(a.get(k) == b.get(k) for k in keys)
