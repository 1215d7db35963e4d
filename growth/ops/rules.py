"""A growth operator as data: for each parameter of the grown model, the old tensor it reads and the maps that give
its weight and Adam moments (DESIGN.md, "Growth operators"). Torch only; no model, engine, rank or file is touched here.

Names and shapes are those of the model's transformers class: GPT-2 (``GPT2LMHeadModel``, Conv1D weight (in, out))
or Llama (``LlamaForCausalLM``, nn.Linear weight (out, in)). Symbols: V vocab, P positions, L n_layer, d n_embd,
H n_head, K n_kv_head, Q head dim, F n_inner.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from growlm.growth.errors import GrowthError
from growlm.model.config import ModelConfig
from growlm.model.masks import MaskSpec
from growlm.model.registry import build_model, init_skipped

Map = Callable[[Tensor], Tensor]


def identity(x: Tensor) -> Tensor:
    """The map that keeps a tensor as it is (a parameter whose shape does not change)."""
    return x


def zeros(x: Tensor) -> Tensor:
    """The map to zeros of the same shape (e.g. the moments of fresh entries)."""
    return torch.zeros_like(x)


@dataclass(frozen=True)
class Rule:
    """How one parameter of the grown model is made from one old parameter.

    weight, exp_avg, exp_avg_sq map the old fp32 tensors (full, unsharded, old shape) to new ones (new shape).
    The moment maps are the operator's *gradient rule*: if the grown model's gradient is G(g_old), exp_avg maps like
    G and exp_avg_sq like G squared; entries whose exp_avg_sq map gives 0 on an all-ones input are *fresh* (no old
    counterpart). ``place`` puts the old tensor at its own positions, zeros elsewhere (the "carry old, zero new"
    policy); None means the same as exp_avg. ``source`` is the old parameter's name when it differs (depth growth).
    Maps must be deterministic (every rank computes the same tensor) and must work on meta tensors (shape checks).
    """

    weight: Map
    exp_avg: Map
    exp_avg_sq: Map
    source: str | None = None
    place: Map | None = None


@dataclass(frozen=True)
class RuleSet:
    """An operator applied to one config, as data: the grown config, a ``Rule`` for every grown parameter (its
    weight and Adam moments from the old state), and (masked family)
    the masks the grown model needs. ``family`` is 'masked' or 'duplicate'; ``exact`` says whether the grown model
    computes the same function (eval mode) as the old one. ``ramp_frac`` (masked family): the mask ramp's length as
    a fraction of the run left at growth, resolved by ``ramp_length`` when the growth happens (None: the ramp is
    ``masks.ramp_steps`` steps long)."""

    old: ModelConfig
    new: ModelConfig
    rules: dict[str, Rule]
    family: str
    exact: bool = True
    masks: MaskSpec | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    ramp_frac: float | None = None


def ramp_length(plan: RuleSet, remaining_steps: int | None) -> int:
    """The mask ramp length in optimizer steps of a masked growth: ``plan.ramp_frac`` x ``remaining_steps`` (the
    optimizer steps left in the run at growth, e.g. from its LR schedule), at least 1; the plan's fixed
    ``masks.ramp_steps`` when it has no ramp_frac or the remaining run is unknown (None). 0 for a plan without
    masks."""
    if plan.masks is None:
        return 0
    if plan.ramp_frac is None or remaining_steps is None:
        return plan.masks.ramp_steps
    return max(1, round(plan.ramp_frac * remaining_steps))


# ----- maps --------------------------------------------------------------------------------------------------------


NOISE_SLICE = 1 << 22
"""Elements of noise drawn at once by ``seeded_normal``: 16 MiB of float32 on the host, however large the tensor."""


def seeded_normal(
    shape: tuple[int, ...], std: float, name: str, seed: int, like: Tensor, dtype: torch.dtype | None = None
) -> Tensor:
    """N(0, std^2) tensor of ``shape`` on ``like``'s device, in ``dtype`` (default ``like``'s), determined by
    (parameter name, seed) only: the same on every rank and device, independent of the global RNG.

    The values are drawn in float32 from one CPU generator seeded by crc32(name) and ``seed``, ``NOISE_SLICE``
    elements at a time, each slice scaled and copied into the output where it lives: the host holds one slice, never
    the whole tensor, and no float64 copy is made anywhere. The output is those float32 values rounded to its dtype,
    so they do not depend on the dtype or device asked for. On a meta tensor returns an empty meta tensor (shape
    checks)."""
    dtype = like.dtype if dtype is None else dtype
    if like.is_meta:
        return torch.empty(shape, dtype=dtype, device="meta")
    out = torch.empty(shape, dtype=dtype, device=like.device)
    if std == 0:
        return out.zero_()
    g = torch.Generator().manual_seed((zlib.crc32(name.encode()) + 1_000_003 * seed) % (2**63))
    flat = out.view(-1)
    for a in range(0, flat.numel(), NOISE_SLICE):
        part = torch.randn(min(NOISE_SLICE, flat.numel() - a), generator=g, dtype=torch.float32)
        flat[a : a + part.numel()].copy_(part.mul_(std))
    return out


def rms(x: Tensor) -> float:
    """Root mean square of every entry of ``x`` (a Python float), reduced in ``x``'s dtype promoted to at least
    float32, on ``x``'s device: no float64 copy of the tensor. 0.0 for an empty tensor."""
    if x.numel() == 0:
        return 0.0
    norm = torch.linalg.vector_norm(x, dtype=torch.promote_types(x.dtype, torch.float32))
    return norm.item() / x.numel() ** 0.5


