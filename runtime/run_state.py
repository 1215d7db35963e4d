"""RunState: the typed ``growlm_state.json`` stored in every checkpoint tag folder.

It is what DeepSpeed's checkpoint does not know about a run: the model shape, the data position and identity, the
seed, how the checkpoint was saved (world size, ZeRO stage, precision), the growth state (masks ramping, stages
done, the LR schedule a growth placed, the slope trigger's history) and the growth history. train.py writes it at
every save, ``growlm-grow`` writes it for its output, ``growlm-eval`` and every resume read it; all of them go
through this class, never through string keys.

Not growth.ops.single_process.TrainingState, which holds a model's tensors in one process for the growth operators; the
two
share the types of their common fields (the model config, MaskSpec, ScheduleState, consumed samples).

Versions: files written before this class existed have no ``version`` key and are read as version 1 (same keys,
every later field optional); this code writes ``VERSION``. A file of a newer version is refused. The ``format``
marker ``growlm-checkpoint-v1`` is unchanged, so the file stays recognisable to older readers. Keys this version
does not know are kept in ``extra`` and written back unchanged.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from growlm.model.config import ModelConfig, config_from_dict
from growlm.model.masks import MaskSpec
from growlm.runtime.schedule import ScheduleState

STATE_FILE = "growlm_state.json"
STATE_FORMAT = "growlm-checkpoint-v1"
VERSION = 2  # 1: written before RunState (no "version" key); 2: adds "version", keeps "growth" at every save


class RunStateError(ValueError):
    """A ``growlm_state.json`` that cannot be read as a RunState; the message names the key and what is wrong."""


@dataclass(frozen=True)
class DataIdentity:
    """The token folder a run trained on: its path (as given) and the sha256 of its train split (None: unknown)."""

    dir: str | None = None
    train_sha256: str | None = None


@dataclass(frozen=True)
class InitSource:
    """The transformers GPT-2 folder a run started from (``train.py --init_from``): its path (as given), the sha256
    of its ``model.safetensors`` and the name of its tokenizer (None: the folder had none)."""

    path: str
    weights_sha256: str
    tokenizer: str | None = None


_REQUIRED = ("model_config", "global_step", "consumed_samples", "seq_len", "world_size", "zero_stage", "seed")


@dataclass
class RunState:
    """The growlm training state stored with a checkpoint (``growlm_state.json``); see the module docstring.

    Attributes:
        model_config: the model shape (after any growth).
        global_step: optimizer steps taken (the checkpoint's tag is ``global_step<N>``).
        consumed_samples: training sequences consumed, all ranks (the data position; tokens = samples x seq_len).
        seq_len: tokens per training sequence T.
        world_size: data-parallel ranks that saved the checkpoint.
        zero_stage: DeepSpeed ZeRO stage it was saved at (0-3).
        seed: seed of the init, data order and dropout.
        precision: "fp32" | "bf16" | "fp16" (None in files that do not say).
        consumed_flops: model FLOPs of the training so far (6N + attention, per token; growth changes N).
        slope_points: (cumulative FLOPs, validation loss) since the last growth: the slope trigger's history.
        growth_masks: masks of a masked-family growth still ramping, or None.
        growth_stage: growth-plan stages done so far (train.py --growth_plan).
        schedule: the WarmupCosineLR state a growth placed (re-warm included), or None: the ds_config's schedule.
        data: the token folder trained on.
        ds_config: the DeepSpeed config of the run that saved it.
        init_from: the transformers folder the run's first weights came from (``--init_from``), or None; kept by
            every later save and resume, so a resume never needs the folder.
        universal: a DeepSpeed universal checkpoint (written by growlm-grow; loads at any world size).
        growth: history of the growths this model went through, oldest first, one JSON object each (growlm-grow's
            records; a live growth in train.py adds ``{step, stage, family, live: true, from, to}``).
        version: format version (``VERSION`` when written by this code, 1 for files from before RunState).
        extra: keys of the file this version does not know, written back unchanged.
    """

    model_config: ModelConfig
    global_step: int
    consumed_samples: int
    seq_len: int
    world_size: int
    zero_stage: int
    seed: int
    precision: str | None = None
    consumed_flops: int = 0
    slope_points: list[tuple[float, float]] = field(default_factory=list)
    growth_masks: MaskSpec | None = None
    growth_stage: int = 0
    schedule: ScheduleState | None = None
    data: DataIdentity = field(default_factory=DataIdentity)
    ds_config: dict[str, Any] = field(default_factory=dict)
    init_from: InitSource | None = None
    universal: bool = False
    growth: list[dict[str, Any]] = field(default_factory=list)
    version: int = VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def consumed_tokens(self) -> int:
        """Training tokens consumed: consumed_samples x seq_len."""
        return self.consumed_samples * self.seq_len

    def to_json(self) -> dict[str, Any]:
        """The JSON object of ``growlm_state.json`` (plain dicts, lists and numbers; ``version`` is ``VERSION``)."""
        d: dict[str, Any] = {"format": STATE_FORMAT, "version": VERSION}
        d.update(
            global_step=self.global_step,
            consumed_samples=self.consumed_samples,
            consumed_tokens=self.consumed_tokens,
            model_config=self.model_config.to_dict(),
            seq_len=self.seq_len,
            world_size=self.world_size,
            zero_stage=self.zero_stage,
            precision=self.precision,
            seed=self.seed,
            slope_points=[list(p) for p in self.slope_points],
            consumed_flops=self.consumed_flops,
            growth_masks=self.growth_masks.to_dict() if self.growth_masks is not None else None,
            growth_stage=self.growth_stage,
            schedule=asdict(self.schedule) if self.schedule is not None else None,
            data=asdict(self.data),
            ds_config=self.ds_config,
            universal=self.universal,
            growth=list(self.growth),
        )
        if self.init_from is not None:  # only then: a run not started from a folder writes the keys it always did
            d["init_from"] = asdict(self.init_from)
        d.update({k: v for k, v in self.extra.items() if k not in d})
        return d

    def dumps(self) -> str:
        """``to_json`` as indented JSON text."""
        return json.dumps(self.to_json(), indent=2)

    @classmethod
    def from_json(cls, d: dict[str, Any] | str) -> RunState:
        """Read a ``growlm_state.json`` object (or its text), of this version or an older one.

        Raises:
            RunStateError: not a JSON object, another ``format``, a newer ``version``, a required key missing
                (``_REQUIRED``; model_config first), or a value of the wrong type or shape.
        """
        if isinstance(d, str):
            try:
                d = json.loads(d)
            except json.JSONDecodeError as e:
                raise RunStateError(f"not valid JSON ({e}); the checkpoint is damaged") from e
        if not isinstance(d, dict):
            raise RunStateError(f"holds a JSON {type(d).__name__}, not an object; the checkpoint is damaged")
        if d.get("format", STATE_FORMAT) != STATE_FORMAT:
            raise RunStateError(f"format {d.get('format')!r}, expected {STATE_FORMAT!r}")
        version = d.get("version", 1)
        if not isinstance(version, int) or version > VERSION:
            raise RunStateError(
                f"version {version!r} was written by a newer growlm (this one reads versions 1-{VERSION}); upgrade"
            )
        for key in _REQUIRED:
            if key not in d:
                what = "cannot tell the model's shape" if key == "model_config" else "the run state is incomplete"
                raise RunStateError(f"has no '{key}'; {what} (damaged checkpoint?)")
        try:
            return cls._from_checked(d, version)
        except (TypeError, ValueError, KeyError) as e:
            raise RunStateError(f"holds an invalid value ({type(e).__name__}: {e}); the checkpoint is damaged") from e

    @classmethod
    def _from_checked(cls, d: dict[str, Any], version: int) -> RunState:
        """``from_json`` after the format, version and required keys are checked."""
        try:
            cfg = config_from_dict(d["model_config"])
        except (TypeError, ValueError, AttributeError) as e:
            raise RunStateError(f"invalid model_config ({e})") from e
        known = {f.name for f in fields(cls)} | {"format", "consumed_tokens"}
        masks, sched, data, init = d.get("growth_masks"), d.get("schedule"), d.get("data") or {}, d.get("init_from")
        return cls(
            model_config=cfg,
            global_step=int(d["global_step"]),
            consumed_samples=int(d["consumed_samples"]),
            seq_len=int(d["seq_len"]),
            world_size=int(d["world_size"]),
            zero_stage=int(d["zero_stage"]),
            seed=int(d["seed"]),
            precision=d.get("precision"),
            consumed_flops=int(d.get("consumed_flops") or 0),
            slope_points=[(float(f), float(v)) for f, v in d.get("slope_points") or []],
            growth_masks=MaskSpec.from_dict(masks) if masks else None,
            growth_stage=int(d.get("growth_stage") or 0),
            schedule=ScheduleState(**sched) if sched else None,
            data=DataIdentity(dir=data.get("dir"), train_sha256=data.get("train_sha256")),
            ds_config=dict(d.get("ds_config") or {}),
            init_from=InitSource(**init) if init else None,
            universal=bool(d.get("universal", False)),
            growth=[dict(g) for g in d.get("growth") or []],
            version=version,
            extra={k: v for k, v in d.items() if k not in known},
        )
