"""One rank of the chunked-gather check (tests/distributed/test_strict_collectives.py): hand-made layouts of three
parameters split across the ranks as ZeRO-3 (equal padded shards) and as ZeRO-1/2 (contiguous slices of one flat
partition, some ranks holding nothing of a parameter), gathered by growth.live.shards.gather_bucket whole and in
slices of a few bytes. Prints one JSON line: the largest difference from the known full tensors, the number of
collectives each way, and the bytes the gather allocated beyond what it sends, receives and returns (torch's
profiler's record of every allocation)."""

from __future__ import annotations

import collections
import json
import math

import torch
from torch.profiler import ProfilerActivity, profile

from growlm.growth.live.shards import Fragment, Layout, gather_bucket
from growlm.runtime import collectives
from growlm.runtime.dist import init_distributed

SHAPES = {"a": torch.Size((3, 5)), "b": torch.Size((7,)), "c": torch.Size((2, 4))}


def full(name: str, i: int) -> torch.Tensor:
    """The known full tensor ``i`` (0: weight, 1: exp_avg, 2: exp_avg_sq) of parameter ``name``."""
    n = math.prod(SHAPES[name])
    return torch.arange(n, dtype=torch.float32).view(SHAPES[name]) * (i + 1) + 100 * list(SHAPES).index(name)


def zero3_layout(rank: int, world: int) -> Layout:
    local, spans = {}, {}
    for name, shape in SHAPES.items():
        numel = math.prod(shape)
        size = math.ceil(numel / world)
        start = rank * size
        valid = max(0, min(size, numel - start))
        views = []
        for i in range(3):
            shard = torch.zeros(size)
            shard[:valid] = full(name, i).reshape(-1)[start : start + valid]
            views.append(shard)
        local[name] = Fragment(start, valid, size, numel, tuple(views))
        spans[name] = [(r * size, max(0, min(size, numel - r * size))) for r in range(world)]
    return Layout("zero3", None, rank, world, local, spans)


def flat_layout(rank: int, world: int) -> Layout:
    total = sum(math.prod(s) for s in SHAPES.values())
    per = math.ceil(total / world)
    lo, hi = rank * per, min(total, (rank + 1) * per)
    local, spans, at = {}, {}, 0
    for name, shape in SHAPES.items():
        numel = math.prod(shape)
        spans[name] = []
        for r in range(world):
            a, b = max(at, r * per), min(at + numel, (r + 1) * per)
            spans[name].append((a - at, max(0, b - a)))
        a, b = max(at, lo), min(at + numel, hi)
        start, valid = a - at, max(0, b - a)
        views = tuple(full(name, i).reshape(-1)[start : start + valid].clone() for i in range(3)) if valid else None
        local[name] = Fragment(start, valid, valid, numel, views)
        at += numel
    return Layout("flat", None, rank, world, local, spans)


def _in_backend(e) -> bool:
    """Whether event ``e`` is a collective or runs inside one (the backend's own buffers: gloo stages CPU tensors)."""
    while e is not None:
        if e.name.startswith("c10d::"):
            return True
        e = e.cpu_parent
    return False


def allocated_bytes(prof: profile) -> int:
    """Bytes the caller's thread allocated during ``prof``'s block, freed or not (each op's own allocations; the
    collectives' internals, and the backend's threads, left out)."""
    events = list(prof.events())
    caller = collections.Counter(e.thread for e in events).most_common(1)[0][0]
    return sum(
        e.self_cpu_memory_usage
        for e in events
        if e.thread == caller and e.self_cpu_memory_usage > 0 and e.name != "[memory]" and not _in_backend(e)
    )


def extra_bytes(layout: Layout, allocated: int) -> int:
    """Bytes of ``allocated`` beyond the packed send buffer, the full tensors returned and, at ZeRO-3, the
    collective's output (the gathered blocks, one per slice: world x the send buffer in all); 0 when every receive
    lands in place, more when a fresh receive buffer, an intermediate copy or a reshape copy is made."""
    if layout.kind == "zero3":
        send = 3 * sum(f.size for f in layout.local.values())
        return allocated - 4 * (send + 2 * layout.world * send)  # full tensors padded: world x send
    full = 3 * sum(math.prod(s) for s in SHAPES.values())  # the receive buffers (this rank's: its send buffer) too
    return allocated - 4 * 2 * full


info = init_distributed(60)
result = {"rank": info.rank}
for kind, make in (("zero3", zero3_layout), ("flat", flat_layout)):
    layout = make(info.rank, info.world_size)
    for label, chunk in (("whole", 2**30), ("sliced", 12)):  # 12 bytes: 3 floats, or 1 per rank at ZeRO-3
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            states, calls = gather_bucket(layout, list(SHAPES), SHAPES, chunk_bytes=chunk)
        diff = max(float((t - full(n, i)).abs().max()) for n, st in states.items() for i, t in enumerate(st))
        extra = extra_bytes(layout, allocated_bytes(prof))
        result[f"{kind}_{label}"] = {"max_diff": diff, "collectives": calls, "extra_bytes": extra}
collectives.barrier()
print(json.dumps(result), flush=True)
