"""This process's memory, read and released: resident and peak host memory (Linux /proc and getrusage), the CUDA
caching allocator's counters and peaks, and the calls that hand freed memory back (glibc's heap, CUDA's and the
pinned host cache). Used by the live growth (growth.live.grow), the trainer's records and the benchmarks; the
formulas that predict memory are in runtime.memory."""

from __future__ import annotations

import ctypes
import resource

import torch


def rss_bytes() -> int:
    """Resident memory of this process now (bytes; Linux ``/proc/self/status`` VmRSS, else the peak so far)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024  # reported in KiB
    except OSError:
        pass
    return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (bytes; ``getrusage`` ru_maxrss, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> bool:
    """Reset this process's resident-memory high-water mark, so that ``peak_rss_bytes`` reads the peak of what
    follows (Linux: 5 written to ``/proc/self/clear_refs`` resets VmHWM and ru_maxrss); False where that is refused,
    and the peaks read later are the process's whole-life ones. For benchmarks: it changes what the growth record's
    ``peak_rss_bytes`` means, so growlm's own commands never call it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


CUDA_MEMORY_KEYS = (
    "cuda_allocated_bytes_before",
    "cuda_reserved_bytes_before",
    "cuda_peak_allocated_bytes",
    "cuda_peak_reserved_bytes",
    "cuda_allocated_bytes_after",
    "cuda_reserved_bytes_after",
)


def cuda_memory_bytes() -> tuple[int, int] | None:
    """This process's CUDA memory on its current device now: (allocated by tensors, reserved by the caching
    allocator), bytes; None when the process has not initialised CUDA (a CPU run, on a GPU node too: reading the
    counters must not create a CUDA context)."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    return int(torch.cuda.memory_allocated()), int(torch.cuda.memory_reserved())


def start_cuda_peak() -> dict[str, int | None]:
    """The ``*_before`` entries of ``CUDA_MEMORY_KEYS`` (None without CUDA), after resetting CUDA's peak statistics so
    that ``finish_cuda_peak`` reads the peak of what follows, not of the whole run."""
    now = cuda_memory_bytes()
    if now is None:
        return dict.fromkeys(CUDA_MEMORY_KEYS)
    torch.cuda.reset_peak_memory_stats()
    before = {"cuda_allocated_bytes_before": now[0], "cuda_reserved_bytes_before": now[1]}
    return {**dict.fromkeys(CUDA_MEMORY_KEYS), **before}


def finish_cuda_peak(memory: dict[str, int | None]) -> dict[str, int | None]:
    """``memory`` (from ``start_cuda_peak``) with the peak since then and the allocated / reserved bytes now."""
    now = cuda_memory_bytes()
    if now is None:
        return dict(memory)
    return {
        **memory,
        "cuda_peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
        "cuda_peak_reserved_bytes": int(torch.cuda.max_memory_reserved()),
        "cuda_allocated_bytes_after": now[0],
        "cuda_reserved_bytes_after": now[1],
    }


def release_pinned_host_memory() -> bool:
    """Give the pinned (page-locked) host blocks that torch's caching host allocator holds but no tensor uses back to
    the OS (``torch.accelerator.memory.empty_host_cache``). Freed pinned tensors stay in that cache, resident and
    unpageable: after a growth with an offloaded optimizer, the old engine's fp32 partitions and CPU-Adam state
    would otherwise stay on the host beside the new engine's. False where this torch has no such call or no
    accelerator is in use."""
    memory = getattr(torch.accelerator, "memory", None)
    if memory is None or not hasattr(memory, "empty_host_cache") or not torch.accelerator.is_available():
        return False
    memory.empty_host_cache()
    return True


def release_heap() -> bool:
    """Return freed heap memory to the OS (glibc ``malloc_trim(0)``); False where there is no glibc.

    glibc serves tensors above its mmap threshold with mmap and unmaps them on free, but the threshold rises to the
    size of each large block freed (up to 32 MiB), after which such tensors come from the heap and their pages stay
    resident after ``free``: without a trim a rank keeps much of the old engine's memory after a growth."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError):
        return False


def cuda_max_allocated_bytes() -> int | None:
    """Peak CUDA memory allocated by tensors on this process's current device since the run started or since the last
    growth reset the statistic (bytes); None when the process has not initialised CUDA (a CPU run)."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    return int(torch.cuda.max_memory_allocated())
