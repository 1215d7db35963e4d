"""The data path of a live growth: read every parameter of the old engine, expand it by the plan, write it into the
new engine, with few, large collectives and a bounded working set (DESIGN.md, "Live growth").

Every rank holds its fragments of the fp32 masters and Adam moments (growth.live.shards); ``transfer`` moves them:

* **gather**: consecutive source parameters are grouped into buckets of at most ``BUCKET_BYTES`` (full fp32 size of
  weight + both moments); per bucket every rank contributes only its fragments, packed in one buffer, weight and
  both moments together: ZeRO-3 one ``all_gather_into_tensor`` of equal-size shards; ZeRO-1/2 one ``broadcast``
  from each rank that owns part of the bucket (usually one). Each old parameter is gathered once, however many
  grown parameters read it (depth growth reads each old block twice);
* **local rules**: at ZeRO-3 a grown parameter whose maps all act elementwise (``local_maps``: keep, zero or scale
  its source of the same shape: depth growth, unchanged embeddings) is filled from the rank's own old partition,
  with no communication at all;
* **write**: each rank copies its own fragment of the grown full tensors into the new engine (no collective).

Working set per rank, besides the old and the new engine, on the process group's device (the rank's GPU under
NCCL, where the rules then expand the tensors; the host under gloo, with the rank's share of the cores,
runtime.dist.rank_threads): the bucket's packed shards received (about max(BUCKET_BYTES, 12 x the largest
parameter's numel) bytes), the bucket's assembled full fp32 tensors (as much again) and one grown parameter while
its rule runs (runtime.memory.GROWN_PARAM_BYTES x its numel: its three fp32 tensors and the rule's temporaries).
Stage 0 (no partitioning) and NVMe-swapped optimizer states take the per-parameter path of ``EngineStore``
(``deepspeed.utils.safe_*``), their tensors moved to the same device.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import deepspeed.utils as dsu
import torch
from torch import Tensor

from growlm.growth.errors import GrowthError
from growlm.growth.live.shards import Fragment, gather_bucket, layout_of, no_adam_state, write_fragment
from growlm.growth.ops.apply import OptimizerPolicy, check_sources, grow_param
from growlm.growth.ops.rules import Rule, RuleSet, identity, zeros
from growlm.growth.ops.stores import ParamState
from growlm.runtime import collectives
from growlm.runtime.engine import inner_optimizer
from growlm.runtime.memory import GATHER_BUCKET_BYTES as BUCKET_BYTES  # the memory checks size the working set by it


class EngineStore:
    """ParamStore over a live DeepSpeed engine, ZeRO stage 0-3, fp32/bf16/fp16, one parameter per call. Reads and
    writes full fp32 tensors of the parameter's shape, on CPU. Every call is a collective (three
    ``deepspeed.utils.safe_get_full_*``): all ranks call it, in the same order. ``transfer`` uses it only where
    fragments are not reachable (stage 0, NVMe-swapped state); tests use it as the reference reader.

    Args:
        engine: the DeepSpeed engine (its module holds the HF-named parameters).

    Raises:
        GrowthError: (read) the engine has no Adam state yet: DeepSpeed creates it at the first ``step()``, so
            growth before the first optimizer step is refused.
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.params = dict(engine.module.named_parameters())
        self.optimizer = inner_optimizer(engine)
        if self.optimizer.state:
            link_optimizer_state(engine)
        # ZeRO stage 0 in bf16 (DeepSpeed's FP16_UnfusedOptimizer) keeps an fp32 master tensor per module parameter
        self.masters: dict[int, Tensor] = {}
        opt = engine.optimizer
        if hasattr(opt, "fp16_groups") and hasattr(opt, "fp32_groups"):
            for lp_group, master_group in zip(opt.fp16_groups, opt.fp32_groups, strict=True):
                self.masters.update({id(lp): mp for lp, mp in zip(lp_group, master_group, strict=True)})
        self.bytes_read = 0
        self.bytes_written = 0

    def names(self) -> list[str]:
        return list(self.params)

    def shape(self, name: str) -> torch.Size:
        """The parameter's true shape (ZeRO-3's ``ds_shape`` for a partitioned placeholder)."""
        p = self.params[name]
        return p.ds_shape if hasattr(p, "ds_shape") else p.shape

    def unpartitioned(self, p: torch.nn.Parameter) -> Tensor | None:
        """ZeRO stage 0: the tensor Adam steps for module parameter ``p`` (``p`` itself in fp32, its fp32 master
        in bf16); None when ZeRO partitions it (stages 1-3, reached through ``safe_*``)."""
        if hasattr(p, "ds_id") or hasattr(p, "_hp_mapping"):
            return None
        return self.masters.get(id(p), p)

    def read(self, name: str) -> ParamState:
        p = self.params[name]
        master = self.unpartitioned(p)
        if master is not None:
            st = self.optimizer.state.get(master, {})
            if "exp_avg" not in st:
                raise no_adam_state()
            tensors = (master.detach(), st["exp_avg"], st["exp_avg_sq"])
        else:
            if not self.optimizer.state:
                raise no_adam_state()
            tensors = (
                dsu.safe_get_full_fp32_param(p),
                dsu.safe_get_full_optimizer_state(p, "exp_avg"),
                dsu.safe_get_full_optimizer_state(p, "exp_avg_sq"),
            )
        out = ParamState(*(t.detach().float().cpu().reshape(self.shape(name)).clone() for t in tensors))
        self.bytes_read += sum(t.numel() * t.element_size() for t in out)
        return out

    def write(self, name: str, state: ParamState) -> None:
        p = self.params[name]
        shape = tuple(self.shape(name))
        if tuple(state.weight.shape) != shape:
            raise GrowthError(f"{name}: writing shape {tuple(state.weight.shape)} into a parameter of {shape}")
        master = self.unpartitioned(p)
        if master is not None:
            st = self.optimizer.state[master]
            with torch.no_grad():
                master.copy_(state.weight)
                p.copy_(state.weight)  # the working copy (the same tensor in fp32)
                st["exp_avg"].copy_(state.exp_avg)
                st["exp_avg_sq"].copy_(state.exp_avg_sq)
        else:
            device = p.device
            dsu.safe_set_full_fp32_param(p, state.weight.to(device))
            dsu.safe_set_full_optimizer_state(p, state.exp_avg.to(device), "exp_avg")
            dsu.safe_set_full_optimizer_state(p, state.exp_avg_sq.to(device), "exp_avg_sq")
        self.bytes_written += sum(t.numel() * t.element_size() for t in state)

    def release(self, name: str) -> None:
        pass


