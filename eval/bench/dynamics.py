"""Training-dynamics metrics of a growth: does the grown model train like the model it was grown from, do its copies
come apart, and how much does a mask ramp cost? Torch only; single process; the caller owns models and optimizers.

The harness that trains a tiny GPT, grows it and measures (``TokenBatches``, ``train_steps``, ``grow_trained``) is
here too: the operator-dynamics benchmark (eval.bench.operator_dynamics) and the tests
(tests/unit/test_growth_dynamics.py) use it.

Definitions (DESIGN.md, "Growth dynamics"):

* **Logit step ratio** (``logit_step_ratio``). Staged training (Shen et al. 2022, arXiv 2203.06211, section 3)
  asks a growth operator to preserve the loss *and* the training dynamics: right after growth the grown model
  should train as the small model would have. We measure the second property on one optimizer step: with the
  same batch and the same LR,

      ratio = || z_big(theta'_big) - z_big(theta_big) ||_2 / || z_small(theta'_small) - z_small(theta_small) ||_2

  where z are the logits (B, T, V) on a probe batch (eval mode) and theta' the parameters after the step. 1.0 is
  perfect preservation; > 1 means the step moves the grown model's function more (a shock), < 1 less.
* **Copy divergence** (``copy_divergence``). After a duplication (width x k) the copies of a tensor along a grown
  axis start equal; how fast they come apart says whether the added width is used. For copies a (copy 0) and b:
  ||a - b||_2 / ((||a||_2 + ||b||_2) / 2); 0 for identical copies, about sqrt(2) = 1.41 for independent random
  copies of equal norm.
* **Ramp loss bump** (``ramp_loss_bump``). A masked growth (MSG, Yao et al. 2023, arXiv 2305.02869) is exact at
  mask value 0 only; the bump is the loss at mask value r minus the loss at 0 with the weights held fixed (no
  training), in nats per token.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from growlm.growth.ops.apply import OptimizerPolicy, apply_rules
from growlm.growth.ops.rules import RuleSet
from growlm.growth.ops.single_process import make_optimizer
from growlm.growth.ops.stores import ModuleStore
from growlm.model.gpt2.model import GPT
from growlm.model.masks import GrowthMaskedModel
from growlm.model.registry import build_model


class TokenBatches:
    """Random training windows of T+1 token ids: ``batch(seed)`` is a (B, T+1) int64 tensor drawn from ``tokens``
    (a 1-D array of ids, e.g. a token folder's train.bin memmap) by a generator seeded with ``seed``, so a batch is a
    pure function of its seed."""

    def __init__(self, tokens: np.ndarray, batch_size: int = 8, seq_len: int = 64) -> None:
        self.tokens, self.b, self.t = tokens, batch_size, seq_len

    def __call__(self, seed: int) -> Tensor:
        starts = np.random.default_rng(seed).integers(0, len(self.tokens) - self.t - 1, self.b)
        return torch.from_numpy(np.stack([self.tokens[s : s + self.t + 1].astype(np.int64) for s in starts]))


def adam_step_of(optimizer: torch.optim.Optimizer) -> int:
    """The Adam step of a torch AdamW that has stepped (every parameter has the same one); 0 before its first step."""
    state = next(iter(optimizer.state.values()), None)
    return 0 if state is None else int(state["step"])


def train_steps(model: GPT, optimizer: torch.optim.Optimizer, batches: Iterable[Tensor]) -> None:
    """One optimizer step of ``model`` (train mode) on each (B, T+1) batch of next-token targets; growth masks, if
    any, follow the Adam step."""
    for x in batches:
        optimizer.zero_grad(set_to_none=True)
        model.train()(x[:, :-1], targets=x[:, 1:]).backward()
        optimizer.step()
        model.set_growth_step(adam_step_of(optimizer))


def grow_trained(
    model: GrowthMaskedModel,
    optimizer: torch.optim.Optimizer,
    plan: RuleSet,
    hparams: dict[str, Any],
    policy: OptimizerPolicy | None = None,
) -> tuple[GrowthMaskedModel, torch.optim.AdamW]:
    """The grown model and its AdamW (``hparams``: lr, betas, eps, weight_decay), grown by ``plan`` from copies of
    ``model`` (GPT-2 or Llama: the grown one is built by ``build_model``) and ``optimizer`` (which are left as they
    were) with the Adam-state ``policy`` (default: the plan's rules); the plan's masks, if any, start their ramp at the
    current Adam step."""
    small, small_opt = clone_training(model, optimizer)
    step = adam_step_of(small_opt)
    masks = None if plan.masks is None else replace(plan.masks, start_step=step)
    big = build_model(plan.new, masks)
    big_opt = make_optimizer(big, hparams)
    apply_rules(plan, ModuleStore(small, small_opt), ModuleStore(big, big_opt, step=step), policy)
    return big, big_opt


def _lm_loss(model: GPT, batch: Tensor) -> Tensor:
    """Mean next-token cross-entropy (nats per token) of ``batch`` (B, T+1) int64: inputs [:, :-1], targets [:, 1:]."""
    return model(batch[:, :-1], targets=batch[:, 1:])


def clone_training(model: GPT, optimizer: torch.optim.Optimizer) -> tuple[GPT, torch.optim.Optimizer]:
    """Independent copies of a model and its optimizer (state included), the optimizer stepping the copied
    parameters. (A new optimizer with ``load_state_dict(opt.state_dict())`` would share the moment tensors with
    ``opt``: a step of the copy would change the original's exp_avg / exp_avg_sq.)"""
    return copy.deepcopy((model, optimizer))


def logit_change(model: GPT, optimizer: torch.optim.Optimizer, batch: Tensor, probe: Tensor | None = None) -> float:
    """Take one optimizer step of ``model`` on ``batch`` and return the L2 norm of the change of its logits.

    Args:
        model: the model (its parameters are updated in place; dropout acts as in training).
        optimizer: its optimizer, with the LR of the step already set in its param groups.
        batch: token ids (B, T+1) int64; the step minimises the next-token loss of batch[:, :-1] -> batch[:, 1:].
        probe: token ids (B', T') at which the logits are compared (eval mode); default batch[:, :-1].

    Returns:
        ||logits_after - logits_before||_2 over the whole (B', T', V) probe tensor, in logit units (fp64 sum).
    """
    probe = batch[:, :-1] if probe is None else probe
    was_training = model.training
    with torch.no_grad():
        before = model.eval()(probe).double()
    model.train(was_training)
    optimizer.zero_grad(set_to_none=True)
    _lm_loss(model, batch).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        after = model.eval()(probe).double()
    model.train(was_training)
    return (after - before).norm().item()


def logit_step_ratio(
    small_model: GPT,
    small_opt: torch.optim.Optimizer,
    grown_model: GPT,
    grown_opt: torch.optim.Optimizer,
    batch: Tensor,
    probe: Tensor | None = None,
) -> float:
    """Dynamics preservation of a growth on one step: the logit change of one optimizer step on the grown model
    divided by that of the same step on the small model (module docstring; Shen et al. 2022, section 3).

    Both models take one step on the same ``batch`` (B, T+1) with the LR their optimizers hold (set them to the
    same LR position first); logits are compared on ``probe`` (default the batch inputs). Both models and
    optimizers are modified (one step each): pass copies (``clone_training``) to keep the originals.

    Returns:
        The ratio (dimensionless; 1.0 = the step moves both functions equally).

    Raises:
        ValueError: the small model's step does not change its logits (zero LR or zero gradient).
    """
    d_small = logit_change(small_model, small_opt, batch, probe)
    if d_small == 0.0:
        raise ValueError("the small model's step did not change its logits (LR 0?); set a nonzero LR")
    return logit_change(grown_model, grown_opt, batch, probe) / d_small


def copy_divergence(t: Tensor, n_copies: int = 2, dim: int = -1) -> float:
    """Relative difference of the copies of ``t`` along ``dim`` (module docstring): ``t`` is split into
    ``n_copies`` equal chunks c_0 .. c_{k-1} and the result is the mean over i >= 1 of
    ||c_i - c_0|| / ((||c_i|| + ||c_0||) / 2). E.g. wte (V, 2d) with n_copies=2 compares [:, :d] with [:, d:].

    Returns:
        The divergence (dimensionless; 0 = identical copies, ~1.41 = independent copies). 0.0 if all are zero.

    Raises:
        ValueError: n_copies < 2 or the axis length is not a multiple of n_copies.
    """
    if n_copies < 2 or t.shape[dim] % n_copies:
        raise ValueError(f"cannot split an axis of length {t.shape[dim]} into n_copies={n_copies} equal copies")
    chunks = [c.double() for c in t.detach().chunk(n_copies, dim=dim)]
    out = []
    for c in chunks[1:]:
        scale = (c.norm() + chunks[0].norm()).item() / 2
        out.append((c - chunks[0]).norm().item() / scale if scale > 0 else 0.0)
    return sum(out) / len(out)


def residual_divergence(model: GPT, idx: Tensor, n_copies: int = 2) -> float:
    """``copy_divergence`` of the residual stream: the hidden states (B, T, d) entering ln_f, for token ids ``idx``
    (B, T) int64, split along d into ``n_copies`` copies (eval mode, no gradient)."""
    seen: list[Tensor] = []
    hook = model.transformer.ln_f.register_forward_hook(lambda _m, args, _out: seen.append(args[0].detach()))
    try:
        with torch.no_grad():
            model.eval().hidden_states(idx)
    finally:
        hook.remove()
    return copy_divergence(seen[0], n_copies)


def width_divergence(model: GPT, idx: Tensor, n_copies: int = 2) -> dict[str, float]:
    """Copy divergence of a width-grown model: ``wte``, ``wpe`` (along d), ``residual`` (hidden states before ln_f
    on ``idx``) and ``c_fc`` (the first block's c_fc weight, (d, F): its diagonal copies [:d, :F/k] vs
    [d/k.., F/k..] for k = 2 and in general the mean over copies of the block diagonal)."""
    d, f = model.config.n_embd // n_copies, model.config.ffn_dim // n_copies
    w = model.transformer.h[0].mlp.c_fc.weight.detach()
    diag = torch.cat([w[i * d : (i + 1) * d, i * f : (i + 1) * f] for i in range(n_copies)], dim=-1)
    return {
        "wte": copy_divergence(model.transformer.wte.weight, n_copies),
        "wpe": copy_divergence(model.transformer.wpe.weight, n_copies),
        "residual": residual_divergence(model, idx, n_copies),
        "c_fc": copy_divergence(diag, n_copies),
    }


def ramp_loss_bump(model: GPT, batch: Tensor, values: tuple[float, ...] = (1.0,)) -> list[float]:
    """Loss bump of a mask ramp without training: for each mask value r in ``values``, loss(r) - loss(0) on
    ``batch`` (B, T+1) int64, in nats per token, the weights held fixed (MSG, Yao et al. 2023; module docstring).

    The model must carry growth masks (a masked-family growth, ``GPT.growth_masks``); it is not modified (a copy
    is moved along the ramp).

    Raises:
        ValueError: the model has no growth masks.
    """
    spec = model.growth_masks
    if spec is None:
        raise ValueError("the model has no growth masks; grow it with the masked family (growth.ops.make_rules)")
    probe = copy.deepcopy(model).eval()

    def loss_at(r: float) -> float:
        probe.set_growth_step(spec.start_step + round(r * spec.ramp_steps))
        with torch.no_grad():
            return _lm_loss(probe, batch).item()

    base = loss_at(0.0)
    out = []
    for r in values:
        if probe.growth_masks is None:  # reaching 1 removed the masks; start again from a fresh copy
            probe = copy.deepcopy(model).eval()
        out.append(loss_at(r) - base)
    return out
