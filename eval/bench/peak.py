"""The peak a benchmark's MFU is measured against: a table of GPU datasheet figures, or a measured CPU matmul peak.

MFU = achieved model FLOP/s per device / peak FLOP/s per device (DESIGN.md, section Evaluation; PaLM, Chowdhery et
al. 2022, arXiv 2204.02311, appendix B). On a GPU the peak is the vendor's dense (no 2:4 sparsity) tensor-core
figure for fp16/bf16; for fp32 it is the plain fp32 figure, because PyTorch leaves TF32 matmuls off by default. On a
CPU there is no trustworthy datasheet number, so the peak is measured: the best of a few square matmuls in the run's
dtype with the thread count one rank uses.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

# dense TFLOP/s per GPU (NVIDIA datasheets, SXM parts); matched by substring of torch.cuda.get_device_name()
GPU_PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0},
    "H100": {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0},
    "A100": {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5},
}

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Peak:
    """Peak FLOP/s of one device (a GPU, or the cores one CPU rank uses) and where the number comes from."""

    flops_per_s: float
    source: str  # e.g. "table: NVIDIA H200 dense bf16" or "measured: 1024^3 fp32 matmul, 1 thread"


def gpu_table_peak(device_name: str, precision: str) -> Peak | None:
    """The datasheet peak for a GPU named ``device_name`` at ``precision`` ('fp32', 'bf16', 'fp16'), or None."""
    for key, peaks in GPU_PEAK_TFLOPS.items():
        if key in device_name.upper():
            return Peak(peaks[precision] * 1e12, f"table: {key} dense {precision} {peaks[precision]:g} TFLOP/s")
    return None


def measure_matmul_peak(precision: str, threads: int, device: str = "cpu", n: int = 1024, repeats: int = 7) -> Peak:
    """Best FLOP/s of an (n, n) x (n, n) matrix product in ``precision`` on ``device`` with ``threads`` CPU threads.

    The best (not the mean) of ``repeats`` timed products after two warm-up ones, each timed both as ``a @ b`` and
    as ``torch.nn.functional.linear`` (the model's own op: on a CPU without native bf16 the two take different
    kernels, and the matmul one can be slower than what the model reaches): a peak, so that noise from other
    processes lowers it as little as possible. One product is 2 n^3 FLOPs. The torch thread count is restored.
    """
    dtype = DTYPES[precision]
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        best = float("inf")
        for op in (torch.matmul, torch.nn.functional.linear):
            for i in range(repeats + 2):
                if device != "cpu":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                op(a, b)
                if device != "cpu":
                    torch.cuda.synchronize()
                if i >= 2:
                    best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(old_threads)
    where = f"{threads} thread{'s' if threads > 1 else ''}" if device == "cpu" else device
    return Peak(2 * n**3 / best, f"measured: {n}^3 {precision} matmul/linear, {where}")


def device_peak(precision: str, threads: int, peak_tflops: float | None = None) -> Peak:
    """The peak of one rank's device: ``peak_tflops`` if given, else the GPU table, else a measured matmul peak."""
    if peak_tflops is not None:
        return Peak(peak_tflops * 1e12, f"given: {peak_tflops:g} TFLOP/s")
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        table = gpu_table_peak(name, precision)
        if table is not None:
            return table
        return measure_matmul_peak(precision, threads, device="cuda", n=8192, repeats=5)
    return measure_matmul_peak(precision, threads)
