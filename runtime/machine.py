"""The name of the machine a measurement was taken on, for reports and curves (standard library and torch)."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def device_description(device: str | None = None) -> str:
    """The name of the device runs train on: the CUDA device's name when ``device`` is None (device 0) or
    ``'cuda'``/``'cuda:N'`` and a GPU is present; else the CPU model from /proc/cpuinfo with the core count
    (``'CPU, N cores'`` when /proc/cpuinfo has no model name)."""
    if (device is None or device.startswith("cuda")) and torch.cuda.is_available():
        index = int(device.split(":", 1)[1]) if device and ":" in device else 0
        return torch.cuda.get_device_name(index)
    try:
        model = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name"))
        model = model.split(":", 1)[1].strip()
    except (OSError, StopIteration):
        model = "CPU"
    return f"{model}, {os.cpu_count()} cores"
