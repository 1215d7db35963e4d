"""The stage list of a growth run, as YAML (or JSON, a subset): the starting shape and the stages, validated as a
chain when loaded (``load_stages`` -> ``StageList``). Each stage builds its per-parameter ``RuleSet``
(growth.ops.rules).

    seed: 0
    start: {preset: tiny, vocab_size: 512}          # a model preset (model/config.py; GPT-2 or Llama) with
                                                    #   overrides, or fields (arch: llama for a Llama)
    stages:
      - name: deeper
        target: {n_layer: 4}                        # fields that change from the previous stage's shape
        family: masked                              # masked | duplicate
        options: {layer_order: stack}               # operator options (growth.ops.make_rules)
        when: {step: 2000}                          # or {tokens: 4.0e7}, {slope: -0.05}, {slope: auto}, or
                                                    #   {slope: auto, reference: runs/target/metrics.jsonl}
        ramp_steps: 500                             # masked family: mask ramp length (optimizer steps), or
        ramp_frac: 0.25                             #   a fraction of the run left at growth (the default)
        optimizer: {moments: carry, fresh_exp_avg_sq: mean}
        schedule: {kind: continue, rewarm_steps: 0} # growth.ops.schedule_rule.ScheduleRule fields
        resources: {ranks_per_node: 2, grad_accum: 1}  # optional, also in start: where growlm-run runs it

Every stage's operator plan is built when the file is loaded, so a target the family cannot reach fails here, with
the stage named, before any training starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from growlm.data.text import InputError, read_text
from growlm.growth.errors import GrowthError
from growlm.growth.ops import make_rules
from growlm.growth.ops.apply import OptimizerPolicy
from growlm.growth.ops.rules import RuleSet
from growlm.growth.ops.schedule_rule import CONSTANT_OP, ScheduleRule
from growlm.growth.stages.trigger import SLOPE_THRESHOLDS
from growlm.model.config import ModelConfig, config_from_dict, from_preset, grown_shape

TRIGGERS = ("step", "tokens", "slope")


@dataclass(frozen=True)
class Trigger:
    """When a stage starts: after ``value`` optimizer steps ('step'), training tokens ('tokens'), or when the
    smoothed d log10 L / d log10 C reaches ``value`` ('slope'; growth.stages.trigger.slope_trigger).

    ``{slope: auto}`` alone takes Shen et al. 2022's GPT-2 threshold for what grows (SLOPE_THRESHOLDS), which need
    not transfer to another model, corpus or batch. ``{slope: auto, reference: PATH}`` derives the moment from the
    run's own curves instead: ``reference`` is the metrics.jsonl of a scratch run of this stage's target shape, and
    the stage starts once the small model's loss falls no faster per FLOP than the reference's did at the same loss
    (growth.stages.trigger.equal_rate_reached); ``value`` is then NaN.
    """

    kind: str
    value: float
    reference: str | None = None

    def describe(self) -> str:
        """'step 2000', 'slope -0.0575', 'slope auto (equal rate with runs/x/metrics.jsonl)'."""
        if self.reference:
            return f"{self.kind} auto (equal rate with {self.reference})"
        return f"{self.kind} {self.value:g}"


@dataclass(frozen=True)
class Stage:
    """One stage of a growth plan: the target shape, operator family and options, trigger, mask ramp length, Adam-state
    policy and schedule rule."""

    name: str
    target: ModelConfig
    family: str
    when: Trigger
    options: dict[str, Any] = field(default_factory=dict)
    ramp_steps: int = 0
    ramp_frac: float | None = None
    optimizer: OptimizerPolicy = field(default_factory=OptimizerPolicy)
    schedule: ScheduleRule = field(default_factory=ScheduleRule)
    resources: dict[str, Any] | None = None  # where growlm-run runs it, as written (trainer.driver.resources)

    def rules(self, current: ModelConfig, seed: int = 0) -> RuleSet:
        """The per-parameter rules of this stage's operator from ``current`` (the previous stage's shape)."""
        opts = dict(self.options)
        if self.family == "masked" or opts.get("symmetry") == "noise":
            opts.setdefault("seed", seed)
        if self.family == "masked":
            if self.ramp_steps:
                opts["ramp_steps"] = self.ramp_steps
            if self.ramp_frac is not None:
                opts["ramp_frac"] = self.ramp_frac
        return make_rules(current, self.target, self.family, **opts)


@dataclass(frozen=True)
class StageList:
    """A validated stage list (a growth plan file): the first model's shape and the stages, each growing the previous
    shape."""

    start: ModelConfig
    stages: tuple[Stage, ...]
    seed: int = 0
    resources: dict[str, Any] | None = None  # where the start runs, as written (trainer.driver.resources)


def _resources(raw: Any, where: str) -> dict[str, Any] | None:
    """A ``resources:`` mapping as written (None when absent); only growlm-run reads its keys
    (trainer.driver.resources.stage_resources), train.py runs every stage where it was launched.

    Raises:
        GrowthError: it is not a mapping.
    """
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise GrowthError(f"{where}: resources must be a mapping, e.g. {{ranks_per_node: 2, grad_accum: 1}}")
    return dict(raw)


def _config(base: ModelConfig | None, d: dict[str, Any], where: str) -> ModelConfig:
    """The shape a ``start`` or ``target`` mapping names: a preset with overrides (``{preset: llama-tiny, n_layer:
    4}``: the preset picks the family), else, for the start, every field (``arch: llama`` for a Llama, else GPT-2),
    else the fields that change from ``base``, the previous stage's shape, whose family it keeps; the fields that
    follow the width follow it unless given (``model.config.grown_shape``: a Llama's n_inner scales with n_embd, its
    n_kv_head keeps the query heads per key/value head, so ``{n_embd: 128, n_head: 8}`` from d 64 / 4 heads / 2 kv
    heads / F 128 adds heads of the same head dim, 4 kv heads and F 256).

    Raises:
        GrowthError: unknown fields, an invalid shape, or a target of another family than ``base`` (a growth keeps
            the family).
    """
    d = dict(d)
    try:
        if "preset" in d:
            cfg = from_preset(d.pop("preset"), **d)
        elif base is None:
            cfg = config_from_dict(d)
        else:
            arch = d.pop("arch", base.arch)
            if arch != base.arch:
                raise ValueError(f"arch {arch!r}: a growth keeps the model family ({base.arch!r})")
            unknown = set(d) - {f.name for f in fields(base)}
            if unknown:
                raise ValueError(f"unknown {type(base).__name__} fields {sorted(unknown)}")
            cfg = grown_shape(base, d)  # the fields that follow the width follow it unless given
    except (ValueError, TypeError) as e:
        raise GrowthError(f"{where}: {e}") from e
    if base is not None and cfg.arch != base.arch:
        raise GrowthError(
            f"{where}: a {cfg.arch} target after a {base.arch} shape; a growth keeps the model family (name a "
            f"{base.arch} preset, or give the fields that change)"
        )
    return cfg


def _kind(old: ModelConfig, new: ModelConfig) -> str:
    deeper = new.n_layer > old.n_layer
    wider = (new.n_embd, new.n_head, new.n_kv_head, new.ffn_dim) != (old.n_embd, old.n_head, old.n_kv_head, old.ffn_dim)
    return "both" if deeper and wider else ("depth" if deeper else "width")


def _sub(cls: type, d: dict[str, Any] | None, where: str) -> Any:
    try:
        return cls(**(d or {}))
    except TypeError as e:
        raise GrowthError(f"{where}: {e}") from e


Mapping = dict[str, Any]


class StageDoc(BaseModel):
    """The keys and types of one stage as written (pydantic v2); the values are judged by ``parse_stages``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: StrictStr | None = None
    target: Mapping
    family: Literal["masked", "duplicate"]
    when: Mapping
    options: Mapping | None = None
    ramp_steps: Annotated[StrictInt, Field(ge=0)] = 0
    ramp_frac: Annotated[float, Field(gt=0, le=1)] | None = None
    optimizer: Mapping | None = None
    schedule: Mapping | None = None
    resources: Mapping | None = None


