"""The training step: micro batches, gradient accumulation, the optimizer step, and the fixed-batch loss.

``Progress`` is the run's state in memory (engine, shape, step, data position, growth bookkeeping); ``train_step``
advances it by one optimizer step. Every rank calls these functions with the same arguments (they are collectives).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from growlm.data.sampler import ResumableSampler, TokenWindows, micro_batch_start
from growlm.model.config import GPTConfig, flops_per_token
from growlm.runtime import collectives, stop
from growlm.runtime.dist import DistInfo
from growlm.runtime.schedule import ScheduleState, apply_rewarm


@dataclass
class Progress:
    """Where the run stands; mutated by the step loop, growth events and restore.

    Attributes:
        engine: the DeepSpeed engine (replaced at each growth).
        model: the model shape of ``engine``.
        step: optimizer steps taken (DeepSpeed's global step).
        consumed: training sequences consumed, all ranks (the data position).
        consumed_flops: model FLOPs trained so far (model.config.flops_per_token per token; growth changes it).
        stage_index: growth-plan stages done.
        schedule: the LR schedule a growth placed (re-warm included), or None: the ds_config's own schedule.
        slope_points: (cumulative FLOPs, validation loss) since the last growth: the slope trigger's history.
        history: growths this model went through (RunState.growth), oldest first.
        extra: keys of the resumed growlm_state.json this version does not know, written back unchanged.
    """

    engine: Any
    model: GPTConfig
    step: int
    consumed: int = 0
    consumed_flops: int = 0
    stage_index: int = 0
    schedule: ScheduleState | None = None
    slope_points: list[tuple[float, float]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Batches:
    """This rank's training batches: sample windows in the resumable order, split into micro batches.

    ``micro`` sequences per micro batch, ``gas`` micro batches per optimizer step (gradient accumulation), over
    ``info.world_size`` ranks: a global batch of ``micro * gas * world_size`` sequences of ``seq_len`` tokens.
    """

    windows: TokenWindows
    sampler: ResumableSampler
    micro: int
    gas: int
    info: DistInfo

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step, all ranks."""
        return self.micro * self.gas * self.info.world_size

    @property
    def seq_len(self) -> int:
        """Tokens per training sequence T."""
        return self.windows.seq_len

    def micro_batch(self, consumed: int, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets, each [micro, seq_len] (int64) on this rank's device, of micro batch ``j`` of the step
        that starts at ``consumed`` samples. On CUDA they are copied from pinned host memory without blocking (the
        copy overlaps the work queued before it)."""
        start = micro_batch_start(consumed, self.micro, j, self.info.rank, self.info.world_size)
        x, y = self.windows.batch(self.sampler.sample_ids(start, self.micro))
        if self.info.device.type == "cuda":
            return x.pin_memory().to(self.info.device, non_blocking=True), y.pin_memory().to(
                self.info.device, non_blocking=True
            )
        return x.to(self.info.device), y.to(self.info.device)


@dataclass(frozen=True)
class StepResult:
    """One optimizer step: mean loss over ranks and micro batches, the LR it used, the gradient norm (nan when
    DeepSpeed reports none), when it started (``time.perf_counter``), and the signal every rank agreed at this step
    to stop for (``runtime.stop.agreed``; 0: none)."""

    loss: float
    lr: float
    grad_norm: float
    started: float
    stop_signal: int = 0


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of ``t`` over all ranks (a collective), returned on the CPU."""
    return collectives.all_reduce(t, device="cpu")


def agree_stop() -> int:
    """The signal the ranks stop for, from every rank's requests (``runtime.stop.votes``; a collective), 0 when no
    rank has one. The step loop gets the same answer with its loss (``train_step``); this is for the moments
    between: before the first step, before the evaluation after training."""
    return stop.agreed(all_reduce_sum(torch.tensor(stop.votes(), dtype=torch.float64)).tolist())


def fixed_batch_loss(engine: Any, x: torch.Tensor, y: torch.Tensor, info: DistInfo) -> float:
    """Eval-mode loss of one batch per rank, averaged over ranks (the loss-preservation check of a growth)."""
    engine.eval()
    with torch.no_grad():
        loss = engine(x, y).detach().double().cpu()
    engine.train()
    return float(all_reduce_sum(loss)) / info.world_size


def flops_per_step(cfg: GPTConfig, data: Batches) -> int:
    """Model FLOPs of one optimizer step of a model of shape ``cfg`` (all ranks)."""
    return flops_per_token(cfg, data.seq_len) * data.global_batch * data.seq_len


def _stage0_grad_norm(engine: Any) -> float:
    """The global gradient norm, computed here for ZeRO stage 0 in fp32 (where DeepSpeed reports none)."""
    grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))


def train_step(p: Progress, data: Batches, *, own_grad_norm: bool) -> StepResult:
    """One optimizer step over ``data.gas`` micro batches; advances ``p`` (step, data position, FLOPs, mask ramp,
    re-warm). ``own_grad_norm``: compute the gradient norm here (ZeRO stage 0 in fp32)."""
    started = time.perf_counter()
    engine = p.engine
    lr = engine.get_lr()[0]  # the LR this step uses
    loss_sum = torch.zeros(
        (), dtype=torch.float64, device=data.info.device
    )  # summed on the device: no sync per micro batch
    stage0_norm = math.nan
    for j in range(data.gas):
        x, y = data.micro_batch(p.consumed, j)
        loss = engine(x, y)
        engine.backward(loss)
        if j == data.gas - 1 and own_grad_norm:
            stage0_norm = _stage0_grad_norm(engine)
        engine.step()
        loss_sum += loss.detach().double()
        del loss  # its graph holds the parameters (and, through them, a grown-away engine)
    p.step, p.consumed = p.step + 1, p.consumed + data.global_batch
    p.consumed_flops += flops_per_step(p.model, data)
    engine.module.set_growth_step(p.step)  # mask ramp (no-op without masks; removes them at 1)
    if p.schedule is not None:
        apply_rewarm(engine, p.schedule, p.step)
    # the stop requests ride with the loss in the one all-reduce of the step: every rank learns of a request on any
    # rank here, at the same step (runtime.stop); built on the device, copied there only when there is a request
    packed = torch.zeros(1 + len(stop.STOP_SIGNALS), dtype=torch.float64, device=loss_sum.device)
    packed[0] = loss_sum / data.gas
    votes = stop.votes()
    if any(votes):
        packed[1:] = torch.tensor(votes, dtype=torch.float64)
    summed = all_reduce_sum(packed).tolist()
    mean_loss = summed[0] / data.info.world_size
    grad_norm = engine.get_global_grad_norm()
    return StepResult(
        mean_loss, lr, float(grad_norm) if grad_norm is not None else stage0_norm, started, stop.agreed(summed[1:])
    )
