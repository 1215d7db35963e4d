"""The peak a benchmark's MFU is measured against: a table of GPU datasheet figures, or a measured CPU matmul peak.

MFU = achieved model FLOP/s per device / peak FLOP/s per device (DESIGN.md, section Evaluation; PaLM, Chowdhery et
al. 2022, arXiv 2204.02311, appendix B). On a GPU the peak is the vendor's dense (no 2:4 sparsity) tensor-core
figure for bf16/fp16; an fp32 run is measured against the plain fp32 (CUDA-core) figure, because PyTorch leaves
TF32 matmuls off by default (``torch.backends.cuda.matmul.allow_tf32``), and growlm does not turn them on; the
table's ``tf32`` figure is there for a run that does. GPUs are looked up by their exact name as
``torch.cuda.get_device_name()`` reports it: the SXM, PCIe and NVL parts of one chip differ by up to a quarter in
clocks and so in peak, and a name not in the table gets no peak (MFU null) rather than another part's. On a CPU there
is no trustworthy datasheet number, so the peak is measured: the best of a few square matmuls in the run's dtype
with the thread count one rank uses.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import torch

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class GpuPeaks:
    """Dense peak TFLOP/s of one GPU part by precision ('bf16', 'fp16', 'tf32': tensor cores without sparsity;
    'fp32': plain CUDA cores), and the datasheet they come from (``halved``: it gives tensor-core figures with
    sparsity only, and these are half of them)."""

    part: str
    tflops: dict[str, float]
    datasheet: str
    halved: bool = False


def _hopper(part: str, sparse_16: float, sparse_tf32: float, fp32: float, datasheet: str) -> GpuPeaks:
    """A Hopper part from its datasheet, which gives tensor-core figures with sparsity only ("specifications are
    one-half lower without sparsity"): bf16/fp16 ``sparse_16`` and tf32 ``sparse_tf32`` are halved; ``fp32`` as
    given."""
    tflops = {"bf16": sparse_16 / 2, "fp16": sparse_16 / 2, "tf32": sparse_tf32 / 2, "fp32": fp32}
    return GpuPeaks(part, tflops, datasheet, halved=True)


_A100_DATASHEET = "NVIDIA A100 Tensor Core GPU datasheet"


def _a100(part: str) -> GpuPeaks:
    """An A100 part: its datasheet gives every A100 (40/80 GB, PCIe/SXM) the same dense figures."""
    return GpuPeaks(part, {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}, _A100_DATASHEET)


_H100 = "NVIDIA H100 Tensor Core GPU datasheet"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet"

# exact torch.cuda.get_device_name() strings (the driver's product names) -> datasheet peaks, dense TFLOP/s
GPU_PEAKS: dict[str, GpuPeaks] = {
    "NVIDIA H100 80GB HBM3": _hopper("H100 SXM", 1979.0, 989.0, 67.0, _H100),
    "NVIDIA H100 PCIe": _hopper("H100 PCIe", 1513.0, 756.0, 51.0, _H100),
    "NVIDIA H100 NVL": _hopper("H100 NVL", 1671.0, 835.0, 60.0, _H100),
    "NVIDIA H200": _hopper("H200 SXM", 1979.0, 989.0, 67.0, _H200),
    "NVIDIA H200 NVL": _hopper("H200 NVL", 1671.0, 835.0, 60.0, _H200),
    "NVIDIA A100-SXM4-40GB": _a100("A100 40GB SXM"),
    "NVIDIA A100-SXM4-80GB": _a100("A100 80GB SXM"),
    "NVIDIA A100-PCIE-40GB": _a100("A100 40GB PCIe"),
    "NVIDIA A100 80GB PCIe": _a100("A100 80GB PCIe"),
    "NVIDIA L40S": GpuPeaks(
        "L40S", {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6}, "NVIDIA L40S datasheet"
    ),
}

_warned: set[str] = set()  # device names already warned about in this process


@dataclass(frozen=True)
class Peak:
    """Peak FLOP/s of one device (a GPU, or the cores one CPU rank uses) and where the number comes from;
    ``flops_per_s`` is None for a GPU without a known peak (then there is no MFU)."""

    flops_per_s: float | None
    source: str  # e.g. "table: H200 SXM dense bf16 989.5 TFLOP/s (NVIDIA H200 ...)", "measured: 1024^3 fp32 ..."

    def mfu(self, model_flops_per_s: float) -> float | None:
        """Model FLOP/s utilisation: ``model_flops_per_s`` (per device) / this peak; None when the peak is unknown."""
        return None if self.flops_per_s is None else model_flops_per_s / self.flops_per_s


def format_mfu(mfu: float | None) -> str:
    """An MFU as a percentage with one decimal; 'n/a' for None (no known peak)."""
    return "n/a" if mfu is None else f"{mfu:.1%}"


def gpu_table_peak(device_name: str, precision: str) -> Peak | None:
    """The datasheet peak of the GPU named exactly ``device_name`` (as ``torch.cuda.get_device_name()`` reports it)
    at ``precision`` ('bf16', 'fp16', 'fp32': plain fp32, as PyTorch computes fp32 matmuls by default; 'tf32'), in
    FLOP/s, with the datasheet named in its source.

    Returns None for a name not in ``GPU_PEAKS``, after one line on stderr (once per name per process) that names the
    device and says how to give its peak; never another part's figure.

    Raises:
        KeyError: ``precision`` is not one of the table's precisions.
    """
    entry = GPU_PEAKS.get(device_name)
    if entry is None:
        if device_name not in _warned:
            _warned.add(device_name)
            print(
                f"growlm: warning: no datasheet peak for the GPU {device_name!r} in growlm's table, so MFU is left "
                "empty (null); give the device's dense peak with growlm-bench --peak_tflops TFLOPS",
                file=sys.stderr,
                flush=True,
            )
        return None
    tflops = entry.tflops[precision]
    if precision == "fp32":
        what = f"plain fp32 {tflops:g} TFLOP/s (TF32 off, PyTorch's default; {entry.datasheet})"
    else:
        halved = ", half its figure with sparsity" if entry.halved else ""
        what = f"dense {precision} {tflops:g} TFLOP/s ({entry.datasheet}{halved})"
    return Peak(tflops * 1e12, f"table: {entry.part} {what}")


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
    """The peak of one rank's device at ``precision`` ('fp32', 'bf16', 'fp16'): ``peak_tflops`` (TFLOP/s) if given;
    on CUDA the datasheet table's figure for the exact name of this process's current device (gpu_table_peak), or a
    Peak whose ``flops_per_s`` is None (no MFU, one warning) for a GPU the table does not know; on a CPU (no CUDA, or
    ``DS_ACCELERATOR=cpu``: a CPU run on a GPU node) a measured matmul peak with ``threads`` threads
    (measure_matmul_peak)."""
    if peak_tflops is not None:
        return Peak(peak_tflops * 1e12, f"given: {peak_tflops:g} TFLOP/s")
    if torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR") != "cpu":
        name = torch.cuda.get_device_name(torch.cuda.current_device())  # this rank's GPU
        table = gpu_table_peak(name, precision)
        if table is not None:
            return table
        return Peak(None, f"unknown: no datasheet peak for {name!r}; --peak_tflops gives one")
    return measure_matmul_peak(precision, threads)
