"""Every collective growlm makes, on the device its process group serves: the one home of torch.distributed calls
(tensor and object collectives, barriers) outside the group's setup (``runtime.dist``).

**The group's device.** NCCL, DeepSpeed's backend on CUDA, serves CUDA tensors only, and its barrier and object
collectives run on the current CUDA device (``runtime.dist.init_distributed`` sets it to the rank's LOCAL_RANK);
gloo, the backend on a CPU, serves CPU tensors. ``group_device`` names the device; every tensor collective here
stages its tensor there (a copy only when it lives elsewhere: a CPU scalar, an offloaded fp32 partition on a GPU
node) and gives the result back on the device the caller asks for, by default the tensor's own. So the callers
write one code path for both backends.

**Why staging, not a second backend.** A group started as ``cpu:gloo,cuda:nccl`` would carry small CPU tensors over
gloo, at the price of a second set of connections between all ranks and a second backend to keep healthy, for
what is a few scalars per save or growth (copying 8 bytes to the GPU takes microseconds). The large collectives,
the shard gathers of a live growth, must run on NCCL anyway. So there is one group, one backend, and staging.

**Strict mode** (``set_strict``, or ``GROWLM_STRICT_COLLECTIVES=1`` in the environment of a process that starts
its group with ``runtime.dist.init_distributed``): every tensor or object collective and barrier
of ``torch.distributed`` that growlm's own code reaches is checked. It raises ``UnstagedCollectiveError`` when a
growlm module other than this one calls ``torch.distributed`` directly, or when a tensor reaches a collective without
having been staged here onto the group's device. Collectives that DeepSpeed or torch make for themselves pass
unchecked. The tests run live growth and checkpoint saves with it on.
"""

from __future__ import annotations

import datetime
import functools
import pickle
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


class UnstagedCollectiveError(RuntimeError):
    """Strict mode: a tensor reached a torch.distributed collective without being staged by this module."""


def is_initialized() -> bool:
    """Whether the default process group exists (a world of one run without a launcher has one too)."""
    return dist.is_available() and dist.is_initialized()


def rank(group: Any = None) -> int:
    """This process's rank in ``group`` (the default group when None)."""
    return dist.get_rank(group=group)


def world_size(group: Any = None) -> int:
    """The number of ranks in ``group`` (the default group when None)."""
    return dist.get_world_size(group=group)