def link_optimizer_state(engine: Any) -> None:
    """(Re)link each parameter's fp32 fragment to its Adam state, so ``safe_get/set_full_optimizer_state`` find it.

    DeepSpeed's ZeRO-1/2 and bf16 optimizers link once, right after the *first param group's* first step, when the
    other groups have no state yet; with two groups (weight decay and none) the second group's parameters then
    report "exp_avg not found in optimizer state fragment" forever. Linking again once every group has state fixes
    it (ZeRO-3 reads the state directly and needs nothing)."""
    opt = engine.optimizer
    if hasattr(opt, "_lazy_init_hp_params_optimizer_state") and hasattr(opt, "_hp_optimizer_states_linked"):
        opt._hp_optimizer_states_linked = False
        opt._lazy_init_hp_params_optimizer_state()


def elementwise(f: Any) -> bool:
    """Whether map ``f`` acts on each element alone and keeps the shape (f(x)[i] == f(x[i])), so a rank can apply it
    to its own shard: ``identity``, ``zeros``, or a map that says so with an attribute ``elementwise = True`` (e.g.
    a constant scale of a moment)."""
    return f is identity or f is zeros or getattr(f, "elementwise", False) is True


def local_maps(rule: Rule, policy: OptimizerPolicy) -> tuple[Any, Any, Any] | None:
    """The (weight, exp_avg, exp_avg_sq) maps that ``grow_param`` applies under ``policy`` when all three are
    ``elementwise``, so a rank can compute its new shard from its old shard alone; None otherwise (a reshaping
    map, or a fresh-entry fill that needs the mean over the whole tensor)."""
    if policy.moments == "carry":
        m, v = rule.exp_avg, rule.exp_avg_sq
    elif policy.moments == "carry_old":
        m = v = rule.place or rule.exp_avg
    else:
        m = v = zeros
    if not all(elementwise(f) for f in (rule.weight, m, v)):
        return None
    if policy.fresh_exp_avg_sq == "mean":  # fresh entries (growth.ops.apply.fresh_entries) get a tensor-wide mean
        no_fresh = policy.moments == "carry" and v is not zeros and bool(v(torch.ones(1)).ne(0).all())
        if not no_fresh:
            return None
    return rule.weight, m, v


def write_local(old: Fragment, new: Fragment, maps: tuple[Any, Any, Any]) -> None:
    """Fill this rank's new shard from its own old shard (same shape and partition) by ``local_maps``: the same
    elementwise fp32 arithmetic as on the full tensor, so the values are identical."""
    with torch.no_grad():
        for src, dst, f in zip(old.views, new.views, maps, strict=True):
            if f is zeros:
                dst.zero_()
            else:
                dst[: new.valid].copy_(f(src[: new.valid]))


