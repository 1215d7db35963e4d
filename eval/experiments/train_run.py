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
from growlm.eval.experiments.runs import Job, flops_per_step
from growlm.growth.ops import make_rules
from growlm.growth.ops.apply import OptimizerPolicy
from growlm.growth.ops.schedule_rule import ScheduleRule
from growlm.growth.ops.single_process import from_modules, grow_state, make_optimizer, to_modules
from growlm.model.registry import build_model
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
def window_losses(model: Any, windows: torch.Tensor, device: str, chunk: int = 64) -> np.ndarray:
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


def train_run(s: Any, spec: Any, data: Path) -> dict[str, Any]:
    """Train one run (``spec.job(s)``: a RunSpec under Settings, or a runs.Run under a plan.Context) and return its
    curve: {'points': [{step, tokens, flops, train_loss, val_loss, lr}], 'final': {'val_loss', 'val_se', 'windows'},
    'growth': [{step, flops, to, loss_before, loss_after, wall_s}], 'wall_s', 'steps', 'machine'
    (runtime.machine.device_description: where wall_s was measured)}. val_loss of the last point is on
    ``final_windows`` windows; its standard error is the windows' s.d. / sqrt(n). Single-threaded use is up to the
    caller (torch.set_num_threads).

    Raises:
        ValueError: the budget would read the data a third time, or a growth point leaves no step.
    """
    return train_job(spec.job(s), data)


def train_job(job: Job, data: Path) -> dict[str, Any]:
    """``train_run`` of a resolved Job (runs.Job)."""
    t0 = time.perf_counter()
    t = job.train
    win = Windows(data, t.seq_len, t.batch)
    total, grow_at = job.steps[-1], list(job.steps[:-1])
    starts = [0, *grow_at]
    step_costs = [(a, flops_per_step(c, t.seq_len, t.batch)) for a, c in zip(starts, job.configs, strict=True)]
    cum = cumulative_flops(step_costs, total)
    points_at = set(eval_steps(step_costs, total, t.curve_points))
    curve_val = win.val(t.curve_windows)
    device = t.device

    torch.manual_seed(job.seed)
    model = build_model(job.configs[0]).to(device)
    opt = make_optimizer(model, {"lr": job.lr, **HPARAMS})
    sched = fresh_schedule(total, t.warmup_frac)
    points, growth, losses = [], [], []
    stage = 0
    for step in range(1, total + 1):
        lr = job.lr * sched.ratio(step - 1)
        for g in opt.param_groups:
            g["lr"] = lr * g.get("lr_scale", 1.0)
        x = win.batch(job.seed, step - 1).to(device)
        loss = model(x[:, :-1], targets=x[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        sched = replace(sched, last_batch_iteration=sched.last_batch_iteration + 1)
        model.set_growth_step(step)
        losses.append(loss.detach().item())
        if step in points_at:
            val = window_losses(model, win.val(t.final_windows) if step == total else curve_val, device)
            points.append({"step": step, "tokens": step * t.batch * t.seq_len, "flops": float(cum[step - 1]),
                           "train_loss": float(np.mean(losses)), "val_loss": float(val.mean()), "lr": lr})  # fmt: skip
            losses = []
            if step == total:
                final = {"val_loss": float(val.mean()), "val_se": float(val.std(ddof=1) / math.sqrt(len(val))),
                         "windows": len(val)}  # fmt: skip
        if stage < len(grow_at) and step == grow_at[stage]:
            tg = time.perf_counter()
            before = float(window_losses(model, curve_val, device).mean())
            model, opt, sched = grow(job, stage, model, opt, sched, total)
            after = float(window_losses(model, curve_val, device).mean())
            growth.append({"step": step, "flops": float(cum[step - 1]), "to": job.stage_names[stage + 1],
                           "loss_before": before, "loss_after": after, "wall_s": time.perf_counter() - tg})  # fmt: skip
            stage += 1
    return {"points": points, "final": final, "growth": growth, "steps": list(job.steps),
            "wall_s": time.perf_counter() - t0, "machine": device_description(device)}  # fmt: skip


def grow(job: Job, stage: int, model, opt, sched: ScheduleState, total: int):
    """Grow the run's model from stage ``stage`` to the next with growlm's operators: the whole training state
    (weights, exp_avg / exp_avg_sq, Adam step, schedule position, masks) through grow_state. Returns (model, AdamW,
    schedule) of the grown model; the LR policy 'rewarm' re-warms linearly over rewarm_frac of the run; the LR rule
    'mup' scales the hidden matrices' LR after a width growth (``Job``)."""
    opts = dict(job.ops[stage])
    family = opts.pop("family")
    old_cfg, new_cfg = job.configs[stage], job.configs[stage + 1]
    plan = make_rules(old_cfg, new_cfg, family, **opts)
    _adam_state_to(opt, "cpu")  # the growth runs on CPU tensors
    scales = [g.get("lr_scale", 1.0) for g in opt.param_groups]
    state = from_modules(model.cpu(), opt, schedule=sched)
    rewarm = max(2, round(job.train.rewarm_frac * total)) if job.policy == "rewarm" else 0
    rule = ScheduleRule(kind="continue", rewarm_steps=rewarm, rewarm_from="zero")
    grown = grow_state(state, plan, policy=OptimizerPolicy(moments=job.moments), schedule=rule)
    new_sched = grown.schedule
    model, opt, _ = to_modules(replace(grown, schedule=None))
    if len(scales) == len(opt.param_groups):
        for g, k in zip(opt.param_groups, scales, strict=True):
            g["lr_scale"] = k
    if job.lr_rule == "mup" and new_cfg.n_embd != old_cfg.n_embd:
        opt = _hidden_lr_scaled(model, opt, old_cfg.n_embd / new_cfg.n_embd)
    model = model.to(job.train.device)
    _adam_state_to(opt, job.train.device)  # AdamW state follows its parameters
    return model, opt, new_sched


EMBEDDINGS = ("wte", "wpe", "embed", "lm_head")  # names of the 2-D parameters that are not hidden matrices


def _hidden_lr_scaled(model, opt: torch.optim.Optimizer, factor: float) -> torch.optim.Optimizer:
    """The optimizer with the hidden matrices (2-D parameters but the embeddings and the LM head) in a group of
    their own whose ``lr_scale`` is multiplied by ``factor``; every parameter keeps its AdamW state."""
    hidden = {id(p) for n, p in model.named_parameters() if p.ndim >= 2 and not any(e in n for e in EMBEDDINGS)}
    groups = []
    for g in opt.param_groups:
        rest = {k: v for k, v in g.items() if k != "params"}
        for inside in (True, False):
            ps = [p for p in g["params"] if (id(p) in hidden) == inside]
            if ps:
                k = rest.get("lr_scale", 1.0) * (factor if inside else 1.0)
                groups.append({**rest, "params": ps, "lr_scale": k})
    new = torch.optim.AdamW(groups)
    for p, st in opt.state.items():
        new.state[p] = st
    return new


def _adam_state_to(opt: torch.optim.Optimizer, device: str) -> None:
    """Move AdamW's exp_avg / exp_avg_sq to ``device`` in place (the step counter stays a CPU tensor)."""
    for st in opt.state.values():
        for k, v in st.items():
            if torch.is_tensor(v) and k != "step":
                st[k] = v.to(device)
