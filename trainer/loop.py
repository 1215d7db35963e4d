"""The training step: micro batches, gradient accumulation, the optimizer step, and the fixed-batch loss.

``Progress`` is the run's state in memory (engine, shape, step, data position, growth bookkeeping); ``train_step``
advances it by one optimizer step and leaves its loss and gradient norm on the device; ``sync_steps`` reads the steps
since the last sync back in one all-reduce and one copy (the run does it once per log interval and where a decision
needs a value: DESIGN.md, "Data flow of a run"). Every rank calls these functions with the same arguments (they are
collectives).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from growlm.data.sampler import ResumableSampler, TokenWindows, micro_batch_start
from growlm.model.config import ModelConfig, flops_per_token
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
    model: ModelConfig
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
class StepTaken:
    """One optimizer step as the device left it: nothing of it has been read back to the host yet.

    Attributes:
        step: the optimizer step just taken (1 for the first).
        loss: this rank's mean loss over its micro batches, a float64 scalar on the rank's device.
        grad_norm: the global gradient norm, a float64 scalar on the rank's device (nan when DeepSpeed reports
            none and this step computed none).
        lr: the LR the step used.
        started: ``time.perf_counter()`` when the step began.
        ended: ``time.perf_counter()`` when its host work ended (on a GPU its kernels may still run).
    """

    step: int
    loss: torch.Tensor
    grad_norm: torch.Tensor
    lr: float
    started: float
    ended: float


@dataclass(frozen=True)
class SyncedSteps:
    """What one host sync (``sync_steps``) read back for the steps taken since the previous one.

    Attributes:
        losses: per step, the mean loss over ranks and micro batches (the same float64 arithmetic as one
            all-reduce per step would give).
        grad_norms: per step, the global gradient norm (nan where none was reported).
        stop_signal: the signal every rank agreed to stop for (``runtime.stop.agreed``; 0: none).
        synced: ``time.perf_counter()`` when the values were on the host.
    """

    losses: list[float]
    grad_norms: list[float]
    stop_signal: int
    synced: float


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of ``t`` over all ranks (a collective), returned on the CPU."""
    return collectives.all_reduce(t, device="cpu")


def agree_stop() -> int:
    """The signal the ranks stop for, from every rank's requests (``runtime.stop.votes``; a collective), 0 when no
    rank has one. The step loop gets the same answer with its losses (``sync_steps``); this is for the moments
    between: before the first step, before the evaluation after training."""
    return stop.agreed(all_reduce_sum(torch.tensor(stop.votes(), dtype=torch.float64)).tolist())


def fixed_batch_loss(engine: Any, x: torch.Tensor, y: torch.Tensor, info: DistInfo) -> float:
    """Eval-mode loss of one batch per rank, averaged over ranks (the loss-preservation check of a growth)."""
    engine.eval()
    with torch.no_grad():
        loss = engine(x, y).detach().double().cpu()
    engine.train()
    return float(all_reduce_sum(loss)) / info.world_size


def flops_per_step(cfg: ModelConfig, data: Batches) -> int:
    """Model FLOPs of one optimizer step of a model of shape ``cfg`` (all ranks)."""
    return flops_per_token(cfg, data.seq_len) * data.global_batch * data.seq_len


def _stage0_grad_norm(engine: Any) -> torch.Tensor:
    """The global gradient norm, computed here for ZeRO stage 0 in fp32 (where DeepSpeed reports none): a scalar on
    the gradients' device, not read back."""
    grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


def _device_scalar(value: Any, device: torch.device) -> torch.Tensor:
    """``value`` (a tensor, a Python number or None) as a float64 scalar on ``device``, without reading a device
    tensor back (None: nan). A float64 holds a float32's or a Python float's value exactly."""
    if value is None:
        return torch.full((), math.nan, dtype=torch.float64, device=device)
    if torch.is_tensor(value):
        return value.detach().reshape(()).to(device=device, dtype=torch.float64)
    return torch.tensor(float(value), dtype=torch.float64, device=device)


def train_step(p: Progress, data: Batches, *, own_grad_norm: bool) -> StepTaken:
    """One optimizer step over ``data.gas`` micro batches; advances ``p`` (step, data position, FLOPs, mask ramp,
    re-warm). ``own_grad_norm``: compute the gradient norm here (ZeRO stage 0 in fp32).

    Reads nothing back from the device: the loss and the gradient norm stay there (``StepTaken``) until
    ``sync_steps`` reads a log interval's steps at once. Makes no collective of its own (DeepSpeed's make theirs).
    """
    started = time.perf_counter()
    engine = p.engine
    lr = engine.get_lr()[0]  # the LR this step uses
    device = data.info.device
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)  # summed on the device: no sync per micro batch
    stage0_norm = None
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
    grad_norm = engine.get_global_grad_norm()
    norm = _device_scalar(grad_norm if grad_norm is not None else stage0_norm, device)
    return StepTaken(p.step, loss_sum / data.gas, norm, lr, started, time.perf_counter())


def sync_steps(steps: list[StepTaken], info: DistInfo) -> SyncedSteps:
    """The one host sync of a log interval (a collective: every rank calls it at the same step with the same number
    of steps): one all-reduce carries every step's loss, rank 0's gradient norms and every rank's stop requests
    (``runtime.stop``), and one copy brings them to the host. So every rank learns of a stop request on any rank
    here, at the same step.

    Args:
        steps: the steps taken since the previous sync, oldest first (may be empty: the stop requests only).
        info: this rank.

    Returns:
        ``SyncedSteps``: each step's mean loss over ranks (sum over ranks / world size, in float64 as before), its
        gradient norm (rank 0's value, exactly: the other ranks add zeros), the agreed stop signal.
    """
    n = len(steps)
    packed = torch.zeros(2 * n + len(stop.STOP_SIGNALS), dtype=torch.float64, device=info.device)
    if n:
        packed[:n] = torch.stack([s.loss for s in steps])
        if info.rank == 0:  # the norm is global (every rank has it): sent by one rank so the sum is exact
            packed[n : 2 * n] = torch.stack([s.grad_norm for s in steps])
    votes = stop.votes()
    if any(votes):
        packed[2 * n :] = torch.tensor(votes, dtype=torch.float64)
    summed = all_reduce_sum(packed).tolist()  # the host sync
    return SyncedSteps(
        [v / info.world_size for v in summed[:n]], summed[n : 2 * n], stop.agreed(summed[2 * n :]), time.perf_counter()
    )
