"""A growth plan cut into jobs ("segments"): runs of consecutive stages on the same resources. Segment 0 starts at
the plan's ``start``; every later segment starts at a stage whose resources differ from the previous stage's, which
the driver reaches by stopping the previous job, growing the checkpoint offline and relaunching. Per segment: its
DeepSpeed config (the --ds_config given with ZeRO stage, micro batch and gradient accumulation set) and its launcher
commands (``deepspeed --num_gpus N`` on one node; ``--hostfile`` across nodes, one ``--no_ssh --node_rank R``
launcher per node when the resources say ``no_ssh``).
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from growlm.growth.errors import GrowthError
from growlm.growth.stages.plan import StageList
from growlm.runtime.ds_config import zero_stage_of
from growlm.trainer.driver.resources import Resources, check_change, stage_resources


class DriverError(Exception):
    """Bad input or a failed job: growlm-run prints the message and exits with ``returncode``."""

    def __init__(self, message: str, returncode: int = 2) -> None:
        super().__init__(message)
        self.returncode = returncode


@dataclass(frozen=True)
class Segment:
    """One job of the run.

    Attributes:
        index: 0, 1, ... in run order.
        resources: where it runs, the DeepSpeed config's values filled in.
        first_stage: index (in the plan) of the stage grown offline at its start; None for segment 0.
        stop_stage: name of the stage the job stops before (the next segment's first stage); None for the last.
        stages: names of the plan's stages grown inside this job (live), in order.
    """

    index: int
    resources: Resources
    first_stage: int | None
    stop_stage: str | None
    stages: tuple[str, ...]


def config_defaults(ds_cfg: dict[str, Any], start: Resources) -> tuple[int, int, int]:
    """(ZeRO stage, micro batch, gradient accumulation) that fill the plan's unset resources: the DeepSpeed config's
    (DeepSpeed's defaults 0, 1, 1). When the config gives ``train_batch_size`` (sequences per optimizer step), a
    micro batch or accumulation that neither it nor ``start``'s resources set is derived from it at ``start``'s
    world size, as DeepSpeed does (train_batch_size = micro batch x accumulation x ranks; accumulation 1 when
    both are unset), since the segments' configs carry micro batch and accumulation only.

    Raises:
        DriverError: train_batch_size does not divide, or is not micro batch x accumulation x ranks of ``start``.
    """

    zero = zero_stage_of(ds_cfg)
    micro, gas = ds_cfg.get("train_micro_batch_size_per_gpu"), ds_cfg.get("gradient_accumulation_steps")
    tbs = ds_cfg.get("train_batch_size")
    if tbs is None:
        return zero, int(micro or 1), int(gas or 1)
    micro = start.micro_batch if start.micro_batch is not None else micro
    gas = start.grad_accum if start.grad_accum is not None else gas
    world, tbs = start.world_size, int(tbs)
    gas = 1 if micro is None and gas is None else gas
    if micro is None or gas is None:
        known = int(micro if micro is not None else gas)
        if tbs % (known * world):
            raise DriverError(
                f"--ds_config: train_batch_size {tbs} is not divisible by {known} x {world} rank(s) of the plan's "
                "start; set train_micro_batch_size_per_gpu and gradient_accumulation_steps instead"
            )
        micro, gas = (micro, tbs // (known * world)) if micro is not None else (tbs // (known * world), gas)
    if int(micro) * int(gas) * world != tbs:
        raise DriverError(
            f"--ds_config: train_batch_size {tbs} is not micro batch {micro} x accumulation {gas} x {world} "
            "rank(s) of the plan's start; drop train_batch_size or make them agree"
        )
    return zero, int(micro), int(gas)


def make_segments(plan: StageList, ds_cfg: dict[str, Any]) -> list[Segment]:
    """Cut ``plan`` into segments (module docstring), each resource change checked with the config's values.

    Raises:
        DriverError: a change the driver cannot carry out (trainer.driver.resources.check_change), named by stage, or a
            train_batch_size that disagrees with the start's resources (config_defaults).
    """
    start, stage_res = stage_resources(plan)
    defaults = config_defaults(ds_cfg, start)
    current = start.with_defaults(*defaults)
    first: int | None = None
    names, out = [], []
    for i, (stage, declared) in enumerate(zip(plan.stages, stage_res, strict=True)):
        res = declared.with_defaults(*defaults)
        if res != current:
            raw = stage.resources if isinstance(stage.resources, dict) else {}
            try:  # a global batch the stage states is the change it asks for (check_change)
                check_change(current, res, f"stage {stage.name!r}", raw.get("global_batch"))
            except GrowthError as e:
                raise DriverError(f"{e} (with the --ds_config values filled in)") from None
            out.append(Segment(len(out), current, first, stage.name, tuple(names)))
            current, first, names = res, i, []
        else:
            names.append(stage.name)
    out.append(Segment(len(out), current, first, None, tuple(names)))
    return out


def ds_config_path(driver_dir: Path, index: int) -> Path:
    """Where segment ``index``'s DeepSpeed config is written (``segment_ds_config``)."""
    return driver_dir / f"ds_config.segment{index}.json"


def grown_path(driver_dir: Path, stage_index: int) -> Path:
    """The folder the stop checkpoint is grown into for the stage at ``stage_index`` in the plan (by index, not
    name: one folder per stage, whatever it is called)."""
    return driver_dir / "grown" / f"stage{stage_index}"


def segment_ds_config(base: dict[str, Any], res: Resources) -> dict[str, Any]:
    """``base`` with the segment's ZeRO stage, micro batch and gradient accumulation (train_batch_size dropped:
    DeepSpeed derives it from them and the world size)."""
    cfg = copy.deepcopy(base)
    cfg["train_micro_batch_size_per_gpu"] = res.micro_batch
    cfg["gradient_accumulation_steps"] = res.grad_accum
    cfg.pop("train_batch_size", None)
    cfg.setdefault("zero_optimization", {})["stage"] = res.zero_stage
    return cfg


def job_args(train_args: list[str], plan: str, ds_config: Path, resume: str | None, stop: str | None) -> list[str]:
    """train.py's arguments in a segment's job: TRAIN_ARGS without their --ds_config (replaced by the segment's
    ``ds_config``), then --growth_plan, --ds_config, --resume (when given) and --stop_before_stage (when given)."""
    out, skip = [], False
    for a in train_args:
        name = a.split("=", 1)[0]
        if skip or (len(name) >= 5 and "--ds_config".startswith(name)):  # --ds_config X, --ds_config=X, --ds_c X
            skip = not skip and "=" not in a
            continue
        out.append(a)
    out += ["--growth_plan", plan, "--ds_config", str(ds_config)]
    out += ["--resume", resume] if resume else []
    return out + (["--stop_before_stage", stop] if stop else [])


def hostfile_slots(path: str) -> list[tuple[str, int]]:
    """(host, slots) of each line of a DeepSpeed hostfile (``name slots=N``; blank lines and ``#`` comments skipped).

    Raises:
        DriverError: the file is missing, a line is not ``name slots=N``, or a host is listed twice (DeepSpeed's
            launcher refuses that, but only when the job starts).
    """
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise DriverError(f"resources.hostfile {path}: {e.strerror}; write one line per node, 'name slots=N'") from None
    out: list[tuple[str, int]] = []
    first_line: dict[str, int] = {}
    for n, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].startswith("slots=") or not parts[1][6:].isdigit():
            raise DriverError(f"{path}:{n}: {line!r} is not 'name slots=N'")
        if parts[0] in first_line:
            raise DriverError(
                f"{path}:{n}: host {parts[0]!r} is listed twice (first on line {first_line[parts[0]]}); DeepSpeed's "
                "launcher refuses a repeated host: list each node once, its ranks as slots=N"
            )
        first_line[parts[0]] = n
        out.append((parts[0], int(parts[1][6:])))
    return out


def check_hostfile(res: Resources) -> list[tuple[str, int]] | None:
    """(host, slots) of the resources' own hostfile, checked against nodes x ranks_per_node; None without one.

    Raises:
        DriverError: the hostfile is missing or malformed, or its nodes or slots differ from the resources; a host
            named twice (in the hostfile or in ``resources.hosts``).
    """
    if res.hosts is not None:
        twice = sorted({h for h in res.hosts if res.hosts.count(h) > 1})
        if twice:
            raise DriverError(
                f"resources.hosts {list(res.hosts)} names {', '.join(twice)} more than once; DeepSpeed's launcher "
                "refuses a repeated host: name each node once (its ranks are resources.ranks_per_node)"
            )
    if res.hostfile is None:
        return None
    slots = hostfile_slots(res.hostfile)
    if len(slots) != res.nodes or any(s != res.ranks_per_node for _, s in slots):
        raise DriverError(
            f"resources.hostfile {res.hostfile} lists {slots}, but the stage's resources say "
            f"{res.nodes} node(s) x {res.ranks_per_node} rank(s); make them agree"
        )
    return slots


def written_hostfile(driver_dir: Path, index: int) -> Path:
    """Where the driver writes segment ``index``'s hostfile when the resources name ``hosts`` or ``no_ssh`` nodes."""
    return driver_dir / f"hostfile.segment{index}"


def hostfile_for(res: Resources, folder: Path, index: int) -> Path | None:
    """The hostfile segment ``index`` launches with: its own (``check_hostfile``), one written into ``folder`` from
    ``hosts`` (or ``node0``..``nodeN-1`` with ``no_ssh``), or None on one node without hosts.

    Raises:
        DriverError: see ``check_hostfile``.
    """
    if res.hostfile is not None:
        check_hostfile(res)
        return Path(res.hostfile)
    if res.hosts is None and res.nodes == 1:
        return None
    hosts = res.hosts or tuple(f"node{i}" for i in range(res.nodes))
    path = written_hostfile(folder, index)
    path.write_text("".join(f"{h} slots={res.ranks_per_node}\n" for h in hosts))
    return path


def launcher_commands(
    res: Resources, deepspeed: str, port: int, script: str, args: list[str], hostfile: Path | None
) -> list[list[str]]:
    """The DeepSpeed launcher command(s) of a segment: one, or one per node with ``no_ssh``. Rank 0's address:
    ``master_addr``, else 127.0.0.1 on one node or with ``no_ssh`` (every launcher on this machine), else the first
    host (of ``hosts``, or of the hostfile), where the launcher starts rank 0.

    Raises:
        DriverError: the hostfile cannot be read (``hostfile_slots``).
    """
    if res.master_addr:
        addr = res.master_addr
    elif hostfile is None or res.no_ssh:
        addr = "127.0.0.1"
    else:
        addr = res.hosts[0] if res.hosts else hostfile_slots(str(hostfile))[0][0]
    rendezvous = ["--master_addr", addr, "--master_port", str(port)]
    if hostfile is None:
        return [[deepspeed, "--num_gpus", str(res.ranks_per_node), *rendezvous, script, *args]]
    base = [deepspeed, "--hostfile", str(hostfile), *rendezvous]
    if res.no_ssh:
        return [[*base, "--no_ssh", f"--node_rank={r}", script, *args] for r in range(res.nodes)]
    return [[*base, script, *args]]


def deepspeed_path(given: str | None) -> str:
    """The deepspeed launcher: ``given``, else the one installed beside this Python, else ``deepspeed`` on PATH."""
    if given:
        return given
    beside = Path(sys.executable).parent / "deepspeed"
    return str(beside) if beside.exists() else "deepspeed"
