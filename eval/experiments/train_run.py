"""One run of the IsoFLOP experiment, in this process: growlm's GPT, torch AdamW in growlm's param groups, growlm's
WarmupCosineLR arithmetic (runtime.schedule), and for growth arms growlm's whole-state growth
(growth.ops.single_process.grow_state: weights, Adam moments and step, schedule position, masks), the code path
live growth and growlm-grow use, without DeepSpeed's runtime. Returns the run's compact curve.

Data (``Windows``): a seed's run reads non-overlapping (seq_len + 1)-token windows of train.bin in an order drawn
from its seed, so every run of one seed (any size, any arm) reads the same batches in the same order; a run that
would read the data more than twice is refused. Validation: windows at evenly spaced offsets over all of val.bin.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from growlm.data.tokens import open_tokens
from growlm.eval.experiments.protocol import RunSpec, Settings, run_steps
from growlm.growth.ops import make_rules
from growlm.growth.ops.apply import OptimizerPolicy
from growlm.growth.ops.schedule_rule import ScheduleRule
from growlm.growth.ops.single_process import from_modules, grow_state, make_optimizer, to_modules
from growlm.model.gpt2.model import GPT
from growlm.runtime.machine import device_description
from growlm.runtime.schedule import FIRST_ITERATION, ScheduleState

HPARAMS = {"betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
GRAD_CLIP = 1.0


class Windows:
    """Training batches and validation windows of a token folder (``train.bin`` / ``val.bin``, uint16 or uint32 ids).

    ``batch(seed, k)``: the k-th (batch, seq_len + 1) int64 batch of seed ``seed``: windows perm[k B : (k+1) B]
    of a seeded permutation of the train split's non-overlapping windows (a second permutation continues it, once).
    ``val(n)``: n (n, seq_len + 1) windows starting at evenly spaced offsets over the whole val split.

    Raises (``batch``): ValueError when a run would read past the second pass over the data.
    """

    def __init__(self, folder: Path, seq_len: int, batch: int) -> None:
        self.train = open_tokens(folder, "train")  # uint16 or uint32, as meta.json says
        self.val_tokens = open_tokens(folder, "val")
        self.t, self.b = seq_len, batch
        self.n = (len(self.train) - 1) // seq_len
        self._perm: dict[int, np.ndarray] = {}

    def _order(self, seed: int) -> np.ndarray:
        if seed not in self._perm:
            rng = np.random.default_rng([seed, 7])
            self._perm[seed] = np.concatenate([rng.permutation(self.n), rng.permutation(self.n)])
        return self._perm[seed]

    def batch(self, seed: int, k: int) -> torch.Tensor:
        order = self._order(seed)
        idx = order[k * self.b : (k + 1) * self.b]
        if len(idx) < self.b:
            raise ValueError(f"batch {k} of {self.b} windows reads the training data a third time; lower the budget")
        return torch.from_numpy(
            np.stack([self.train[i * self.t : i * self.t + self.t + 1] for i in idx]).astype(np.int64)
        )

    def val(self, n: int) -> torch.Tensor:
        starts = np.linspace(0, len(self.val_tokens) - self.t - 1, n).astype(np.int64)
        return torch.from_numpy(np.stack([self.val_tokens[s : s + self.t + 1] for s in starts]).astype(np.int64))


@torch.no_grad()
def window_losses(model: GPT, windows: torch.Tensor, device: str, chunk: int = 64) -> np.ndarray:
    """Mean next-token cross-entropy of each window (n, T+1) -> (n,) nats per token, eval mode."""
    model.eval()
    out = []
    for i in range(0, len(windows), chunk):
        w = windows[i : i + chunk].to(device)
        logits = model(w[:, :-1])
        ce = F.cross_entropy(logits.float().flatten(0, 1), w[:, 1:].flatten(), reduction="none")
        out.append(ce.view(len(w), -1).mean(1).cpu().numpy())
    model.train()
    return np.concatenate(out).astype(np.float64)


def fresh_schedule(total_steps: int, warmup_frac: float) -> ScheduleState:
    """A linear-warm-up cosine schedule over ``total_steps`` optimizer steps that decays to 0: DeepSpeed
    WarmupCosineLR arithmetic, started at FIRST_ITERATION, so step k trains at ratio(lbi = k); with
    total_num_steps = total_steps + 2 the last step trains at a small positive LR (1 - cos(pi / n)) / 2 of the peak,
    n the steps after warm-up, and the LR would reach 0 one step later."""
    warmup = max(2, round(warmup_frac * total_steps))
    return ScheduleState(total_num_steps=total_steps + 2, warmup_num_steps=warmup, last_batch_iteration=FIRST_ITERATION,
                         warmup_min_ratio=0.0, cos_min_ratio=0.0, warmup_type="linear")  # fmt: skip


def eval_steps(step_costs: list[tuple[int, int]], total: int, points: int) -> list[int]:
    """Steps after which the curve gets a validation point: evenly spaced in FLOPs (``points`` of them, the last
    one the final step). ``step_costs``: (first step of a stage, FLOPs per step) in order."""
    cum = cumulative_flops(step_costs, total)
    targets = [cum[-1] * (i + 1) / points for i in range(points)]
    return sorted({int(np.searchsorted(cum, t - 1e-6)) + 1 for t in targets} | {total})


def cumulative_flops(step_costs: list[tuple[int, int]], total: int) -> np.ndarray:
    """FLOPs spent after each step 1..total (index k-1 for step k)."""
    per = np.zeros(total)
    for i, (start, cost) in enumerate(step_costs):
        end = step_costs[i + 1][0] if i + 1 < len(step_costs) else total
        per[start:end] = cost
    return np.cumsum(per)


def train_run(s: Settings, spec: RunSpec, data: Path) -> dict[str, Any]:
    """Train one run and return its curve: {'points': [{step, tokens, flops, train_loss, val_loss, lr}], 'final':
    {'val_loss', 'val_se', 'windows'}, 'growth': [{step, flops, loss_before, loss_after, wall_s}], 'wall_s',
    'steps', 'machine' (runtime.machine.device_description: where wall_s was measured)}. val_loss of the last point
    is on ``final_windows`` windows; its standard error is the windows' s.d. / sqrt(n). Single-threaded use is up to
    the caller (torch.set_num_threads).

    Raises:
        ValueError: the budget would read the data a third time, or a growth point leaves no step.
    """
    t0 = time.perf_counter()
    win = Windows(data, s.seq_len, s.batch)
    steps = run_steps(s, spec)
    total = steps[-1]
    grow_at = steps[:-1]
    stages = (spec.size,) if spec.kind == "scratch" else s.arm(spec.arm).stages
    starts = [0, *grow_at]
    step_costs = [(a, s.step_flops(size)) for a, size in zip(starts, stages, strict=True)]
    cum = cumulative_flops(step_costs, total)
    points_at = set(eval_steps(step_costs, total, s.curve_points))
    curve_val = win.val(s.curve_windows)
    device = s.device

    torch.manual_seed(spec.seed)
    model = GPT(s.config(stages[0])).to(device)
    hp = {"lr": spec.lr, **HPARAMS}
    opt = make_optimizer(model, hp)
    sched = fresh_schedule(total, s.warmup_frac)
    points, growth, losses = [], [], []
    stage = 0
    for step in range(1, total + 1):
        lr = spec.lr * sched.ratio(step - 1)
        for g in opt.param_groups:
            g["lr"] = lr
        x = win.batch(spec.seed, step - 1).to(device)
        loss = model(x[:, :-1], targets=x[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        sched = replace(sched, last_batch_iteration=sched.last_batch_iteration + 1)
        model.set_growth_step(step)
        losses.append(loss.detach().item())
        if step in points_at:
            val = window_losses(model, win.val(s.final_windows) if step == total else curve_val, device)
            points.append({"step": step, "tokens": step * s.batch * s.seq_len, "flops": float(cum[step - 1]),
                           "train_loss": float(np.mean(losses)), "val_loss": float(val.mean()), "lr": lr})  # fmt: skip
            losses = []
            if step == total:
                final = {"val_loss": float(val.mean()), "val_se": float(val.std(ddof=1) / math.sqrt(len(val))),
                         "windows": len(val)}  # fmt: skip
        if stage < len(grow_at) and step == grow_at[stage]:
            tg = time.perf_counter()
            before = float(window_losses(model, curve_val, device).mean())
            model, opt, sched = grow(s, spec, stage, model, opt, sched, step, total)
            after = float(window_losses(model, curve_val, device).mean())
            growth.append({"step": step, "flops": float(cum[step - 1]), "to": stages[stage + 1],
                           "loss_before": before, "loss_after": after, "wall_s": time.perf_counter() - tg})  # fmt: skip
            stage += 1
    return {"points": points, "final": final, "growth": growth, "steps": steps,
            "wall_s": time.perf_counter() - t0, "machine": device_description(s.device)}  # fmt: skip


def grow(s: Settings, spec: RunSpec, stage: int, model: GPT, opt, sched: ScheduleState, step: int, total: int):
    """Grow the run's model from stage ``stage`` to the next with growlm's operators: the whole training state
    (weights, exp_avg / exp_avg_sq, Adam step, schedule position, masks) through grow_state. Returns (model, AdamW,
    schedule) of the grown model; the LR policy 'rewarm' re-warms linearly over rewarm_frac of the run."""
    a = s.arm(spec.arm)
    opts = dict(a.ops[stage])
    family = opts.pop("family")
    if spec.symmetry:  # 'none', 'noise', or 'noise:<s.d.>' (the noise-scale lever)
        kind, _, std = spec.symmetry.partition(":")
        opts["symmetry"] = kind
        if std:
            opts["noise_std"] = float(std)
    if family == "duplicate" and opts.get("symmetry") == "noise":
        opts.setdefault("seed", spec.seed)
    if family == "masked":
        opts.setdefault("seed", spec.seed)
    old_cfg, new_cfg = s.config(a.stages[stage]), s.config(a.stages[stage + 1])
    plan = make_rules(old_cfg, new_cfg, family, **opts)
    _adam_state_to(opt, "cpu")  # the growth runs on CPU tensors
    state = from_modules(model.cpu(), opt, schedule=sched)
    rewarm = max(2, round(s.rewarm_frac * total)) if spec.policy == "rewarm" else 0
    rule = ScheduleRule(kind="continue", rewarm_steps=rewarm, rewarm_from="zero")
    grown = grow_state(state, plan, policy=OptimizerPolicy(moments=spec.moments), schedule=rule)
    new_sched = grown.schedule
    model, opt, _ = to_modules(replace(grown, schedule=None))
    model = model.to(s.device)
    _adam_state_to(opt, s.device)  # AdamW state follows its parameters
    return model, opt, new_sched


def _adam_state_to(opt: torch.optim.Optimizer, device: str) -> None:
    """Move AdamW's exp_avg / exp_avg_sq to ``device`` in place (the step counter stays a CPU tensor)."""
    for st in opt.state.values():
        for k, v in st.items():
            if torch.is_tensor(v) and k != "step":
                st[k] = v.to(device)
