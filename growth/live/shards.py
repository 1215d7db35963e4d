"""Where each rank's part of a live engine's training state lives, and how to move it (growth.live.transfer).

Each rank of a ZeRO-1/2/3 (or bf16-optimizer) engine holds one contiguous fragment of every parameter's fp32
master and of its exp_avg / exp_avg_sq: ``Fragment`` (ZeRO-3: the parameter's own partition, the same padded size
on every rank; ZeRO-1/2: the slice of the parameter that falls in the rank's partition of the flat group, any size,
often empty). ``layout_of`` finds them, ``gather_bucket`` assembles full tensors of a group of parameters from every
rank's fragments in one collective (ZeRO-3) or one per owning rank (ZeRO-1/2), received straight into place, and
``write_fragment`` writes a rank's fragment of a full tensor (no collective).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from growlm.growth.errors import GrowthError
from growlm.growth.ops.stores import ParamState
from growlm.runtime import collectives

MOMENTS = ("exp_avg", "exp_avg_sq")


def no_adam_state() -> GrowthError:
    """The error for an engine read before its first optimizer step."""
    return GrowthError("the engine has no Adam state yet (DeepSpeed creates it in step()); grow at step >= 1")


@dataclass
class Fragment:
    """This rank's part of one parameter (flattened, ``numel`` elements in all): elements [start, start + valid)
    live in ``views`` (fp32 weight, exp_avg, exp_avg_sq, each 1-D of ``size`` elements; ``size`` > ``valid`` only
    for ZeRO-3's padding on the last rank); ``views`` is None when the rank holds none of it."""

    start: int
    valid: int
    size: int
    numel: int
    views: tuple[Tensor, Tensor, Tensor] | None


@dataclass
class Layout:
    """Every rank's fragments of an engine's parameters. ``kind``: 'zero3' (equal padded shards) or 'flat'
    (ZeRO-1/2 and the bf16 optimizer: slices of the flat partitions); ``spans[name][r]`` = (start, valid) of rank r."""

    kind: str
    group: Any
    rank: int
    world: int
    local: dict[str, Fragment]
    spans: dict[str, list[tuple[int, int]]] = field(default_factory=dict)


def _zero3_fragment(opt: Any, p: torch.nn.Parameter, rank: int) -> Fragment | None:
    """ZeRO-3: the rank's partition of ``p`` in the optimizer's flat fp32 subgroup and its Adam state."""
    g, offset, size = opt.grad_position[opt.get_param_id(p)]
    if opt._swappable_optimizer_subgroup(g):
        return None
    flat = opt.fp32_partitioned_groups_flat[g]
    st = inner_optimizer_of(opt).state.get(flat, {})
    if "exp_avg" not in st:
        raise no_adam_state()
    views = tuple(t.detach().narrow(0, offset, size) for t in (flat, st["exp_avg"], st["exp_avg_sq"]))
    start = rank * size
    return Fragment(start, max(0, min(size, p.ds_numel - start)), size, p.ds_numel, views)


def _flat_fragment(p: torch.nn.Parameter) -> Fragment:
    """ZeRO-1/2 and bf16 optimizer: the slice of ``p`` in this rank's flat fp32 partition (``_hp_mapping``)."""
    m = p._hp_mapping
    if m is None:
        return Fragment(0, 0, 0, p.numel(), None)
    try:
        views = tuple(t.detach() for t in (m.get_hp_fragment(), *(m.get_hp_fragment(k) for k in MOMENTS)))
    except ValueError as e:  # "exp_avg not found in optimizer state fragment"
        raise no_adam_state() from e
    n = m.lp_fragment_address.numel
    return Fragment(m.lp_fragment_address.start, n, n, p.numel(), views)


def inner_optimizer_of(opt: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside a DeepSpeed optimizer wrapper."""
    while not isinstance(opt, torch.optim.Optimizer):
        opt = opt.optimizer
    return opt


def layout_of(engine: Any, params: dict[str, torch.nn.Parameter]) -> Layout | None:
    """Every rank's fragments of ``engine``'s parameters (a collective for ZeRO-1/2: the fragment addresses are
    exchanged once), or None where fragments are not reachable (stage 0, NVMe-swapped optimizer state).
    ``params``: the engine module's named parameters."""
    opt = engine.optimizer
    group = getattr(opt, "dp_process_group", None)
    rank, world = collectives.rank(group), collectives.world_size(group)
    first = next(iter(params.values()))
    if hasattr(first, "ds_id"):
        frags = {n: _zero3_fragment(opt, p, rank) for n, p in params.items()}
        if any(f is None for f in frags.values()):
            return None
        spans = {n: [(r * f.size, max(0, min(f.size, f.numel - r * f.size))) for r in range(world)]
                 for n, f in frags.items()}  # fmt: skip
        return Layout("zero3", group, rank, world, frags, spans)
    if not hasattr(first, "_hp_mapping"):
        return None
    frags = {n: _flat_fragment(p) for n, p in params.items()}
    mine = [(f.start, f.valid) for f in frags.values()]
    every = collectives.all_gather_object(mine, group=group)
    spans = {n: [every[r][i] for r in range(world)] for i, n in enumerate(frags)}
    for n, s in spans.items():
        if sum(v for _, v in s) != frags[n].numel:
            raise GrowthError(f"{n}: the ranks' fragments cover {sum(v for _, v in s)} of {frags[n].numel} elements")
    return Layout("flat", group, rank, world, frags, spans)


def _pack(layout: Layout, names: list[str]) -> Tensor:
    """This rank's fragments of ``names`` (weight, exp_avg, exp_avg_sq of each in turn) in one flat fp32 buffer on
    the group's device (runtime.collectives.group_device), each fragment copied into place (offloaded ones from the
    CPU), so the buffer is the only copy made."""
    parts: list[Tensor] = []
    for n in names:
        f = layout.local[n]
        if layout.kind == "zero3":
            parts.extend(f.views)  # the padded shard: every rank sends the same size
        elif f.valid:
            parts.extend(v[: f.valid] for v in f.views)
    buf = torch.empty(sum(p.numel() for p in parts), device=collectives.group_device(layout.group))
    o = 0
    for p in parts:
        buf[o : o + p.numel()].copy_(p.reshape(-1))
        o += p.numel()
    return buf


# the largest collective a gather makes (bytes of gathered data): a bucket, or a parameter larger than the bucket
# size, which is gathered alone, moves in slices of this size, so the collective's own staging buffers stay small;
# the assembled full tensors (the bucket's, or that one parameter's) are held whole on the group's device, where
# the rules expand them (runtime.memory.growth_working_set_bytes counts them)
CHUNK_BYTES = 64 * 2**20


def _chunks(n: int, per: int) -> list[tuple[int, int]]:
    """[a, b) slices of ``range(n)`` of at most ``per`` (>= 1) elements each; none when ``n`` is 0."""
    per = max(1, per)
    return [(a, min(n, a + per)) for a in range(0, n, per)]


@torch.no_grad()
def gather_bucket(
    layout: Layout, names: list[str], shapes: dict[str, torch.Size], chunk_bytes: int = CHUNK_BYTES
) -> tuple[dict[str, ParamState], int]:
    """Full fp32 (weight, exp_avg, exp_avg_sq) of every parameter in ``names``, of shape ``shapes[name]``, on every
    rank, on the group's device (the rank's GPU under NCCL, the CPU under gloo), where the rules then expand them; a
    collective, in slices of at most ``chunk_bytes`` of gathered data each. Offloaded fragments are packed onto the
    group's device first (``_pack``).

    ZeRO-3: an all_gather of each rank's packed padded shards; each slice's gathered (world, slice) block is copied
    straight into the full tensors (rank r's shard of a parameter lands at [r size, (r + 1) size) of its padded full
    tensor), so the full tensors are the only copy of the bucket. ZeRO-1/2: a broadcast from each rank that owns
    part of the bucket, received straight into that rank's slice of one receive buffer (the sender broadcasts its
    packed buffer itself), then copied into the full tensors.

    Returns:
        The states (each tensor of shape ``shapes[name]``) and the number of collectives made.
    """
    if layout.kind == "zero3":
        return _gather_zero3(layout, names, shapes, chunk_bytes)
    out: dict[str, ParamState] = {}
    calls = 0
    device = collectives.group_device(layout.group)
    bufs: dict[int, Tensor] = {}
    for r in range(layout.world):
        count = 3 * sum(layout.spans[n][r][1] for n in names)
        if not count:
            continue
        bufs[r] = _pack(layout, names) if r == layout.rank else torch.empty(count, device=device)
        src = collectives.global_rank(layout.group, r)
        for a, b in _chunks(count, chunk_bytes // 4):
            collectives.broadcast(bufs[r][a:b], src=src, group=layout.group)  # contiguous, on the device: in place
            calls += 1
    offsets = dict.fromkeys(bufs, 0)
    for n in names:
        full = [torch.empty(layout.local[n].numel, device=device) for _ in range(3)]
        for r, buf in bufs.items():
            start, valid = layout.spans[n][r]
            if valid:
                o = offsets[r]
                for i in range(3):
                    full[i][start : start + valid] = buf[o + i * valid : o + (i + 1) * valid]
                offsets[r] += 3 * valid
        out[n] = ParamState(*(t.view(shapes[n]) for t in full))
    return out, calls


def _gather_zero3(
    layout: Layout, names: list[str], shapes: dict[str, torch.Size], chunk_bytes: int
) -> tuple[dict[str, ParamState], int]:
    """``gather_bucket`` for ZeRO-3's equal padded shards."""
    device = collectives.group_device(layout.group)
    send = _pack(layout, names)
    world = layout.world
    # segments of the packed buffer: (offset in it, shard size, the (world, size) view of the padded full tensor)
    segments: list[tuple[int, int, Tensor]] = []
    padded: dict[str, list[Tensor]] = {}
    o = 0
    for n in names:
        size = layout.local[n].size
        padded[n] = [torch.empty(world * size, device=device) for _ in range(3)]
        for t in padded[n]:
            segments.append((o, size, t.view(world, size)))
            o += size
    calls = 0
    for a, b in _chunks(send.numel(), chunk_bytes // (4 * world)):
        got = collectives.all_gather(send[a:b], group=layout.group).view(world, b - a)  # row r: rank r's slice
        calls += 1
        for s, size, rows in segments:
            lo, hi = max(a, s), min(b, s + size)
            if lo < hi:
                rows[:, lo - s : hi - s] = got[:, lo - a : hi - a]
        del got
    out = {n: ParamState(*(t[: layout.local[n].numel].view(shapes[n]) for t in padded[n])) for n in names}
    return out, calls


def write_fragment(f: Fragment, state: ParamState) -> None:
    """Copy this rank's fragment of the full tensors ``state`` into the engine (no collective)."""
    if f.valid:
        with torch.no_grad():
            for view, t in zip(f.views, state, strict=True):
                view[: f.valid].copy_(t.reshape(-1)[f.start : f.start + f.valid])
