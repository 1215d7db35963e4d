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

from growlm.eval.metrics.dynamics import TokenBatches, grow_trained, logit_step_ratio, train_steps, width_divergence
from growlm.growth.ops import make_rules
from growlm.growth.ops.apply import OptimizerPolicy
from growlm.growth.ops.single_process import make_optimizer
from growlm.model.config import GPTConfig
from growlm.model.gpt import GPT


def _grow(start: GPTConfig, target: GPTConfig, options: dict, train: np.ndarray, hparams: dict, warm_steps: int,
          batch: int, seq_len: int, seed: int) -> tuple:  # fmt: skip
    """(small, its AdamW, grown, its AdamW, batches, next seed) after ``warm_steps`` small-model steps on batches
    ``seed, seed + 1, ...`` and the duplication growth (moments carried)."""
    torch.manual_seed(seed)
    batches = TokenBatches(train, batch, seq_len)
    small = GPT(start).train()
    opt_s = make_optimizer(small, hparams)
    train_steps(small, opt_s, (batches(seed + i) for i in range(warm_steps)))
    plan = make_rules(start, target, "duplicate", **options)
    big, opt_b = grow_trained(small, opt_s, plan, hparams, OptimizerPolicy("carry"))
    return small, opt_s, big, opt_b, batches, seed + warm_steps


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
    """Logit-step ratio of the duplication growth ``start`` -> ``target`` with ``options`` (growth.ops.make_rules),
    after ``warm_steps`` AdamW steps of the small model on batches (batch x seq_len + 1) of ``train`` token ids.

    Args:
        hparams: AdamW lr, betas, eps, weight_decay (growth.ops.single_process.make_optimizer).

    Returns:
        ||delta logits of the grown model|| / ||delta logits of the small model|| for one step (dimensionless).

    Raises:
        growth.errors.GrowthError: the operator cannot reach ``target``.
    """

    small, opt_s, big, opt_b, batches, nxt = _grow(start, target, options, train, hparams, warm_steps, batch, seq_len,
                                                   seed)  # fmt: skip
    return logit_step_ratio(small, opt_s, big, opt_b, batches(nxt))


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
    _, _, big, opt_b, batches, nxt = _grow(start, target, options, train, hparams, warm_steps, batch, seq_len, seed)
    probe = batches(nxt)[:, :-1]
    out, done = {}, 0
    for n in sorted(after):
        train_steps(big, opt_b, (batches(nxt + 1 + i) for i in range(done, n)))
        done = n
        out[n] = width_divergence(big, probe, k)
    return out
