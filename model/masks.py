"""Growth masks (Masked Structural Growth, Yao et al. 2023, arXiv 2305.02869): which units of a grown GPT are new
and the linear ramp that fades them in. The masked forward pass itself is the one of ``model/gpt.py`` (the masks
are optional inputs of its blocks).

A masked model multiplies every new unit by a value r in [0, 1]; old units by 1. At r = 0 it computes exactly the
function of the model it was grown from (whatever the new weights are); at r = 1 it is a plain GPT-2 and the masks
are dropped. Masks are registered (persistent) buffers of ``GPT`` so that they are saved and resumed with the model:

    growth_mask_hidden (d,)    hidden units: the embedding output, every LayerNorm output and every sublayer output;
                               LayerNorm statistics are mask-weighted (DESIGN.md, section "Model and growth masks")
    growth_mask_attn   (H*Q,)  attention units: q, k and v of new heads (and of new dims of old heads)
    growth_mask_ffn    (F,)    FFN units: the pre-activation of new units (GELU(0) = 0)
    growth_gate_layer  (L,)    per block: x <- x + g * f(x) for both sublayers of a new block

Only the masks a growth needs exist. This module imports torch only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from growlm.model.config import GPTConfig

# The buffer names, in the order GPT passes them to its blocks: hidden (d,), qkv (H*Q,), ffn (F,), gate (L,).
MASK_BUFFERS = ("growth_mask_hidden", "growth_mask_attn", "growth_mask_ffn", "growth_gate_layer")


@dataclass(frozen=True)
class MaskSpec:
    """Which units of a grown model are new, and the ramp that fades them in. JSON-safe via to_dict/from_dict.

    The grown model's units keep the old ones in the leading positions: hidden dims [0, old_n_embd), FFN units
    [0, old_ffn_dim), and in the attention layout (head h, dim r) -> h * Q' + r for h < old_n_head, r < old_head_dim.
    ``new_layers`` lists the indices (in the grown model) of gated blocks.

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

    def check(self, cfg: GPTConfig) -> None:
        """Check that this spec fits ``cfg`` (the grown model's config).

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
        if problems:
            raise ValueError("mask spec does not fit the model config " + cfg.shape_str() + ": " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict (``new_layers`` as a list), e.g. for growlm_state.json."""
        d = asdict(self)
        d["new_layers"] = list(self.new_layers)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MaskSpec:
        """Inverse of to_dict.

        Raises:
            TypeError: unknown or missing fields; ValueError: ramp_steps < 1.
        """
        return cls(**d)


def attn_index(n_head: int, head_dim: int, new_head_dim: int) -> Tensor:
    """Positions (int64, (H*Q,)) of the old attention units in a layout with head dim Q' >= Q: h*Q + r -> h*Q' + r."""
    return (torch.arange(n_head)[:, None] * new_head_dim + torch.arange(head_dim)[None, :]).flatten()


def _new_units(n_new: int, old_index: Tensor) -> Tensor:
    """Bool (n_new,): True everywhere except at ``old_index`` (int64)."""
    is_new = torch.ones(n_new, dtype=torch.bool)
    is_new[old_index] = False
    return is_new


def new_unit_flags(spec: MaskSpec, cfg: GPTConfig) -> dict[str, Tensor]:
    """For each mask buffer this growth needs (a subset of MASK_BUFFERS, in that order), a bool vector that is True
    on new units: growth_mask_hidden (d,), growth_mask_attn (H*Q,), growth_mask_ffn (F,), growth_gate_layer (L,),
    with the sizes of ``cfg`` (the grown model)."""
    flags = {}
    if cfg.n_embd != spec.old_n_embd:
        flags["growth_mask_hidden"] = _new_units(cfg.n_embd, torch.arange(spec.old_n_embd))
    if (cfg.n_head, cfg.head_dim) != (spec.old_n_head, spec.old_head_dim):
        flags["growth_mask_attn"] = _new_units(cfg.n_embd, attn_index(spec.old_n_head, spec.old_head_dim, cfg.head_dim))
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
