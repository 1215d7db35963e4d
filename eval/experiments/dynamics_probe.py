"""Dynamics preservation of an experiment arm's growths, measured in-process on one CPU thread: the logit-step ratio
(eval.metrics.dynamics.logit_step_ratio; DESIGN.md, "Growth dynamics") of each growth operator the arm uses.

The small model is trained ``warm_steps`` AdamW steps (constant LR, the experiment's peak LR) on training batches,
so that Adam's moments are real; it is then grown with the arm's operator and Adam-state policy (moments carried),
and both the small and the grown model take one step on the same next batch at the same LR. 1.0 = the grown model's
function moves exactly as the small model's would.
"""

from __future__ import annotations

import numpy as np
import torch

from growlm.eval.metrics.dynamics import logit_step_ratio, width_divergence
from growlm.growth.ops import make_plan
from growlm.growth.ops.apply import OptimizerPolicy, apply_plan
from growlm.growth.ops.single_process import make_optimizer
from growlm.growth.ops.stores import ModuleStore
from growlm.model.config import GPTConfig
from growlm.model.gpt import GPT


def _batch(train: np.ndarray, gen: np.random.Generator, batch: int, seq_len: int) -> torch.Tensor:
    starts = gen.integers(0, len(train) - seq_len - 1, size=batch)
    return torch.from_numpy(np.stack([train[s : s + seq_len + 1].astype(np.int64) for s in starts]))


def _grow(start: GPTConfig, target: GPTConfig, options: dict, train: np.ndarray, hparams: dict, warm_steps: int,
          batch: int, seq_len: int, seed: int) -> tuple:  # fmt: skip
    """(small, its AdamW, grown, its AdamW, batch generator) after ``warm_steps`` small-model steps and the growth."""
    torch.manual_seed(seed)
    gen = np.random.default_rng(seed)
    small = GPT(start).train()
    opt_s = make_optimizer(small, hparams)
    for _ in range(warm_steps):
        x = _batch(train, gen, batch, seq_len)
        opt_s.zero_grad(set_to_none=True)
        small(x[:, :-1], targets=x[:, 1:]).backward()
        opt_s.step()
    plan = make_plan(start, target, "duplicate", **options)
    big = GPT(plan.new).train()
    opt_b = make_optimizer(big, hparams)
    apply_plan(plan, ModuleStore(small, opt_s), ModuleStore(big, opt_b, step=warm_steps), OptimizerPolicy("carry"))
    return small, opt_s, big, opt_b, gen


def growth_logit_ratio(
    start: GPTConfig,
    target: GPTConfig,
    options: dict,
    train: np.ndarray,
    hparams: dict,
    *,
    warm_steps: int = 20,
    batch: int = 8,
    seq_len: int = 64,
    seed: int = 0,
) -> float:
    """Logit-step ratio of the duplication growth ``start`` -> ``target`` with ``options`` (growth.ops.make_plan),
    after ``warm_steps`` AdamW steps of the small model on batches (batch x seq_len + 1) of ``train`` token ids.

    Args:
        hparams: AdamW lr, betas, eps, weight_decay (growth.ops.single_process.make_optimizer).

    Returns:
        ||delta logits of the grown model|| / ||delta logits of the small model|| for one step (dimensionless).

    Raises:
        growth.errors.GrowthError: the operator cannot reach ``target``.
    """

    small, opt_s, big, opt_b, gen = _grow(start, target, options, train, hparams, warm_steps, batch, seq_len, seed)
    return logit_step_ratio(small, opt_s, big, opt_b, _batch(train, gen, batch, seq_len))


def width_copy_divergence(
    start: GPTConfig,
    target: GPTConfig,
    options: dict,
    train: np.ndarray,
    hparams: dict,
    *,
    after: tuple[int, ...] = (20, 60, 160),
    warm_steps: int = 20,
    batch: int = 8,
    seq_len: int = 64,
    seed: int = 0,
) -> dict[int, dict[str, float]]:
    """How fast the copies of a width growth (n_embd x k) come apart: eval.metrics.dynamics.width_divergence
    (wte, wpe, residual stream, first c_fc block diagonal) after each number of post-growth AdamW steps in
    ``after`` (constant LR), on the same grown model. {steps: {part: divergence}}; 0 = identical copies."""

    k = target.n_embd // start.n_embd
    _, _, big, opt_b, gen = _grow(start, target, options, train, hparams, warm_steps, batch, seq_len, seed)
    probe = _batch(train, gen, batch, seq_len)[:, :-1]
    out, done = {}, 0
    for n in sorted(after):
        for _ in range(n - done):
            x = _batch(train, gen, batch, seq_len)
            opt_b.zero_grad(set_to_none=True)
            big.train()(x[:, :-1], targets=x[:, 1:]).backward()
            opt_b.step()
        done = n
        out[n] = width_divergence(big, probe, k)
    return out
