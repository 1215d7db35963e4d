"""Checks of safetensors weight files that every family's transformers folder is read through (``--init_from``,
growlm-eval): a file cut short or damaged, and two tensors that should be equal. Reads headers and slices only."""

from __future__ import annotations

import json
import os
import struct

import torch


def safetensors_problem(path: str | os.PathLike) -> str | None:
    """What is wrong with the safetensors file ``path``, as the middle of a one-line refusal ("is truncated: ..."),
    or None for a whole file. Reads the 8-byte header length and the JSON header only (no tensor data) and checks
    that the file is exactly as long as the header says: a copy cut short, an empty file, or another format fails
    here rather than deep inside a loader. Bytes changed inside the tensor data are not detected.

    Raises:
        OSError: the file cannot be opened or read (missing, permissions).
    """
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"is {size} bytes, too short for a safetensors file (empty or truncated)"
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            return (
                f"is {size:,} bytes, shorter than its own {n:,}-byte header says (truncated, or not a safetensors file)"
            )
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError, KeyError, IndexError, TypeError, ValueError):
        return "has a damaged header (not the JSON table of a safetensors file)"
    want = 8 + n + max(ends, default=0)
    if size < want:
        return f"is truncated: {size:,} bytes, its header describes {want:,}"
    if size > want:
        return f"is {size:,} bytes, {size - want:,} more than its header describes (damaged, or two files joined)"
    return None


def tensors_differ(a: tuple[str | os.PathLike, str], b: tuple[str | os.PathLike, str], rows: int = 4096) -> bool:
    """Whether two tensors of safetensors files, each ``(file, tensor name)``, differ in shape or in any value,
    compared ``rows`` rows at a time (memory: two slices; e.g. a folder that declares its LM head tied to the token
    embedding but holds a head of its own: transformers ties it, or does not, by version).

    Raises:
        OSError, safetensors.SafetensorError: a file cannot be read.
    """
    from safetensors import safe_open  # lazy: only for a folder's weights

    with safe_open(str(a[0]), framework="pt") as fa, safe_open(str(b[0]), framework="pt") as fb:
        sa, sb = fa.get_slice(a[1]), fb.get_slice(b[1])
        shape = sa.get_shape()
        if shape != sb.get_shape():
            return True
        if not shape:
            return not torch.equal(fa.get_tensor(a[1]), fb.get_tensor(b[1]))
        return any(not torch.equal(sa[i : i + rows], sb[i : i + rows]) for i in range(0, shape[0], rows))