def global_rank(group: Any, group_rank: int) -> int:
    """The global rank of the rank numbered ``group_rank`` in ``group`` (itself when ``group`` is None)."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def group_device(group: Any = None) -> torch.device:
    """The device whose tensors ``group``'s backend carries: the current CUDA device for NCCL, else the CPU.

    Raises:
        RuntimeError: an NCCL group in a process with no CUDA device.
    """
    if "nccl" not in str(dist.get_backend(group)).lower():
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("the process group is NCCL but this process sees no CUDA device")
    return torch.device("cuda", torch.cuda.current_device())


_STAGED: dict[int, weakref.ref] = {}  # strict mode: id -> the tensors staged here (by identity; gone when freed)


def _mark(t: Tensor) -> Tensor:
    """Record ``t`` as staged (strict mode only); returns ``t``."""
    if _STRICT["on"]:
        key = id(t)
        _STAGED[key] = weakref.ref(t, lambda _, key=key: _STAGED.pop(key, None))
    return t


def _is_staged(t: Tensor) -> bool:
    ref = _STAGED.get(id(t))
    return ref is not None and ref() is t


def _stage(t: Tensor, device: torch.device) -> Tensor:
    """``t`` on ``device`` and contiguous: ``t`` itself when it already is, else a copy."""
    return _mark(t.to(device).contiguous())


def _out(t: Tensor, device: torch.device | str | None, like: Tensor) -> Tensor:
    """``t`` on ``device`` (``like``'s device when None)."""
    return t.to(like.device if device is None else device)


def barrier(group: Any = None) -> None:
    """Wait until every rank of ``group`` reaches this call; on NCCL, on the current CUDA device."""
    if group_device(group).type == "cuda":
        dist.barrier(group=group, device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier(group=group)


def all_reduce(t: Tensor, op: str = "sum", group: Any = None, device: torch.device | str | None = None) -> Tensor:
    """Element-wise reduction of ``t`` over the ranks of ``group``: ``op`` is 'sum', 'max' or 'min'.

    Args:
        t: any shape and dtype the backend reduces (every rank the same), on any device.
        op: the reduction.
        device: where the result goes (default: ``t``'s device).

    Returns:
        The reduced tensor, ``t``'s shape. ``t`` itself holds the result too when it was contiguous and on the
        group's device (no staging copy was made).

    Raises:
        ValueError: an unknown ``op``.
    """
    if op not in _OPS:
        raise ValueError(f"all_reduce op {op!r}: use one of {', '.join(_OPS)}")
    staged = _stage(t, group_device(group))
    dist.all_reduce(staged, op=_OPS[op], group=group)
    return _out(staged, device, t)


def broadcast(t: Tensor, src: int, group: Any = None, device: torch.device | str | None = None) -> Tensor:
    """``t`` of global rank ``src`` on every rank of ``group``.

    Args:
        t: on ``src`` the data; elsewhere a tensor of the same shape and dtype to receive it (its values are
            ignored), on any device.
        src: the global rank that sends.
        device: where the result goes (default: ``t``'s device).

    Returns:
        ``src``'s tensor. ``t`` itself holds it too when it was contiguous and on the group's device.
    """
    staged = _stage(t, group_device(group))
    dist.broadcast(staged, src=src, group=group)
    return _out(staged, device, t)


# torch >= 2.13 names it all_gather_single (all_gather_into_tensor, the same collective, warns that it is deprecated)
def _all_gather_single(out: Tensor, t: Tensor, group: Any) -> None:
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, t, group=group)


def all_gather(t: Tensor, group: Any = None, device: torch.device | str | None = None) -> Tensor:
    """Every rank's ``t`` (1-D, the same size and dtype on every rank of ``group``), concatenated in rank order.

    Args:
        t: shape (n,), on any device.
        device: where the result goes (default: ``t``'s device).

    Returns:
        Shape (world_size * n,): rank r's ``t`` in elements [r n, (r + 1) n).
    """
    where = group_device(group)
    staged = _stage(t, where)
    out = _mark(torch.empty(world_size(group) * staged.numel(), dtype=staged.dtype, device=where))
    _all_gather_single(out, staged, group)
    return _out(out, device, t)


def all_gather_object(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's picklable ``obj``, in rank order (a list of world_size(group) objects)."""
    out: list[Any] = [None] * world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def broadcast_object(obj: Any, src: int = 0, group: Any = None) -> Any:
    """Global rank ``src``'s picklable ``obj`` on every rank (``obj`` is ignored elsewhere)."""
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=group, device=group_device(group))
    return box[0]


_TIMED = {"calls": 0}  # calls of all_gather_object_within so far: every rank makes them in the same order


def all_gather_object_within(obj: Any, timeout_s: float, what: str) -> list[Any]:
    """Every rank's picklable ``obj`` in rank order (a list of world-size objects), waiting at most ``timeout_s``
    seconds for the slowest rank instead of the process group's fixed timeout: for a wait whose length depends on
    the work (hashing a checkpoint share), the caller derives the limit from that work's size.

    The objects travel through the default group's key-value store (the rendezvous store every backend has), not
    through the backend, so the wait needs no device and the limit is this call's own. Every rank calls it the same
    number of times in the same order, like any collective. Keys of the call before are deleted once every rank has
    passed it. Without a process group (one process) it returns ``[obj]``.

    Raises:
        TimeoutError: a rank had not reported after ``timeout_s`` s: the message names ``what``, the limit and the
            ranks that were missing.
    """
    if not is_initialized():
        return [obj]
    store = dist.distributed_c10d._get_default_store()
    n, me, world = _TIMED["calls"], rank(), world_size()
    _TIMED["calls"] += 1
    keys = [f"growlm/within/{n}/{r}" for r in range(world)]
    store.set(keys[me], pickle.dumps(obj))
    try:
        store.wait(keys, datetime.timedelta(seconds=max(1.0, timeout_s)))
    except Exception:  # noqa: BLE001 (the store raises RuntimeError or DistStoreError on a timeout)
        missing = [r for r in range(world) if not store.check([keys[r]])]
        raise TimeoutError(
            f"{what}: rank(s) {', '.join(map(str, missing))} did not report within {timeout_s:.0f} s"
        ) from None
    out = [pickle.loads(store.get(k)) for k in keys]
    if n:  # every rank has set this call's key, so every rank has read the call before's: drop this rank's
        store.delete_key(f"growlm/within/{n - 1}/{me}")
    return out


# ---- strict mode ------------------------------------------------------------------------------------------------


def store_client(addr: str, port: int, timeout_s: float) -> Any:
    """A new client of the rendezvous store (``torch.distributed.TCPStore``) at ``addr``:``port``, its own
    connection, not the process group's (``runtime.peers``: a thread that must not wait behind the group's client).

    Raises:
        RuntimeError (torch's DistNetworkError / DistStoreError): the store cannot be reached within ``timeout_s``.
    """
    return dist.TCPStore(
        addr, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False
    )


_DEFAULT_TIMEOUTS: dict[str, Any] = {}  # torch's default group timeouts before set_default_group_timeout


def set_default_group_timeout(timeout_s: float | None) -> None:
    """Give every process group created from now on without a timeout of its own (DeepSpeed's, for each engine)
    ``timeout_s`` seconds instead of torch's defaults (30 minutes for gloo, 10 for NCCL); None puts torch's back."""
    c10d = dist.distributed_c10d
    names = ("default_pg_timeout", "default_pg_nccl_timeout")
    if timeout_s is None:
        for name, value in _DEFAULT_TIMEOUTS.items():
            setattr(c10d, name, value)
        _DEFAULT_TIMEOUTS.clear()
        return
    for name in names:
        if getattr(c10d, name, None) is not None:
            _DEFAULT_TIMEOUTS.setdefault(name, getattr(c10d, name))
            setattr(c10d, name, datetime.timedelta(seconds=timeout_s))


# the torch.distributed functions strict mode checks: every one that moves tensors (barriers carry none)
_CHECKED = (
    "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter_tensor",
    "reduce_scatter", "reduce", "gather", "scatter", "send", "recv", "isend", "irecv", "all_to_all_single",
    "all_to_all", "barrier", "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
)  # fmt: skip
_OBJECT_OR_BARRIER = {"barrier", "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list"}


_STRICT = {"on": False}
_ORIGINAL: dict[str, Any] = {}


def _caller_module() -> str:
    """The module name of the nearest frame outside torch, above the strict wrapper that called this."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (name == "torch" or name.startswith("torch.")):
            return name
        frame = frame.f_back
    return ""


def _tensors_of(args: tuple, kwargs: dict) -> Iterator[Tensor]:
    for a in (*args, *kwargs.values()):
        if isinstance(a, Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (x for x in a if isinstance(x, Tensor))


def _checked(name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def _wrapper(*args: Any, **kwargs: Any) -> Any:
        if _STRICT["on"]:
            caller = _caller_module()
            if caller == "growlm" or (caller.startswith("growlm.") and caller != __name__):
                raise UnstagedCollectiveError(
                    f"{caller} called torch.distributed.{name} directly: every collective goes through "
                    f"{__name__} (which stages its tensors on the group's device)"
                )
            if caller == __name__ and name not in _OBJECT_OR_BARRIER:
                where = group_device(kwargs.get("group"))
                for t in _tensors_of(args, kwargs):
                    if not _is_staged(t) or t.device != where:
                        raise UnstagedCollectiveError(
                            f"torch.distributed.{name} got a {tuple(t.shape)} tensor on {t.device} that was not staged "
                            f"on the group's device {where}"
                        )
        return fn(*args, **kwargs)

    return _wrapper


def set_strict(on: bool) -> None:
    """Turn strict mode on or off in this process (see the module docstring). Wraps torch.distributed's tensor and
    object collectives the first time it is turned on; the wrappers do nothing while it is off."""
    if on and not _ORIGINAL:
        for name in _CHECKED:
            fn = getattr(dist, name, None)
            if fn is not None:
                _ORIGINAL[name] = fn
                setattr(dist, name, _checked(name, fn))
    _STRICT["on"] = on
