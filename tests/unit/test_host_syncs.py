"""The training loop reads device values back once per log interval, not once per step (trainer.run.train,
trainer.loop.train_step / sync_steps), and the values it logs are the ones a read per step gave.

A fake engine (a tiny torch model with SGD behind DeepSpeed's engine calls) trains in this process over a one-rank
gloo group; every read of a tensor's value made by growlm's trainer or runtime code is counted.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from growlm.model.config import from_preset
from growlm.runtime import collectives, stop
from growlm.runtime.dist import DistInfo
from growlm.trainer import run as run_mod
from growlm.trainer.logger import MetricsLogger
from growlm.trainer.loop import Progress

PACKAGE_DIRS = (f"{Path(run_mod.__file__).parent}", f"{Path(collectives.__file__).parent}")
READS = ("tolist", "item", "__float__", "__int__", "numpy")


@pytest.fixture(scope="module")
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class FakeEngine:
    """DeepSpeed's engine calls the loop makes, over a 2-parameter model trained by SGD; the gradient norm is
    reported as a float32 tensor, as DeepSpeed's ZeRO optimizers do."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.module = torch.nn.Sequential(torch.nn.Embedding(16, 4), torch.nn.Linear(4, 16))
        self.module.set_growth_step = lambda step: None
        self.module.growth_masks = None
        self.opt = torch.optim.SGD(self.module.parameters(), lr=0.1)
        self.optimizer = SimpleNamespace()  # no loss scaler: loss_scale_of gives 1.0
        self.skipped_steps = 0
        self._norm = None

    def __call__(self, x, y):
        logits = self.module(x)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())

    def backward(self, loss):
        loss.backward()

    def step(self):
        self._norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in self.module.parameters()]))
        self.opt.step()
        self.opt.zero_grad()

    def get_lr(self):
        return [0.1]

    def get_global_grad_norm(self):
        return self._norm

    def train(self):
        pass


class FakeData:
    micro, gas, seq_len = 2, 2, 8
    info = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    global_batch = micro * gas

    def micro_batch(self, consumed: int, j: int):
        g = torch.Generator().manual_seed(1000 * consumed + j)
        t = torch.randint(0, 16, (self.micro, self.seq_len + 1), generator=g)
        return t[:, :-1], t[:, 1:]


def reference_values(steps: int) -> tuple[list[float], list[float]]:
    """Each step's loss and gradient norm as the loop computed them before: read back after every step."""
    engine, data = FakeEngine(), FakeData()
    losses, norms = [], []
    for s in range(steps):
        loss_sum = torch.zeros((), dtype=torch.float64)
        for j in range(data.gas):
            x, y = data.micro_batch(s * data.global_batch, j)
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            loss_sum += loss.detach().double()
        losses.append(float(loss_sum / data.gas) / 1)  # the per-step all-reduce over one rank, / world size
        norms.append(float(engine.get_global_grad_norm()))
    return losses, norms


def run_loop(tmp_path: Path, monkeypatch, steps: int, log_interval: int, stop_at: int | None = None):
    """Train ``steps`` steps at ``log_interval``; returns (reads of tensor values by growlm, all-reduces, the
    train records of metrics.jsonl, the TrainEnd). ``stop_at``: a SIGTERM request after that step."""
    reads, reduces = [], []
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _original=original, _name=name, **k):
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(PACKAGE_DIRS):
                reads.append(_name)
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    real_all_reduce = collectives.all_reduce

    def counted_all_reduce(t, *a, **k):
        reduces.append(t.numel())
        return real_all_reduce(t, *a, **k)

    monkeypatch.setattr(collectives, "all_reduce", counted_all_reduce)
    if stop_at is not None:
        real_step = run_mod.train_step

        def step_then_request(p, *a, **k):
            taken = real_step(p, *a, **k)
            if p.step == stop_at:
                stop.request(signal.SIGTERM, "test")
            return taken

        monkeypatch.setattr(run_mod, "train_step", step_then_request)
    cfg = SimpleNamespace(max_steps=steps, zero_stage=1, precision="fp32", seq_len=FakeData.seq_len, save_steps=set(),
                          eval_interval=0, growth=None, stop_before_stage=None, final_save=False,
                          save_dir=tmp_path / "checkpoints")  # fmt: skip
    p = Progress(engine=FakeEngine(), model=from_preset("tiny"), step=0)
    log = MetricsLogger(tmp_path, enabled=True, log_interval=log_interval, max_steps=steps)
    try:
        _, end = run_mod.train(p, cfg, FakeData(), None, log, None)
    finally:
        log.close()
        stop.reset()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return reads, reduces, [r for r in records if r["event"] == "train"], end, records


@pytest.mark.parametrize(("steps", "log_interval"), [(12, 4), (10, 4), (6, 1)])
def test_one_host_sync_per_log_interval_and_the_same_logged_values(
    tmp_path, monkeypatch, one_rank_group, steps, log_interval
):
    reads, reduces, train, end, _ = run_loop(tmp_path, monkeypatch, steps, log_interval)
    intervals = -(-steps // log_interval)  # the last, shorter interval ends at --max_steps
    # one read before training (the stop agreement) and one per interval: never one per step
    assert reads == ["tolist"] * (1 + intervals)
    assert len(reduces) == 1 + intervals
    assert end.status == 0 and [r["step"] for r in train] == list(range(1, steps + 1))
    losses, norms = reference_values(steps)
    assert [r["loss"] for r in train] == losses  # bit for bit: the same float64 arithmetic
    assert [r["grad_norm"] for r in train] == norms
    assert all(r["step_time_s"] > 0 and r["loss_scale"] == 1.0 for r in train)


def test_a_stop_request_is_agreed_at_the_next_sync(tmp_path, monkeypatch, one_rank_group):
    reads, _, train, end, records = run_loop(tmp_path, monkeypatch, 12, 4, stop_at=5)
    assert end.status == 128 + signal.SIGTERM
    assert [r["step"] for r in train] == list(range(1, 9))  # requested after step 5, agreed at step 8
    assert records[-1]["event"] == "interrupt" and records[-1]["step"] == 8
    assert reads == ["tolist"] * 3