class PlanDoc(BaseModel):
    """The keys and types of a plan file as written: ``seed`` (optional), ``start`` and a non-empty ``stages``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    seed: StrictInt = 0
    start: Mapping
    stages: Annotated[list[Mapping], Field(min_length=1)]


# the words a refusal uses for each field: ``KEY=VALUE must be ...``
FIELD_RULES = {
    "name": "a string", "target": "a mapping of shape keys, e.g. {n_layer: 4}", "family": "masked or duplicate",
    "when": "a mapping, e.g. {step: 1000}", "options": "a mapping", "ramp_steps": "an integer >= 0",
    "ramp_frac": "a number in (0, 1]", "optimizer": "a mapping", "schedule": "a mapping", "resources": "a mapping",
    "seed": "an integer", "start": "a mapping, e.g. {preset: tiny}",
    "stages": "a non-empty list of mappings, each '- name: ...' with target, family and when",
}  # fmt: skip


def _schema_error(e: ValidationError, raw: Mapping, where: str, required: str) -> GrowthError:
    """One line for the first problem pydantic found in ``raw``."""
    err = e.errors()[0]
    key = str(err["loc"][0]) if err["loc"] else ""
    if err["type"] in ("extra_forbidden", "missing"):
        unknown = sorted(k for k in raw if k not in FIELD_RULES)
        return GrowthError(f"{where} needs {required}; unknown keys {unknown}")
    return GrowthError(f"{where}: {key}={raw.get(key)!r} must be {FIELD_RULES.get(key, 'valid')}")


def check_plan_doc(doc: Any) -> None:
    """Refuse a plan document whose keys or value types are wrong (``PlanDoc``, each stage a ``StageDoc``).

    Raises:
        GrowthError: one line naming the first key (and stage) that is wrong.
    """
    if not isinstance(doc, dict):
        raise GrowthError("a growth plan is a mapping with 'start' and 'stages'")
    try:
        PlanDoc.model_validate(doc)
    except ValidationError as e:
        raise _schema_error(e, doc, "a plan", "'start' and a non-empty 'stages' (optional 'seed')") from None
    for i, raw in enumerate(doc["stages"]):
        try:
            StageDoc.model_validate(raw)
        except ValidationError as e:
            where = f"stage {raw.get('name', f'stage {i}')!r}"
            raise _schema_error(e, raw, where, "target, family and when") from None


# trigger kind -> (is the value valid, what it must be: named in the refusal)
TRIGGER_VALUES = {
    "step": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1 (the optimizer step after which it grows)"),
    "tokens": (lambda v: isinstance(v, (int, float)) and v > 0, "a positive number of training tokens"),
    "slope": (lambda v: isinstance(v, (int, float)), "a number (d log10 L / d log10 C, e.g. -0.05) or auto"),
}


def check_trigger_value(kind: str, value: Any, where: str) -> None:
    """Refuse a trigger value of the wrong kind: a step that is not an integer >= 1 (``2.5``, ``true``: YAML's
    booleans are Python bools, which are ints), a token count that is not a positive number, a slope that is not a
    number, or any value that is NaN or infinite.

    Raises:
        GrowthError: ``<where>: when: {KIND: VALUE} must be ...``; step 0 says why (no Adam state before step 1).
    """
    ok, rule = TRIGGER_VALUES[kind]
    written = "true" if value is True else "false" if value is False else repr(value)
    valid = not isinstance(value, bool) and ok(value) and math.isfinite(value)
    if valid:
        return
    if kind == "step" and value == 0 and not isinstance(value, bool):
        raise GrowthError(
            f"{where}: when: {{step: 0}} grows before training: DeepSpeed has no Adam state before the first "
            "optimizer step; grow at step >= 1, or start the plan at the grown shape"
        )
    hint = ""
    if isinstance(value, str):
        try:
            float(value)
            hint = " (YAML reads this as text: write a number without quotes, and an exponent with a dot, 4.0e+7)"
        except ValueError:
            pass
    raise GrowthError(f"{where}: when: {{{kind}: {written}}} must be {rule}{hint}")


def parse_stages(doc: dict[str, Any]) -> StageList:
    """Validate a parsed plan document and build its stages.

    Raises:
        GrowthError: a missing or unknown key, a trigger value of the wrong kind (``check_trigger_value``), a shape
            that is invalid (e.g. n_embd not divisible by n_head) or that
            the stage's family cannot reach from the previous stage (shrinking, head-dim change, ...), triggers that
            do not increase, a stage that starts while the previous stage's mask ramp is still running, or a stage
            name that repeats one or holds '/' or '..'.
    """
    check_plan_doc(doc)
    seed = int(doc.get("seed", 0))
    start_doc = dict(doc["start"]) if isinstance(doc["start"], dict) else doc["start"]
    start_res = _resources(start_doc.pop("resources", None), "start")  # read by growlm-run (trainer.driver.resources)
    current = _config(None, start_doc, "start")
    start, stages = current, []
    last: dict[str, float] = {}
    ramp_end_step = None
    for i, raw in enumerate(doc["stages"]):
        name = raw.get("name", f"stage {i}")
        where = f"stage {name!r}"
        if not isinstance(name, str) or not name or "/" in name or ".." in name or name in (s.name for s in stages):
            raise GrowthError(f"{where}: stage names must be unique non-empty strings without '/' or '..'; rename it")
        extra = set(raw) - {"name", "target", "family", "options", "when", "ramp_steps", "ramp_frac", "optimizer",
                            "schedule"}  # fmt: skip
        extra -= {"resources"}
        if extra or "target" not in raw or "family" not in raw or "when" not in raw:
            raise GrowthError(f"{where} needs target, family and when; unknown keys {sorted(extra)}")
        target = _config(current, raw["target"], where)
        when = dict(raw["when"]) if isinstance(raw["when"], dict) else raw["when"]
        reference = when.pop("reference", None) if isinstance(when, dict) else None
        if not isinstance(when, dict) or len(when) != 1 or next(iter(when)) not in TRIGGERS:
            raise GrowthError(
                f"{where}: when={raw['when']!r} must be one of {{step: N}}, {{tokens: N}}, {{slope: X}}, "
                "{slope: auto} or {slope: auto, reference: METRICS_JSONL}"
            )
        kind, value = next(iter(when.items()))
        if reference is not None and (kind != "slope" or value != "auto" or not isinstance(reference, str)):
            raise GrowthError(
                f"{where}: 'reference' goes with {{slope: auto}} only, as the path of a scratch run's metrics.jsonl "
                f"(got when={raw['when']!r})"
            )
        if kind == "slope" and value == "auto":
            value = math.nan if reference else SLOPE_THRESHOLDS[_kind(current, target)]
        else:
            check_trigger_value(kind, value, where)
        value = float(value)
        if kind in last and value <= last[kind] and kind != "slope":
            raise GrowthError(f"{where} starts at {kind}={value:g}, not after the previous stage ({last[kind]:g})")
        if kind == "step" and ramp_end_step is not None and value < ramp_end_step:
            raise GrowthError(
                f"{where} starts at step {value:g} while the previous stage's mask ramp runs until step "
                f"{ramp_end_step}; start it at step >= {ramp_end_step}"
            )
        sched = dict(raw.get("schedule") or {})
        if sched.get("constant_op") == "auto":
            sched["constant_op"] = CONSTANT_OP[_kind(current, target)]
        stage = Stage(
            name=name,
            target=target,
            family=raw["family"],
            when=Trigger(kind, value, reference),
            options=dict(raw.get("options") or {}),
            ramp_steps=int(raw.get("ramp_steps", 0)),
            ramp_frac=None if raw.get("ramp_frac") is None else float(raw["ramp_frac"]),
            optimizer=_sub(OptimizerPolicy, raw.get("optimizer"), where),
            schedule=_sub(ScheduleRule, sched, where),
            resources=_resources(raw.get("resources"), where),
        )
        try:
            plan = stage.rules(current, seed)
        except GrowthError as e:
            raise GrowthError(f"{where}: {e}") from e
        last[kind] = value
        fixed_ramp = plan.masks is not None and plan.ramp_frac is None and kind == "step"  # ramp_frac: known later
        ramp_end_step = int(value) + plan.masks.ramp_steps if fixed_ramp else None
        stages.append(stage)
        current = target
    return StageList(start=start, stages=tuple(stages), seed=seed, resources=start_res)


class PlanLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping holding one key twice (plain YAML keeps the last one silently, so a
    second ``when:`` would quietly replace the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        """The mapping of ``node``; a ConstructorError at the second occurrence of a repeated key."""
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *anchor' merges are not repeats
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader's own error names it
                continue
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first given on line {first})", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _yaml_error(path: str | Path, e: yaml.YAMLError) -> GrowthError:
    """One line ``FILE:LINE: problem; fix`` for a YAML error (PyYAML's own message spans lines and names
    ``<unicode string>``)."""
    mark = getattr(e, "problem_mark", None)
    where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
    problem = " ".join(str(getattr(e, "problem", None) or e).split())
    if mark is not None and "'\\t'" in problem:
        return GrowthError(
            f"{where}: a tab character (column {mark.column + 1}); YAML indents with spaces only: replace the tabs "
            "with spaces"
        )
    if problem.startswith("duplicate key"):
        return GrowthError(f"{where}: {problem}; give each key once (delete or merge the repeated one)")
    context = " ".join(str(getattr(e, "context", None) or "").split())
    detail = f"{problem} ({context})" if context else problem
    return GrowthError(f"{where}: the plan file is not valid YAML: {detail}; fix the YAML syntax at that line")


def load_stages(path: str | Path) -> StageList:
    """Read and validate a YAML/JSON growth plan file (see the module docstring). The one plan-file loader of
    train.py --growth_plan, growlm-grow --growth_plan, growlm-run and growlm-bench --growth_plan.

    Raises:
        FileNotFoundError / OSError: the file is missing or cannot be read (callers word it).
        GrowthError: undecodable bytes, a YAML syntax error, a tab, or a repeated key (each ``FILE:LINE: problem;
            fix``, one line), a document that is not a mapping, or a plan that does not validate (``parse_stages``).
    """
    try:
        text = read_text(path)  # data/text.py, the one reader of user files: BOM removed, FILE:LINE errors
    except InputError as e:
        raise GrowthError(str(e)) from None
    try:
        doc = yaml.load(text, Loader=PlanLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as e:
        raise _yaml_error(path, e) from None
    if not isinstance(doc, dict):
        raise GrowthError(f"{path}: a growth plan is a mapping with 'start' and 'stages'")
    return parse_stages(doc)
