"""The scaling-law growth advisor: FLOPs accounting per stage, Kaplan-form loss curves fitted to short runs, and a
growth proposal (where to grow and what it saves).

Pure functions of numbers (numpy only); no training, no files. The trigger itself (smoothed log-log slope of the
validation curve against compute) is ``growth.stages.trigger.loglog_slope`` / ``slope_trigger`` with the thresholds
``growth.stages.trigger.SLOPE_THRESHOLDS``; this module predicts where it will fire and what a growth there saves.

Constants and their sources:
* Kaplan et al. 2020 ("Scaling Laws for Neural Language Models", arXiv 2001.08361), as used by the staged-training
  seed (DESIGN.md, "When to grow"): L(N) = (N_c / N)^alpha_N with N_c = 8.8e13 non-embedding parameters and alpha_N =
  0.076 (their eq. 1.1); L(N, S) = (N_c / N)^alpha_N + (S_c / S_min)^alpha_S with S_c = 2.1e3 steps and alpha_S = 0.76
  (eq. 1.6 / table 2; the seed writes 2 S_c / S, doubling S_c for training at the critical batch, which is
  S_min = S / 2 there); B_crit(L) = B_* / L^(1/alpha_B) with B_* = 2.1e8 tokens and alpha_B = 0.21 (eq. 1.4);
  C = 6 N B S (section 2.1). Kaplan's L is in nats per token of *their* 50,257-token BPE on WebText2; our CPU
  runs use other data and vocabularies, so the planner fits the constants to our own short runs and keeps only the
  functional forms (and, by default, Kaplan's exponents).
* Slope thresholds -0.0575 (depth), -0.0475 (width), -0.03 (both): Shen et al.
  2022 ("Staged Training for Transformer Language Models", arXiv 2203.06211), section 4
  (DESIGN.md, "When to grow"); in growth.stages.trigger.
* constant_op (S' = S / constant_op on the target schedule): 1.4 depth, 1.8 width, 2.5 both, measured by the
  staged-training seed (DESIGN.md, "What growth carries"); in growth.ops.schedule_rule.CONSTANT_OP.
* FLOPs per token 6N + 12 L H Q T: PaLM (Chowdhery et al. 2022, arXiv 2204.02311) appendix B;
  model.config.flops_per_token.

Compute saving (DESIGN.md, "When to grow"): (C_target at the loss reached - C spent to reach it with growth) / C_target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from growlm.model.config import GPTConfig, flops_per_token

KAPLAN_N_C = 8.8e13  # non-embedding parameters; Kaplan et al. 2020 eq. 1.1
KAPLAN_ALPHA_N = 0.076
KAPLAN_S_C = 2.1e3  # optimizer steps; Kaplan et al. 2020 eq. 1.6, table 2
KAPLAN_ALPHA_S = 0.76
KAPLAN_B_STAR = 2.1e8  # tokens; Kaplan et al. 2020 eq. 1.4
KAPLAN_ALPHA_B = 0.21


def kaplan_loss_n(n_params: float) -> float:
    """L(N) = (N_c / N)^alpha_N: converged loss of an N-parameter model (nats/token, Kaplan's data)."""
    return (KAPLAN_N_C / n_params) ** KAPLAN_ALPHA_N


def kaplan_loss_ns(n_params: float, steps: float, n_c: float = KAPLAN_N_C, s_c: float = KAPLAN_S_C) -> float:
    """L(N, S) = (N_c / N)^alpha_N + (S_c / S)^alpha_S, S in optimizer steps at the critical batch."""
    return (n_c / n_params) ** KAPLAN_ALPHA_N + (s_c / steps) ** KAPLAN_ALPHA_S


def critical_batch_tokens(loss: float) -> float:
    """B_crit(L) = B_* / L^(1 / alpha_B), in tokens."""
    return KAPLAN_B_STAR / loss ** (1 / KAPLAN_ALPHA_B)


def kaplan_compute(n_params: float, batch_tokens: float, steps: float) -> float:
    """C = 6 N B S (FLOPs), Kaplan's estimate without the attention term."""
    return 6 * n_params * batch_tokens * steps


# ----- FLOPs accounting per stage ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageCompute:
    """One stage of a run: its model, steps and FLOPs (per token, in the stage, cumulative at its end)."""

    config: GPTConfig
    steps: int
    flops_per_token: int
    flops: int
    cumulative_flops: int


def stage_flops(stages: Sequence[tuple[GPTConfig, int]], tokens_per_step: int, seq_len: int) -> list[StageCompute]:
    """FLOPs of a staged run: stage i trains ``config_i`` for ``steps_i`` optimizer steps of ``tokens_per_step``
    tokens (global batch x seq_len); each token costs flops_per_token(config_i, seq_len) = 6N + 12 L H Q T.

    Raises:
        ValueError: a negative step count, or seq_len beyond a stage's n_positions.
    """
    out, total = [], 0
    for cfg, steps in stages:
        if steps < 0:
            raise ValueError(f"a stage cannot run {steps} steps")
        per_tok = flops_per_token(cfg, seq_len)
        f = per_tok * tokens_per_step * steps
        total += f
        out.append(StageCompute(cfg, steps, per_tok, f, total))
    return out


# ----- Kaplan-form curve fits ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepCurve:
    """L(S) = floor + (s_c / S)^alpha: the Kaplan L(N, S) form for one model (floor = (N_c / N)^alpha_N).

    ``flops_per_step`` converts steps to compute (C = flops_per_step * S)."""

    floor: float
    s_c: float
    alpha: float
    flops_per_step: float
    rmse: float = 0.0

    def loss(self, steps: float | np.ndarray) -> float | np.ndarray:
        return self.floor + (self.s_c / np.asarray(steps, dtype=float)) ** self.alpha

    def steps_to(self, loss: float) -> float | None:
        """Steps at which the curve reaches ``loss``; None if it never does (loss <= floor)."""
        if loss <= self.floor:
            return None
        return self.s_c / (loss - self.floor) ** (1 / self.alpha)

    def slope(self, steps: float) -> float:
        """d log10 L / d log10 C at ``steps`` (C is proportional to S): -alpha (L - floor) / L."""
        loss = float(self.loss(steps))
        return -self.alpha * (loss - self.floor) / loss

    def steps_at_slope(self, threshold: float) -> float | None:
        """Steps at which the slope flattens to ``threshold`` (< 0); None if it never gets that steep."""
        ratio = -threshold / self.alpha  # (L - floor) / L at the threshold
        if not 0 < ratio < 1 or self.floor <= 0:
            return None
        return self.steps_to(self.floor / (1 - ratio))

    def n_c(self, n_params: float, alpha_n: float = KAPLAN_ALPHA_N) -> float:
        """N_c implied by the fitted floor: floor = (N_c / N)^alpha_N."""
        return n_params * self.floor ** (1 / alpha_n)


def fit_step_curve(
    steps: Sequence[float],
    losses: Sequence[float],
    flops_per_step: float,
    alpha: float | None = KAPLAN_ALPHA_S,
    alphas: Sequence[float] = tuple(np.linspace(0.05, 2.0, 79)),
) -> StepCurve:
    """Least-squares fit of L(S) = floor + (s_c / S)^alpha to a short run's validation losses.

    For a fixed alpha the model is linear in (floor, s_c^alpha); with ``alpha=None`` alpha is also fitted by a grid
    search over ``alphas`` (Kaplan's 0.76 is the default, a short CPU run rarely pins it down). floor is kept >= 0.

    Raises:
        ValueError: fewer than 3 points, non-positive steps, or lengths differ.
    """
    s, y = np.asarray(steps, dtype=float), np.asarray(losses, dtype=float)
    if s.shape != y.shape or s.size < 3:
        raise ValueError(f"need >= 3 (step, loss) points of equal count, got {s.size} and {y.size}")
    if (s <= 0).any():
        raise ValueError("steps must be positive")
    best = None
    for a in [alpha] if alpha is not None else alphas:
        x = s**-a
        design = np.stack([np.ones_like(x), x], axis=1)
        (floor, b), *_ = np.linalg.lstsq(design, y, rcond=None)
        if floor < 0:  # refit through a zero floor
            floor, b = 0.0, float(x @ y / (x @ x))
        b = max(b, 1e-12)
        rmse = float(np.sqrt(np.mean((floor + b * x - y) ** 2)))
        if best is None or rmse < best[3]:
            best = (float(floor), b ** (1 / a), a, rmse)
    floor, s_c, a, rmse = best
    return StepCurve(floor, s_c, a, flops_per_step, rmse)


# ----- the proposal ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GrowthProposal:
    """Where to grow the small model (in its optimizer steps) and what the fitted curves predict it saves."""

    slope_step: float | None  # where the smoothed slope reaches the threshold (staged training's trigger)
    slope_saving: float | None
    best_step: float | None  # the step that maximises the predicted saving
    best_saving: float | None
    threshold: float


def predicted_saving(small: StepCurve, target: StepCurve, grow_step: float, target_steps: float) -> float | None:
    """Saving of growing at ``grow_step`` to reach the target's loss at ``target_steps``, assuming the grown model
    continues on the target's curve from the same loss (loss- and dynamics-preserving growth, DESIGN.md, "Growth
    operators"):

        saving = (C_t(S_eq) - C_s(S_g)) / C_t(S_total), S_eq = target steps to the small model's loss at S_g.

    None when the target never reaches the small model's loss or the small model is not better than the start.
    """
    loss = float(small.loss(grow_step))
    s_eq = target.steps_to(loss)
    if s_eq is None or s_eq >= target_steps:
        return None
    c_target = target.flops_per_step * target_steps
    return (target.flops_per_step * s_eq - small.flops_per_step * grow_step) / c_target


def propose_growth(small: StepCurve, target: StepCurve, target_steps: float, threshold: float) -> GrowthProposal:
    """The slope-trigger step (Shen et al. 2022's schedule) and the saving-maximising step of the fitted curves.

    At the maximum, d C_small / d L = d C_target / d L at the growth loss: the small model stops being the cheaper
    way down, which is what the slope threshold approximates without a target curve.
    """
    slope_step = small.steps_at_slope(threshold)
    grid = np.geomspace(1, max(2.0, target_steps * target.flops_per_step / small.flops_per_step), 400)
    savings = [(predicted_saving(small, target, g, target_steps), g) for g in grid]
    valid = [(s, g) for s, g in savings if s is not None]
    best_saving, best_step = max(valid) if valid else (None, None)
    return GrowthProposal(
        slope_step,
        predicted_saving(small, target, slope_step, target_steps) if slope_step else None,
        best_step,
        best_saving,
        threshold,
    )
