"""An experiment as a spec file: the YAML that says what an IsoFLOP growth experiment runs, checked by pydantic.
Pure data (no torch); docs/evaluation.md ("Writing an experiment") shows a whole file.

The question every spec asks: at a budget of B training FLOPs, does a model grown with growlm's operators reach a
lower loss (or the same loss for less compute) than the best model of any shape trained from scratch with the same
FLOPs (the IsoFLOP envelope: Hoffmann et al. 2022, arXiv 2203.15556, section 3.2)? A spec names:

- ``model``: the family (any of model.registry's: gpt2, llama, qwen2), the vocabulary, the head rule (one head
  size for every shape; ``kv_ratio`` query heads per key/value head for the Llama-shaped families) and any other
  config field every shape shares (``config``);
- ``train``: what every run shares (tokens per step, schedule, validation), and the token folder (``data``);
- ``budget_flops``: B; every budget elsewhere is a multiple of it;
- ``seeds``: the pilot seed (LR sweeps, arm choices), the screen seeds and the number of main seeds (0 ..
  ``main`` - 1);
- ``envelope``: the shapes (n_layer x n_embd), each with a tuned LR or swept here; the screen (every shape on the
  screen seeds at B) keeps the ``best`` of them, which run on every main seed; the one of those with the lowest mean
  loss at B over the main seeds is the optimum S*;
- ``arms``: growth arms into a target (a named shape, or ``optimum``: S*), each from a start shape, with the growth
  points, LR grid factors, LR policies after growth and, after a width growth, the LR rule to try on the pilot
  seed; the primary arm is the one with the lowest pilot loss;
- ``bracket``: the budgets below and past B at which the best shapes (and the target) run on a main seed, nearest
  first and only as far as needed to bracket the arm's loss there, so that the saving is read by interpolation,
  never extrapolation;
- ``goal``: the saving of compute against the envelope that the pre-registration names as the claim;
- ``imports``: folders of finished curves (earlier experiments') whose runs count as this one's when they are the
  same run (same shapes, budget, LR, seed, settings and token folder).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

SPEC_VERSION = 1


class SpecError(ValueError):
    """A spec file that cannot be read or does not describe an experiment; the message names the file, the field and
    the fix in one line."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    """The model family and what every shape shares. head_size: n_embd / n_head of every shape; kv_ratio: query heads
    per key/value head (Llama-shaped families only; 1 = multi-head attention); config: other config fields (e.g.
    ``tie_word_embeddings``, ``rope_theta``); n_positions is the run's seq_len."""

    family: str
    vocab_size: int = Field(gt=0)
    head_size: int = Field(gt=0)
    kv_ratio: int = Field(default=1, gt=0)
    config: dict[str, Any] = Field(default_factory=dict)


class TrainSpec(_Strict):
    """What every run shares: batch x seq_len tokens per optimizer step; linear warm-up over ``warmup_frac`` of a
    run's steps (at least 2) and cosine decay to 0 at its last step; a re-warm after growth over ``rewarm_frac``;
    ``curve_points`` validation points evenly spaced in FLOPs on ``curve_windows`` windows, the final one on
    ``final_windows``; the torch device."""

    seq_len: int = Field(default=64, gt=0)
    batch: int = Field(default=16, gt=0)
    warmup_frac: float = Field(default=0.05, ge=0, lt=1)
    rewarm_frac: float = Field(default=0.05, ge=0, lt=1)
    curve_points: int = Field(default=8, gt=0)
    curve_windows: int = Field(default=64, gt=1)
    final_windows: int = Field(default=512, gt=1)
    device: str = "cpu"


class DataSpec(_Strict):
    """The token folder: growlm's small-vocabulary BPE of the built-in corpus (``model.vocab_size`` tokens) plus
    the ``extra`` sources (growlm-build-corpus --extra), prepared in growlm's cache when missing."""

    extra: tuple[str, ...] = ()


class Seeds(_Strict):
    """pilot: the seed of every LR sweep and arm choice; screen: the main seeds every new shape runs on before the
    best are chosen; main: the number of main seeds (0 .. main - 1)."""

    pilot: int = 100
    screen: tuple[int, ...] = Field(default=(0, 1), min_length=1)
    main: int = Field(default=10, ge=2)

    @model_validator(mode="after")
    def _apart(self) -> Seeds:
        if self.pilot < self.main:
            raise ValueError(f"seeds.pilot {self.pilot} is one of the main seeds 0..{self.main - 1}; choose one above")
        if not set(self.screen) <= set(range(self.main)):
            raise ValueError(f"seeds.screen {list(self.screen)} must be main seeds (0..{self.main - 1})")
        return self