def noise_dtype(x: Tensor) -> torch.dtype:
    """The dtype in which noise added to ``x`` is formed before its zero-sum correction: ``x``'s, at least float32
    (a bf16 or fp16 mean would round the correction away)."""
    return torch.promote_types(x.dtype, torch.float32)


def repeat_last(k: int, scale: float = 1.0) -> Map:
    """[x, x, ..., x] (k copies) along the last axis, times ``scale``: (..., n) -> (..., k n)."""
    return lambda x: torch.cat([x] * k, dim=-1) * scale if scale != 1.0 else torch.cat([x] * k, dim=-1)


def kron_map(pattern: Tensor) -> Map:
    """W -> kron(P, W): a (k, k) pattern of scaled copies of a (n, m) matrix, (n, m) -> (k n, k m).

    Row block i reads input copy i, column block j is output copy j: P = I is block diagonal (staged training),
    P = ones / k is Net2Net's equal split, a column of unequal weights is LEMON's split."""

    def f(w: Tensor) -> Tensor:
        return torch.kron(pattern.to(dtype=w.dtype, device=w.device), w)

    return f


def leading_block(shape_factor: tuple[int, ...]) -> Map:
    """Old tensor in the leading block of a tensor ``shape_factor`` times as large per axis, zeros elsewhere."""

    def f(x: Tensor) -> Tensor:
        out = x.new_zeros(tuple(n * k for n, k in zip(x.shape, shape_factor, strict=True)))
        out[tuple(slice(0, n) for n in x.shape)] = x
        return out

    return f


def per_qkv(f: Map) -> Map:
    """Apply f to the q, k and v thirds (last axis) of a fused c_attn tensor separately."""
    return lambda t: torch.cat([f(part) for part in t.chunk(3, dim=-1)], dim=-1)


def compose_maps(first: Map, second: Map) -> Map:
    """``second(first(x))``: two growth maps applied in turn (chained operators)."""
    return lambda x: second(first(x))


# ----- plans -------------------------------------------------------------------------------------------------------


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter of ``build_model(cfg)`` (GPT-2 or Llama, by ``cfg.arch``), in
    ``named_parameters`` order; a tied lm_head is listed once, as the embedding. Built on the meta device (no
    memory, no initialisation), once per config (a growlm-grow asks for the same shapes several times): each call
    returns a new dict."""
    try:
        return dict(_built_shapes(cfg))
    except TypeError:  # a config holding an unhashable value: built again
        return dict(_built_shapes.__wrapped__(cfg))


@functools.lru_cache(maxsize=16)
def _built_shapes(cfg: ModelConfig) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``param_shapes`` of ``cfg`` as (name, shape) pairs, from the model built on the meta device."""
    with torch.device("meta"), init_skipped():
        model = build_model(cfg)
    return tuple((name, tuple(p.shape)) for name, p in model.named_parameters())


