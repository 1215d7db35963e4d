"""Where the tensors of a training state live, behind one small interface that growth.ops.apply drives.

A store holds, per parameter name (the transformers class's names: GPT-2 or Llama), three full fp32 tensors of the
parameter's shape: the weight and Adam's exp_avg and exp_avg_sq. Stores for a live DeepSpeed engine
(``deepspeed.utils.safe_get/set_full_*``, each call a collective) and for universal checkpoints (one folder per
parameter; ZeRO-3 stores flat 1-D tensors, which such a store must reshape to ``shape(name)`` on read and flatten on
write) implement the same four methods. This module imports torch only.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from growlm.growth.errors import GrowthError


def adam_step_tensor(optimizer: torch.optim.Optimizer, value: float, param: torch.Tensor) -> torch.Tensor:
    """A torch Adam/AdamW ``state['step']`` of ``value`` where that optimizer keeps it: a float32 scalar on the
    parameter's device for the fused and capturable kernels (which read it there), a CPU scalar otherwise."""
    if optimizer.defaults.get("fused") or optimizer.defaults.get("capturable"):
        return torch.tensor(float(value), dtype=torch.float32, device=param.device)
    return torch.tensor(float(value))


class ParamState(NamedTuple):
    """One parameter's fp32 value and Adam moments, all of the parameter's shape (the model's own layout: GPT-2
    Conv1D (in, out), Llama nn.Linear (out, in))."""

    weight: Tensor
    exp_avg: Tensor
    exp_avg_sq: Tensor


@runtime_checkable
class ParamStore(Protocol):
    """Per-parameter access to a training state. Reads return full (unsharded) fp32 tensors of the parameter's
    shape; writes take the same. Implementations may hold one parameter at a time."""

    def names(self) -> list[str]:
        """Parameter names, in the model's order."""
        ...

    def read(self, name: str) -> ParamState:
        """(weight, exp_avg, exp_avg_sq) of ``name``; raises KeyError for an unknown name."""
        ...

    def write(self, name: str, state: ParamState) -> None:
        """Store the three tensors of ``name`` (its new full value)."""
        ...

    def release(self, name: str) -> None:
        """Hint: ``name`` will not be read again (an in-memory store may free it). May do nothing."""
        ...


class DictStore:
    """A store over a dict name -> ParamState (the in-memory TrainingState). ``release`` drops the entry, so growing
    a state in place never holds the old and the new model whole at the same time."""

    def __init__(self, params: dict[str, ParamState] | None = None) -> None:
        self.params: dict[str, ParamState] = {} if params is None else params

    def names(self) -> list[str]:
        return list(self.params)

    def read(self, name: str) -> ParamState:
        return self.params[name]

    def write(self, name: str, state: ParamState) -> None:
        self.params[name] = ParamState(*state)

    def release(self, name: str) -> None:
        self.params.pop(name, None)


class ModuleStore:
    """A store over a model and (optionally) its torch optimizer, in one process. Reads give fp32 copies (fp64 stays
    fp64, for exactness tests); a
    parameter without optimizer state reads zero moments. Writes set the parameter in place (cast to its dtype) and,
    with an optimizer, its exp_avg / exp_avg_sq (creating the state entry with the optimizer's current step)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, step: int = 0) -> None:
        self.params = dict(model.named_parameters())
        self.optimizer = optimizer
        self.step = step

    def names(self) -> list[str]:
        return list(self.params)

    def read(self, name: str) -> ParamState:
        p = self.params[name]
        dtype = torch.float64 if p.dtype == torch.float64 else torch.float32
        w = p.detach().to(dtype, copy=True)
        st = self.optimizer.state.get(p, {}) if self.optimizer is not None else {}
        m = st["exp_avg"].to(dtype, copy=True) if "exp_avg" in st else torch.zeros_like(w)
        v = st["exp_avg_sq"].to(dtype, copy=True) if "exp_avg_sq" in st else torch.zeros_like(w)
        return ParamState(w, m, v)

    def write(self, name: str, state: ParamState) -> None:
        p = self.params[name]
        if tuple(state.weight.shape) != tuple(p.shape):
            raise GrowthError(f"{name}: writing shape {tuple(state.weight.shape)} into a parameter of {tuple(p.shape)}")
        with torch.no_grad():
            p.copy_(state.weight)
        if self.optimizer is not None:
            st = self.optimizer.state[p]
            st["step"] = adam_step_tensor(self.optimizer, self.step, p)
            st["exp_avg"] = state.exp_avg.to(p.dtype).clone()
            st["exp_avg_sq"] = state.exp_avg_sq.to(p.dtype).clone()

    def release(self, name: str) -> None:
        pass