class Sweep(_Strict):
    """An LR sweep: the grid centre / factor, centre, centre x factor, then one more factor step past an edge while
    the best LR sits at that edge, ``widen`` steps at most."""

    factor: float = Field(default=2.0, gt=1)
    widen: int = Field(default=2, ge=0)


class Shape(_Strict):
    """One envelope shape: [n_layer, n_embd], and its peak LR when it was tuned already (else swept here, centred on
    the muP-scaled LR of the nearest tuned shape: ``envelope.lr_centre``)."""

    shape: tuple[int, int]
    lr: float | None = Field(default=None, gt=0)

    @field_validator("shape")
    @classmethod
    def _positive(cls, v: tuple[int, int]) -> tuple[int, int]:
        if min(v) < 1:
            raise ValueError(f"shape {list(v)}: n_layer and n_embd must be >= 1")
        return v


class Envelope(_Strict):
    """The scratch shapes, by name. best: how many of them (lowest mean loss at B over the screen seeds) run on every
    main seed; their lowest mean at B is the optimum S*. lr_centre: where a new shape's sweep is centred, the tuned
    LR of a reference shape times its n_embd / the new shape's (Adam's hidden-matrix LR scales as 1 / width: Yang et
    al. 2021, arXiv 2203.03466, table 3): 'mup' the shape of its depth nearest in width (no shape of its depth: the
    nearest depth); 'mup-at-width' the shape of n_embd ``lr_centre_width`` nearest in depth (ties: the shallower)."""

    shapes: dict[str, Shape]
    best: int = Field(default=3, ge=1)
    lr_centre: Literal["mup", "mup-at-width"] = "mup"
    lr_centre_width: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _width(self) -> Envelope:
        if (self.lr_centre == "mup-at-width") != (self.lr_centre_width is not None):
            raise ValueError("lr_centre_width goes with lr_centre: mup-at-width (and only with it)")
        return self


RELATIVE = ("optimum", "optimum/depth", "optimum/width", "optimum/both", "optimum*depth")
ShapeExpr = tuple[int, int] | Literal["optimum", "optimum/depth", "optimum/width", "optimum/both", "optimum*depth"]