@dataclass
class TransferStats:
    """What ``transfer`` did on this rank: wall seconds gathering (collectives + assembling full tensors),
    expanding (the plan's rules) and writing (own fragments, local rules included); full fp32 bytes (weight + both
    moments) gathered from the old engine, expanded by rules on full tensors, written into the new engine (every
    grown parameter, however computed: 12 x params of the grown model) and of those applied locally (no
    communication, no full tensor); number of collectives; whether the working copies are already set (ZeRO-1/2
    and the bf16 optimizer keep the whole working model on every rank, and every rank has each grown full weight
    in hand: copying it there saves ``update_lp_params``' all-gather of the whole model)."""

    gather_s: float = 0.0
    expand_s: float = 0.0
    write_s: float = 0.0
    gathered_bytes: int = 0
    expanded_bytes: int = 0
    written_bytes: int = 0
    local_bytes: int = 0
    collectives: int = 0
    working_copies_written: bool = False  # ZeRO-1/2: the module's (replicated) working parameters were set too


def _buckets(sources: list[str], nbytes: dict[str, int], limit: int) -> list[list[str]]:
    """Consecutive runs of ``sources`` whose summed ``nbytes`` stay within ``limit`` (a larger one alone)."""
    out: list[list[str]] = []
    size = limit + 1
    for s in sources:
        if size + nbytes[s] > limit:
            out.append([])
            size = 0
        out[-1].append(s)
        size += nbytes[s]
    return out


def transfer(
    plan: RuleSet, old: Any, new: Any, policy: OptimizerPolicy, bucket_bytes: int = BUCKET_BYTES
) -> TransferStats:
    """Write every parameter of ``plan.new`` into engine ``new`` from engine ``old``; a collective (every rank, same
    arguments, engines of the same ZeRO stage and world size). Values equal ``grow_param`` of the plan's rule on
    the full old tensors, element for element (the same fp32 arithmetic on the same full tensors, or a plain
    copy / zero fill for ``local_maps`` rules). Both engines need Adam state (``ensure_adam_state`` for the new).

    Raises:
        GrowthError: the old engine lacks a parameter a rule reads, has no Adam state yet, or its fragments do not
            cover a parameter.
    """
    old_store, new_store = EngineStore(old), EngineStore(new)
    readers: dict[str, list[tuple[str, Rule]]] = {}
    for name, rule in plan.rules.items():
        readers.setdefault(rule.source or name, []).append((name, rule))
    check_sources(plan, old_store.params)
    old_l, new_l = layout_of(old, old_store.params), layout_of(new, new_store.params)
    stats = TransferStats()
    shapes = {s: old_store.shape(s) for s in readers}
    both_zero3 = old_l is not None and new_l is not None and old_l.kind == new_l.kind == "zero3"

    def local(src: str) -> bool:
        return both_zero3 and all(
            local_maps(rule, policy) is not None
            and (new_l.local[n].size, new_l.local[n].numel) == (old_l.local[src].size, old_l.local[src].numel)
            for n, rule in readers[src]
        )

    device = collectives.group_device()  # where the full tensors are assembled and expanded
    remote = [s for s in readers if not local(s)]
    nbytes = {s: 12 * shapes[s].numel() for s in remote}
    for bucket in _buckets(remote, nbytes, bucket_bytes if old_l is not None else 0):
        t = time.perf_counter()
        if old_l is not None:
            states, calls = gather_bucket(old_l, bucket, shapes)
        else:
            # three safe_get_full_* collectives when partitioned; expanded on the group's device like a bucket
            states = {s: ParamState(*(x.to(device) for x in old_store.read(s))) for s in bucket}
            calls = sum(3 for s in bucket if old_store.unpartitioned(old_store.params[s]) is None)
        stats.gather_s += time.perf_counter() - t
        stats.collectives += calls
        stats.gathered_bytes += sum(nbytes[s] for s in bucket)
        for s in bucket:
            state = states.pop(s)
            for name, rule in readers[s]:
                t = time.perf_counter()
                grown = grow_param(rule, state, policy)
                stats.expand_s += time.perf_counter() - t
                t = time.perf_counter()
                if new_l is not None:
                    write_fragment(new_l.local[name], grown)
                    if new_l.kind == "flat":  # ZeRO-1/2: every rank holds the whole working copy; set it now
                        with torch.no_grad():
                            new_store.params[name].copy_(grown.weight)
                else:
                    new_store.write(name, grown)
                stats.write_s += time.perf_counter() - t
                stats.expanded_bytes += 12 * grown.weight.numel()
            del state
    t = time.perf_counter()
    for s in readers:
        if s not in nbytes:
            for name, rule in readers[s]:
                write_local(old_l.local[s], new_l.local[name], local_maps(rule, policy))
                stats.local_bytes += 12 * new_l.local[name].numel
    stats.write_s += time.perf_counter() - t
    stats.written_bytes = stats.expanded_bytes + stats.local_bytes
    stats.working_copies_written = new_l is not None and new_l.kind == "flat"
    return stats
