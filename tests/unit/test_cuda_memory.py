"""A live growth's CUDA memory numbers: the peak statistic is reset when the growth starts, so the peak is the
growth's own; allocated and reserved bytes before and after; None everywhere without CUDA. CUDA's counters are
replaced by a scripted allocator (no GPU here)."""

from __future__ import annotations

import pytest
import torch

from growlm.growth.live import grow as engine
from growlm.runtime.process_memory import (
    CUDA_MEMORY_KEYS,
    cuda_max_allocated_bytes,
    finish_cuda_peak,
    peak_rss_bytes,
    start_cuda_peak,
)


class FakeCuda:
    """torch.cuda's memory counters for a run whose allocations are scripted: ``alloc``/``free`` in bytes."""

    def __init__(self) -> None:
        self.allocated, self.reserved, self.peak, self.peak_reserved, self.resets = 0, 0, 0, 0, 0

    def alloc(self, n: int) -> None:
        self.allocated += n
        self.reserved = max(self.reserved, self.allocated)
        self.peak, self.peak_reserved = max(self.peak, self.allocated), max(self.peak_reserved, self.reserved)

    def free(self, n: int) -> None:
        self.allocated -= n

    def reset(self) -> None:
        self.resets += 1
        self.peak, self.peak_reserved = self.allocated, self.reserved


@pytest.fixture
def fake_cuda(monkeypatch):
    f = FakeCuda()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: f.allocated)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: f.reserved)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: f.peak)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: f.peak_reserved)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: f.reset())
    return f


def test_the_peak_is_the_growths_own(fake_cuda):
    fake_cuda.alloc(1000)
    fake_cuda.free(600)  # the run's earlier peak: 1000 bytes
    mem = start_cuda_peak()
    assert fake_cuda.resets == 1
    assert mem["cuda_allocated_bytes_before"] == 400 and mem["cuda_reserved_bytes_before"] == 1000
    fake_cuda.alloc(300)  # the growth's gathered buffers and the new engine: peak 700, under the run's 1000
    fake_cuda.free(100)
    out = finish_cuda_peak(mem)
    assert out["cuda_peak_allocated_bytes"] == 700 and out["cuda_peak_reserved_bytes"] == 1000
    assert out["cuda_allocated_bytes_after"] == 600 and out["cuda_reserved_bytes_after"] == 1000
    assert set(out) == set(CUDA_MEMORY_KEYS)
    assert cuda_max_allocated_bytes() == 700


def test_the_old_engines_cached_blocks_are_released(fake_cuda, monkeypatch):
    """Device blocks and pinned host blocks (an offloaded optimizer's fp32 partitions and CPU-Adam state) both go
    back once the old engine is freed."""
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append("device"))
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator.memory, "empty_host_cache", lambda: emptied.append("pinned host"))
    result = engine.GrowthResult(engine=None, masks=None, schedule=None, loss_scaler=None, seconds=1.0, bytes_moved=0)
    fake_cuda.alloc(500)
    out = engine.collect_old_engine(result)
    assert emptied == ["device", "pinned host"]
    assert out.cuda_memory["cuda_allocated_bytes_after"] == 500


def test_without_cuda_every_number_is_none_and_rss_is_the_hosts(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert finish_cuda_peak(start_cuda_peak()) == dict.fromkeys(CUDA_MEMORY_KEYS)
    assert cuda_max_allocated_bytes() is None


def test_a_cpu_run_on_a_gpu_node_creates_no_cuda_context(monkeypatch):
    def no_context(*args):
        raise AssertionError("a CUDA counter was read in a process that never initialised CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, no_context)
    assert finish_cuda_peak(start_cuda_peak()) == dict.fromkeys(CUDA_MEMORY_KEYS)
    assert cuda_max_allocated_bytes() is None
    assert peak_rss_bytes() > 2**20  # this interpreter's resident memory, in bytes (Linux reports KiB)