def tied_aliases(cfg: ModelConfig) -> dict[str, str]:
    """alias -> parameter of a tied LM head: ``{"lm_head.weight": <the embedding's name>}`` when the head shares the
    token embedding (GPT-2 always; Llama with ``tie_word_embeddings``), else {} (an untied Llama head is a parameter
    of its own, listed by ``param_shapes``)."""
    return {"lm_head.weight": cfg.embedding_name} if cfg.tied_head else {}


def compose(first: RuleSet, second: RuleSet) -> RuleSet:
    """The plan that applies ``first`` then ``second``, one parameter at a time (never two whole models).

    Raises:
        GrowthError: the plans do not chain (second.old != first.new) or both carry masks.
    """
    if second.old != first.new:
        raise GrowthError(
            f"plans do not chain: the second starts from {second.old.shape_str()}, the first ends at "
            f"{first.new.shape_str()}; build the second from the first's new config"
        )
    if first.masks is not None or second.masks is not None:
        raise GrowthError("masked plans cannot be composed; the masked family grows several dimensions in one plan")
    rules = {}
    for name, r2 in second.rules.items():
        mid = r2.source or name
        r1 = first.rules[mid]
        place1 = r1.place or r1.exp_avg
        place2 = r2.place or r2.exp_avg
        rules[name] = Rule(
            weight=compose_maps(r1.weight, r2.weight),
            exp_avg=compose_maps(r1.exp_avg, r2.exp_avg),
            exp_avg_sq=compose_maps(r1.exp_avg_sq, r2.exp_avg_sq),
            source=r1.source or (mid if mid != name else None),
            place=compose_maps(place1, place2),
        )
    return RuleSet(
        old=first.old,
        new=second.new,
        rules=rules,
        family=first.family,
        exact=first.exact and second.exact,
        notes=first.notes + second.notes,
    )


def chain(plans: list[RuleSet], new: ModelConfig) -> RuleSet:
    """The growth that applies ``plans`` in turn (``compose``), ending at ``new`` exactly as asked: its non-shape
    fields (dropout, eps, and GPT-2's n_inner=None against an explicit value) are the target's, not the last step's.

    Raises:
        GrowthError: no step (nothing grows), or steps that do not chain.
    """
    if not plans:
        raise GrowthError(f"nothing grows: target {new.shape_str()} equals the current shape; change the target")
    plan = plans[0]
    for p in plans[1:]:
        plan = compose(plan, p)
    return RuleSet(old=plan.old, new=new, rules=plan.rules, family=plan.family, exact=plan.exact, notes=plan.notes)


def check_rules(plan: RuleSet) -> None:
    """Check, on meta tensors (no memory, no data), that the plan reads only existing old parameters and produces
    every parameter of the grown model with the right shape, for weights and both moments.

    Raises:
        GrowthError: a parameter is missing or extra, a source does not exist, or a map gives the wrong shape.
    """
    old, new = param_shapes(plan.old), param_shapes(plan.new)
    missing, extra = sorted(set(new) - set(plan.rules)), sorted(set(plan.rules) - set(new))
    if missing or extra:
        raise GrowthError(f"plan does not cover the grown model: missing rules {missing[:5]}, extra rules {extra[:5]}")
    for name, rule in plan.rules.items():
        src = rule.source or name
        if src not in old:
            raise GrowthError(f"rule for {name} reads {src}, which the old model {plan.old.shape_str()} lacks")
        x = torch.empty(old[src], device="meta")
        for kind, f in (("weight", rule.weight), ("exp_avg", rule.exp_avg), ("exp_avg_sq", rule.exp_avg_sq)):
            got = tuple(f(x).shape)
            if got != new[name]:
                raise GrowthError(f"{kind} map of {name} gives shape {got}, expected {new[name]} (operator bug)")
