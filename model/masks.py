"""Growth masks (Masked Structural Growth, Yao et al. 2023, arXiv 2305.02869): which units of a grown model (GPT-2
or Llama) are new and the linear ramp that fades them in. The masked forward passes themselves are the families'
(``model/<family>/model.py``; the masks are optional inputs of their blocks, ``model/layers.py``).

A masked model multiplies every new unit by a value r in [0, 1]; old units by 1. At r = 0 it computes exactly the
function of the model it was grown from (whatever the new weights are); at r = 1 it is a plain model of its family
and the masks are dropped. Masks are registered (persistent) buffers of the model so that they are saved and
resumed with it:

    growth_mask_hidden (d,)    hidden units: the embedding output, every norm output and every sublayer output;
                               LayerNorm / RMSNorm statistics are mask-weighted (DESIGN.md, section "Model and growth
                               masks")
    growth_mask_attn   (H*Q,)  attention units. GPT-2: q, k and v of new heads (and of new dims of old heads).
                               Llama: the output of each new query head (before o_proj); a new query head of an old
                               key/value group would otherwise attend with q = 0 and add the mean of old values
    growth_mask_ffn    (F,)    FFN units: GPT-2 the pre-activation of new units (GELU(0) = 0); Llama the SwiGLU
                               product silu(gate) * up of new units
    growth_gate_layer  (L,)    per block: x <- x + g * f(x) for both sublayers of a new block

Only the masks a growth needs exist. ``GrowthMaskedModel`` is the mask buffers' life on a model (add, ramp, drop),
shared by both families. This module imports torch only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn

# The buffer names, in the order GPT passes them to its blocks: hidden (d,), qkv (H*Q,), ffn (F,), gate (L,).
MASK_BUFFERS = ("growth_mask_hidden", "growth_mask_attn", "growth_mask_ffn", "growth_gate_layer")


@dataclass(frozen=True)
class MaskSpec:
    """Which units of a grown model are new, and the ramp that fades them in. JSON-safe via to_dict/from_dict.

    The grown model's units keep the old ones in the leading positions: hidden dims [0, old_n_embd), FFN units
    [0, old_ffn_dim), and in the attention layout (head h, dim r) -> h * Q' + r for h < old_n_head, r < old_head_dim.
    ``new_layers`` lists the indices (in the grown model) of gated blocks. Llama keeps the head dim and places old
    query heads by key/value group (``model.llama.config.llama_head_index``); ``old_n_kv_head`` is set for the families
    with key/value heads only (Llama, Qwen 2).

    Ramp (MSG, Yao et al. 2023, section 3): r(step) = clamp((step - start_step) / ramp_steps, 0, 1), where step
    counts optimizer steps taken.
    """

    old_n_embd: int
    old_n_head: int
    old_head_dim: int
    old_ffn_dim: int
    new_layers: tuple[int, ...] = ()
    start_step: int = 0
    ramp_steps: int = 1
    old_n_kv_head: int | None = None  # key/value heads before the growth (None: GPT-2)

    def __post_init__(self) -> None:
        object.__setattr__(self, "new_layers", tuple(int(i) for i in self.new_layers))
        if self.ramp_steps < 1:
            raise ValueError(f"ramp_steps={self.ramp_steps} must be >= 1 (optimizer steps from 0 to 1)")

    def value(self, step: int) -> float:
        """Ramp value r at ``step`` optimizer steps: 0 at start_step, 1 from start_step + ramp_steps on."""
        return min(1.0, max(0.0, (step - self.start_step) / self.ramp_steps))

    def end_step(self) -> int:
        """First step at which r = 1 (the masks are removed then)."""
        return self.start_step + self.ramp_steps

    def check(self, cfg: Any) -> None:
        """Check that this spec fits ``cfg`` (the grown model's config, of any family: its ``mask_problems`` says what
        in the old attention shape does not fit).

        Raises:
            ValueError: an old size exceeds the grown one, or a new layer index is outside [0, n_layer).
        """
        problems = []
        if self.old_n_embd > cfg.n_embd:
            problems.append(f"old_n_embd={self.old_n_embd} > n_embd={cfg.n_embd}")
        if self.old_n_head > cfg.n_head or self.old_head_dim > cfg.head_dim:
            problems.append(f"old heads {self.old_n_head}x{self.old_head_dim} exceed {cfg.n_head}x{cfg.head_dim}")
        if self.old_ffn_dim > cfg.ffn_dim:
            problems.append(f"old_ffn_dim={self.old_ffn_dim} > ffn_dim={cfg.ffn_dim}")
        if any(not 0 <= i < cfg.n_layer for i in self.new_layers):
            problems.append(f"new_layers={self.new_layers} outside [0, {cfg.n_layer})")
        problems += cfg.mask_problems(self.old_n_head, self.old_head_dim, self.old_n_kv_head)
        if problems:
            raise ValueError("mask spec does not fit the model config " + cfg.shape_str() + ": " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict (``new_layers`` as a list), e.g. for growlm_state.json; ``old_n_kv_head`` only when
        set (a GPT-2 spec is written as before Llama)."""
        d = asdict(self)
        d["new_layers"] = list(self.new_layers)
        if d["old_n_kv_head"] is None:
            del d["old_n_kv_head"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MaskSpec:
        """Inverse of to_dict.

        Raises:
            TypeError: unknown or missing fields; ValueError: ramp_steps < 1.
        """
        return cls(**d)


def _new_units(n_new: int, old_index: Tensor) -> Tensor:
    """Bool (n_new,): True everywhere except at ``old_index`` (int64)."""
    is_new = torch.ones(n_new, dtype=torch.bool)
    is_new[old_index] = False
    return is_new


def new_unit_flags(spec: MaskSpec, cfg: Any) -> dict[str, Tensor]:
    """For each mask buffer this growth needs (a subset of MASK_BUFFERS, in that order), a bool vector that is True
    on new units: growth_mask_hidden (d,), growth_mask_attn (H*Q,), growth_mask_ffn (F,), growth_gate_layer (L,),
    with the sizes of ``cfg`` (the grown model; its family's ``old_attention_units`` places the old attention
    units)."""
    flags = {}
    if cfg.n_embd != spec.old_n_embd:
        flags["growth_mask_hidden"] = _new_units(cfg.n_embd, torch.arange(spec.old_n_embd))
    old_attn = cfg.old_attention_units(spec.old_n_head, spec.old_head_dim, spec.old_n_kv_head)
    if old_attn is not None:
        flags["growth_mask_attn"] = _new_units(cfg.n_head * cfg.head_dim, old_attn)
    if cfg.ffn_dim != spec.old_ffn_dim:
        flags["growth_mask_ffn"] = _new_units(cfg.ffn_dim, torch.arange(spec.old_ffn_dim))
    if spec.new_layers:
        gate = torch.zeros(cfg.n_layer, dtype=torch.bool)
        gate[list(spec.new_layers)] = True
        flags["growth_gate_layer"] = gate
    return flags


def mask_values(is_new: Tensor, r: float) -> Tensor:
    """Mask values of the same shape as the bool ``is_new``: 1 on old units, r in [0, 1] on new ones (fp32)."""
    return torch.where(is_new, torch.tensor(r, dtype=torch.float32), torch.tensor(1.0))


class GrowthMaskedModel(nn.Module):
    """The life of a model's growth masks, shared by both families: add the buffers of a ``MaskSpec``, move them
    along the ramp after each optimizer step, drop them at 1. A subclass sets ``self.config`` and
    ``self.growth_masks = None`` and defines ``mask_reference`` (the parameter whose device and dtype the masks
    take: the token embedding)."""

    config: Any  # the family's config
    growth_masks: MaskSpec | None

    @property
    def mask_reference(self) -> Tensor:
        """The parameter whose device and dtype the masks follow."""
        raise NotImplementedError

    def add_growth_masks(self, spec: MaskSpec, step: int | None = None) -> None:
        """Register the mask buffers of ``spec`` (persistent: in ``state_dict``), at the ramp value of ``step``
        (default: spec.start_step, i.e. 0 on new units), in the device and dtype of ``mask_reference``.

        Raises:
            ValueError: the model already has masks, or the spec does not fit this config.
        """
        if self.growth_masks is not None:
            raise ValueError("model already has growth masks; remove_growth_masks() or finish the ramp first")
        spec.check(self.config)
        r = spec.value(spec.start_step if step is None else step)
        ref = self.mask_reference
        for name, is_new in new_unit_flags(spec, self.config).items():
            self.register_buffer(name, mask_values(is_new, r).to(device=ref.device, dtype=ref.dtype), persistent=True)
        self.growth_masks = spec

    def set_growth_step(self, step: int) -> float:
        """Set every mask to the ramp value at ``step`` optimizer steps; at 1 remove the masks. Call after each
        optimizer step (and after loading a checkpoint). Returns the ramp value r in [0, 1] (1.0 when there are
        no masks)."""
        spec = self.growth_masks
        if spec is None:
            return 1.0
        r = spec.value(step)
        if r >= 1.0:
            self.remove_growth_masks()
            return 1.0
        for name, is_new in new_unit_flags(spec, self.config).items():
            buf = getattr(self, name)
            buf.copy_(mask_values(is_new, r).to(buf.dtype))
        return r

    def remove_growth_masks(self) -> None:
        """Drop the mask buffers: the model becomes the plain model of its family (exact when the ramp reached 1)."""
        for name in MASK_BUFFERS:
            if name in self._buffers:
                del self._buffers[name]
        self.growth_masks = None

    def mask_inputs(self) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
        """(hidden (d,), attn (H*Q,), ffn (F,), gate (L,)) in the parameters' dtype, None for an absent mask.

        DeepSpeed casts parameters to bf16/fp16 but may leave buffers in fp32, hence the cast.
        """
        if self.growth_masks is None:
            return None, None, None, None
        dtype = self.mask_reference.dtype
        masks = (getattr(self, name, None) for name in MASK_BUFFERS)
        hidden, attn, ffn, gate = (None if z is None else z.to(dtype) for z in masks)
        return hidden, attn, ffn, gate