class Arm(_Strict):
    """A growth arm: start and target shapes, each [n_layer, n_embd] or relative to the optimum S* ('optimum';
    'optimum/depth', '/width', '/both': half its n_layer, n_embd or both; 'optimum*depth': twice its n_layer), the
    operator (growth.ops.make_rules options, with ``family``), the growth points to try on the pilot seed (x B of
    the run's budget; the first is where the LR is swept), the peak-LR grid factors (times the target's LR), the LR
    policies after growth ('continue', 'rewarm') and the LR rules after a width growth ('keep'; 'mup': the hidden
    matrices' LR times old n_embd / new n_embd). Every arm is compared with S*, whatever its target."""

    start: ShapeExpr
    target: ShapeExpr = "optimum"
    op: dict[str, Any]
    what: str
    growth_at: tuple[float, ...] = (0.5,)
    lr_factors: tuple[float, ...] = Field(default=(0.5, 1.0, 2.0), min_length=1)
    policies: tuple[Literal["continue", "rewarm"], ...] = Field(default=("continue", "rewarm"), min_length=1)
    lr_rules: tuple[Literal["keep", "mup"], ...] = Field(default=("keep",), min_length=1)

    @field_validator("growth_at")
    @classmethod
    def _inside(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if not v or not all(0 < g < 1 for g in v):
            raise ValueError(f"growth_at {list(v)}: each growth point must lie strictly inside the run (0 < g < 1)")
        return v

    @field_validator("op")
    @classmethod
    def _family(cls, v: dict[str, Any]) -> dict[str, Any]:
        if v.get("family") not in ("duplicate", "masked"):
            raise ValueError("op needs family: duplicate or masked (growth.ops.make_rules)")
        return v


class Bracket(_Strict):
    """Budgets (x B) below and past B, nearest first, at which the best shapes (and S* alone) run on a main seed
    until their losses bracket the primary arm's there."""

    below: tuple[float, ...] = (0.75, 0.5)
    past: tuple[float, ...] = (1.25, 1.5, 2.0)

    @model_validator(mode="after")
    def _sides(self) -> Bracket:
        if not all(0 < b < 1 for b in self.below) or not all(b > 1 for b in self.past):
            raise ValueError("bracket.below must lie in (0, 1) and bracket.past above 1 (x B)")
        if list(self.below) != sorted(self.below, reverse=True) or list(self.past) != sorted(self.past):
            raise ValueError("bracket budgets go nearest to B first: below descending, past ascending")
        return self


class Spec(_Strict):
    """A whole experiment (the module docstring)."""

    version: Literal[1] = SPEC_VERSION
    name: str
    protocol: str
    question: str
    model: ModelSpec
    train: TrainSpec = TrainSpec()
    data: DataSpec = DataSpec()
    budget_flops: float = Field(gt=0)
    seeds: Seeds = Seeds()
    sweep: Sweep = Sweep()
    envelope: Envelope
    arms: dict[str, Arm] = Field(default_factory=dict)
    bracket: Bracket = Bracket()
    goal: float = 0.10
    imports: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _shapes(self) -> Spec:
        h = self.model.head_size
        bad = [z for z, v in self.envelope.shapes.items() if v.shape[1] % h]
        if bad:
            raise ValueError(f"envelope shapes {bad}: n_embd must be a multiple of model.head_size {h}")
        seen: dict[tuple[int, int], str] = {}
        for z, v in self.envelope.shapes.items():
            if v.shape in seen:
                raise ValueError(f"envelope shapes {seen[v.shape]} and {z} are both {list(v.shape)}; keep one")
            seen[v.shape] = z
        if self.envelope.best > len(self.envelope.shapes):
            raise ValueError(f"envelope.best {self.envelope.best} > the {len(self.envelope.shapes)} shapes")
        return self


def load(path: str | Path) -> Spec:
    """The spec in the YAML file ``path``.

    Raises:
        SpecError: the file is missing or not YAML, or a field is missing, unknown or of the wrong kind (one line:
            the file, the field, what is wrong).
    """
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: no such spec file; give the path of an experiment's YAML") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise SpecError(f"{path} cannot be read as YAML ({str(e).splitlines()[0]}); fix the file") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{path} is not a mapping of spec fields; see docs/evaluation.md, 'Writing an experiment'")
    try:
        spec = Spec.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "(top level)"
        raise SpecError(f"{path}: {where}: {err['msg']} (and {e.error_count() - 1} more)" if e.error_count() > 1
                        else f"{path}: {where}: {err['msg']}") from None  # fmt: skip
    from growlm.model.registry import FAMILIES  # lazy: torch, only once the file parsed

    if spec.model.family not in FAMILIES:
        raise SpecError(f"{path}: model.family {spec.model.family!r}: growlm builds {sorted(FAMILIES)}")
    return spec


def shape_config(spec: Spec, shape: tuple[int, int]) -> Any:
    """The model config of a shape [n_layer, n_embd] under ``spec``: n_head = n_embd / head_size (n_kv_head =
    n_head / kv_ratio for the Llama-shaped families), n_positions = seq_len, the spec's vocabulary and config fields.

    Raises:
        ValueError: the family's config refuses the shape (e.g. n_head not a multiple of kv_ratio).
    """
    from growlm.model.config import config_from_dict  # lazy: torch

    n_layer, n_embd = shape
    n_head = n_embd // spec.model.head_size
    d = {"arch": spec.model.family, "n_layer": n_layer, "n_embd": n_embd, "n_head": n_head,
         "n_positions": spec.train.seq_len, "vocab_size": spec.model.vocab_size, **spec.model.config}  # fmt: skip
    if spec.model.family != "gpt2":
        if n_head % spec.model.kv_ratio:
            raise ValueError(f"shape {n_layer} x {n_embd}: {n_head} heads is not a multiple of kv_ratio "
                             f"{spec.model.kv_ratio}")  # fmt: skip
        d["n_kv_head"] = n_head // spec.model.kv_ratio
    return config_from_dict(d)
