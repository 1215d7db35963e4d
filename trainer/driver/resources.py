"""Where a stage of a growth plan runs: the optional ``resources:`` mapping of ``start`` and of each stage
(growth.stages.plan), parsed into a frozen ``Resources`` and checked when the plan is loaded.

    start: {preset: tiny, resources: {ranks_per_node: 1, zero_stage: 2, micro_batch: 4, grad_accum: 2}}
    stages:
      - name: wider
        ...
        resources: {ranks_per_node: 2, grad_accum: 1}     # fields that change; the rest is the previous stage's

A stage without ``resources`` runs where the previous one ran and grows live inside the running job; a stage whose
resources differ is reached by the multi-stage driver (growlm-run, trainer/driver/) through save -> offline growth
and reshard (growth.offline.pipeline) -> relaunch. The global batch (micro_batch x grad_accum x nodes x ranks_per_node
sequences) must stay the same across such a change unless the stage states the new one (``global_batch: N``), and
the ZeRO stage may change only within 1/2 or stay at 3 (DeepSpeed's universal checkpoints: DESIGN.md, "DeepSpeed
facts"). ``None`` for zero_stage, micro_batch or grad_accum means "the DeepSpeed config's"; the driver then checks
the same rules again with the config's values.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    StrictBool,
    StrictInt,
    StrictStr,
    StringConstraints,
    ValidationError,
)

from growlm.growth.errors import GrowthError

RESOURCE_KEYS = (
    "nodes",
    "ranks_per_node",
    "hosts",
    "hostfile",
    "no_ssh",
    "master_addr",
    "zero_stage",
    "micro_batch",
    "grad_accum",
)


@dataclass(frozen=True)
class Resources:
    """Where one stage runs and how its global batch is split.

    Attributes:
        nodes: machines (each runs ``ranks_per_node`` ranks); world size = nodes x ranks_per_node.
        ranks_per_node: ranks (GPUs, or processes on a CPU) per node.
        hosts: node names, one per node (the driver writes the launcher's hostfile from them), or None.
        hostfile: a DeepSpeed hostfile (``name slots=N`` per line) to launch with instead of ``hosts``, or None.
        no_ssh: start one launcher per node on this machine with ``--no_ssh --node_rank R`` (loopback nodes, or
            nodes sharing this machine) instead of reaching the other nodes over ssh (pdsh).
        master_addr: rank 0's address (default 127.0.0.1 on one node or with ``no_ssh``, else the first host).
        zero_stage: ZeRO stage 0-3, or None for the DeepSpeed config's.
        micro_batch: sequences per rank per micro step, or None for the config's train_micro_batch_size_per_gpu.
        grad_accum: micro steps per optimizer step, or None for the config's gradient_accumulation_steps.
    """

    nodes: int = 1
    ranks_per_node: int = 1
    hosts: tuple[str, ...] | None = None
    hostfile: str | None = None
    no_ssh: bool = False
    master_addr: str | None = None
    zero_stage: int | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None

    @property
    def world_size(self) -> int:
        """Ranks of the stage's job (data-parallel world size)."""
        return self.nodes * self.ranks_per_node

    @property
    def global_batch(self) -> int | None:
        """Sequences per optimizer step (micro_batch x grad_accum x world size), or None when micro_batch or
        grad_accum is the config's."""
        if self.micro_batch is None or self.grad_accum is None:
            return None
        return self.micro_batch * self.grad_accum * self.world_size

    def with_defaults(self, zero_stage: int, micro_batch: int, grad_accum: int) -> Resources:
        """These resources with the DeepSpeed config's values in place of None."""
        return replace(
            self,
            zero_stage=zero_stage if self.zero_stage is None else self.zero_stage,
            micro_batch=micro_batch if self.micro_batch is None else self.micro_batch,
            grad_accum=grad_accum if self.grad_accum is None else self.grad_accum,
        )


def _positive(value: Any, key: str, where: str) -> int:
    """``value`` when it is an int >= 1 (a bool or float is not).

    Raises:
        GrowthError: anything else, naming ``where`` and ``resources.<key>``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise GrowthError(f"{where}: resources.{key}={value!r} must be a positive integer")
    return value


NonEmpty = Annotated[StrictStr, StringConstraints(min_length=1)]


class ResourcesDoc(BaseModel):
    """The key/type schema of one ``resources:`` mapping as written (pydantic v2, strict: a bool is no integer, a
    float no ZeRO stage); the relations between keys and with the previous stage are ``parse_resources``'."""

    model_config = ConfigDict(extra="forbid", strict=True)
    nodes: PositiveInt | None = None
    ranks_per_node: PositiveInt | None = None
    hosts: Annotated[list[NonEmpty], Field(min_length=1)] | None = None
    hostfile: NonEmpty | None = None
    no_ssh: StrictBool | None = None
    master_addr: NonEmpty | None = None
    zero_stage: Annotated[StrictInt, Field(ge=0, le=3)] | None = None
    micro_batch: PositiveInt | None = None
    grad_accum: PositiveInt | None = None
    global_batch: PositiveInt | None = None


# what each key must be, in the words of the refusal (``resources.KEY=VALUE must be ...``)
RULES = {
    "nodes": "a positive integer", "ranks_per_node": "a positive integer", "micro_batch": "a positive integer",
    "grad_accum": "a positive integer", "global_batch": "a positive integer", "zero_stage": "0, 1, 2 or 3",
    "hosts": "a non-empty list of host names, e.g. [n0, n1]", "hostfile": "a non-empty string",
    "master_addr": "a non-empty string", "no_ssh": "true or false",
}  # fmt: skip


def _fields(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """The typed, checked fields of one ``resources:`` mapping (only those given; ``global_batch`` is a statement
    checked by ``parse_resources``, not a field).

    Raises:
        GrowthError: an unknown key, or a value of the wrong type or range (one line, the first problem).
    """
    try:
        doc = ResourcesDoc.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        key = str(err["loc"][0]) if err["loc"] else ""
        if err["type"] == "extra_forbidden":
            unknown = sorted(set(raw) - set(ResourcesDoc.model_fields))
            raise GrowthError(
                f"{where}: unknown resources keys {unknown}; known: {', '.join(RESOURCE_KEYS)}, global_batch"
            ) from None
        raise GrowthError(f"{where}: resources.{key}={raw.get(key)!r} must be {RULES[key]}") from None
    given = doc.model_dump(exclude_unset=True, exclude={"global_batch"})
    if "hosts" in given:
        given["hosts"] = tuple(given["hosts"])
    return given


def parse_resources(raw: Any, previous: Resources | None, where: str) -> Resources:
    """The resources of ``start`` (``previous`` None) or of a stage: ``raw`` (the ``resources:`` mapping, or None
    for "as the previous stage") laid over ``previous``, checked on their own and against ``previous``.

    Raises:
        GrowthError: an unknown key; a value of the wrong type or range; ``hosts`` and ``hostfile`` both given, or
            ``hosts`` not one per node; more than one node without ``hosts``, ``hostfile`` or ``no_ssh`` (the
            launcher would not know the machines); or a change the driver cannot carry out (``check_change``).
    """
    base = previous if previous is not None else Resources()
    if raw is None:
        return base
    if not isinstance(raw, dict):
        raise GrowthError(f"{where}: resources must be a mapping, e.g. {{ranks_per_node: 2, grad_accum: 1}}")
    given = _fields(raw, where)
    if "hosts" in given and "hostfile" in given:
        raise GrowthError(f"{where}: give resources.hosts or resources.hostfile, not both")
    if "hosts" in given:
        given.setdefault("nodes", len(given["hosts"]))
        given["hostfile"] = None
    elif "hostfile" in given:
        given["hosts"] = None
    new = replace(base, **given)
    if new.hosts is not None and len(new.hosts) != new.nodes:
        raise GrowthError(
            f"{where}: resources.hosts names {len(new.hosts)} host(s) for nodes={new.nodes}; give one host per node"
        )
    if new.nodes > 1 and new.hosts is None and new.hostfile is None and not new.no_ssh:
        raise GrowthError(
            f"{where}: resources.nodes={new.nodes} but no machines named; give resources.hosts (one per node), "
            "resources.hostfile, or no_ssh: true (every node's launcher started on this machine)"
        )
    if previous is not None:
        stated = raw.get("global_batch")
        if stated is not None:
            _positive(stated, "global_batch", where)
        check_change(previous, new, where, stated)
    elif "global_batch" in raw and new.global_batch is None:
        raise GrowthError(
            f"{where}: resources.global_batch={raw['global_batch']!r} needs micro_batch and grad_accum beside it "
            "(the global batch is micro_batch x grad_accum x ranks); state them"
        )
    elif "global_batch" in raw and raw["global_batch"] != new.global_batch:
        raise GrowthError(
            f"{where}: resources.global_batch={raw['global_batch']} is not micro_batch x grad_accum x "
            f"ranks = {new.global_batch}"
        )
    return new


def check_change(old: Resources, new: Resources, where: str, stated_global_batch: int | None = None) -> None:
    """Refuse a change of resources between two stages that the driver cannot carry out.

    Raises:
        GrowthError: the ZeRO stage is 0 on either side of a change (no universal checkpoint at stage 0) or
            crosses between 1/2 and 3; the global batch changes without ``global_batch`` stating the new value, or
            it cannot be computed (micro_batch/grad_accum left to the config) while the world size changes.
    """
    if old == new:
        if stated_global_batch is not None and stated_global_batch != new.global_batch:
            raise GrowthError(
                f"{where}: resources.global_batch={stated_global_batch} but the resources (and so the "
                f"global batch, {new.global_batch}) do not change"
            )
        return
    zs = (old.zero_stage, new.zero_stage)
    if 0 in zs:
        raise GrowthError(
            f"{where}: a change of resources goes through an offline reshard, which needs ZeRO stage "
            "1, 2 or 3 on both sides (DeepSpeed has no universal checkpoint at stage 0); set "
            "zero_stage: 1, 2 or 3"
        )
    if None not in zs and (zs[0] == 3) != (zs[1] == 3):
        raise GrowthError(
            f"{where}: zero_stage {zs[0]} -> {zs[1]} crosses between stages 1/2 and 3, which "
            "DeepSpeed's universal checkpoints cannot load; stay within 1/2, or at 3"
        )
    batch_fields = ("micro_batch", "grad_accum")
    if old.world_size != new.world_size or any(getattr(old, k) != getattr(new, k) for k in batch_fields):
        if old.global_batch is None or new.global_batch is None:
            raise GrowthError(
                f"{where}: the ranks or the batch split change, so state micro_batch and grad_accum in "
                "this stage's resources and in the previous ones (start's included): the global batch "
                "is micro_batch x grad_accum x ranks"
            )
        want = stated_global_batch if stated_global_batch is not None else old.global_batch
        if new.global_batch != want:
            if stated_global_batch is not None:
                fix = f"resources.global_batch={want} is not micro_batch x grad_accum x ranks = {new.global_batch}"
            else:
                keep = max(1, want // (new.micro_batch * new.world_size))
                fix = (
                    f"the global batch changes from {want} to {new.global_batch} sequences (micro_batch x "
                    f"grad_accum x ranks); keep it (e.g. grad_accum: {keep}) or state global_batch: "
                    f"{new.global_batch} to change it"
                )
            raise GrowthError(f"{where}: {fix}")


def stage_resources(plan: Any) -> tuple[Resources, list[Resources]]:
    """Where the start and each stage of a growth plan (growth.stages.plan.StageList) run: the start's
    ``resources:`` laid over the defaults, each stage's over the previous one's (a stage without any runs where the
    previous one ran, so it grows live).

    Raises:
        GrowthError: see ``parse_resources`` (named by ``start`` or the stage).
    """
    start = current = parse_resources(plan.resources, None, "start")
    stages = []
    for stage in plan.stages:
        current = parse_resources(stage.resources, current, f"stage {stage.name!r}")
        stages.append(current)
    return start, stages
