"""Start real multi-process runs of train.py on loopback for tests (2 ranks, gloo, CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from growlm.data.tokens import cache_dir
from growlm.runtime.launch import (  # free_port is re-exported: tests import it from here
    free_port,
    launch_ranks,
)
from growlm.runtime.metrics_file import read_records

REPO = Path(__file__).resolve().parents[1]
SMALL_VOCAB = 320  # the vocabulary of the ``small_vocab_data`` fixture's token folder (conftest.py) ...
SMALL_DATA = cache_dir() / f"bpe{SMALL_VOCAB}"  # ... and where it is (tests that name it request the fixture)
# a growth plan for the fault tests: a 1 x 32 tiny model grown to 2 x 64 (masked) before step 3's update
GROWTH_AT_STEP_3 = """
seed: 0
start: {preset: tiny, n_layer: 1, n_embd: 32, n_head: 2}
stages:
  - name: deeper-wider
    target: {n_layer: 2, n_embd: 64, n_head: 4}
    family: masked
    when: {step: 3}
    ramp_steps: 4
    schedule: {kind: continue}
"""


def base_env(**extra: str) -> dict[str, str]:
    """The environment for a child run on loopback: its own free MASTER_PORT (never a fixed or inherited one),
    one thread per rank, the CPU accelerator, runtime.collectives' strict mode (a tensor that reaches a collective
    from growlm's code without being staged on the group's device fails the run, as it would on NCCL); ``extra``
    overrides."""
    env = dict(os.environ)
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        OMP_NUM_THREADS="1",
        DS_ACCELERATOR="cpu",
        GROWLM_STRICT_COLLECTIVES="1",
    )
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        env.pop(key, None)
    env.update(extra)
    return env


def fp16_supported() -> bool:
    """Whether DeepSpeed trains fp16 on this machine (on a CPU: AVX512-FP16 or AMX-FP16).

    Machines that run this suite differ: tests whose outcome depends on it assert the refusal on one side and a
    real fp16 run on the other, never a skip.
    """
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.accelerator import get_accelerator

    return bool(get_accelerator().is_fp16_supported())


def run_ranks(
    args: list[str] | list[list[str]],
    nproc: int = 2,
    timeout: float = 600,
    script: str = "train.py",
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run ``python SCRIPT ARGS`` as ``nproc`` ranks on loopback (runtime.launch.launch_ranks) and wait for all.

    ``args`` is one argument list for every rank, or one list per rank; ``env``: variables added to ``base_env``.

    Returns a CompletedProcess whose returncode is the first non-zero rank exit code (0 if all succeeded) and whose
    stdout holds every rank's output, rank by rank.

    Raises:
        subprocess.TimeoutExpired: the ranks did not finish within ``timeout`` seconds (all were killed).
    """
    per_rank = args if args and isinstance(args[0], list) else [args] * nproc
    cmds = [[sys.executable, str(REPO / script), *a] for a in per_rank]
    res = launch_ranks(cmds, nproc, base_env=base_env(**(env or {})), cwd=REPO, timeout_s=timeout)
    if res.timed_out:
        raise subprocess.TimeoutExpired(cmds[0], timeout, output=res.output)
    return subprocess.CompletedProcess(args, res.returncode, res.output, "")


def read_metrics(out_dir: Path, event: str = "train") -> list[dict]:
    """The records of one kind ('train': one per step, 'val', 'growth') that train.py wrote to OUT_DIR/metrics.jsonl."""
    return read_records(out_dir, event)


def write_ds_config(path: Path, template: str, **overrides: object) -> Path:
    """Copy ds_configs/TEMPLATE.json with top-level keys and 'optimizer.lr' / 'scheduler.KEY' overridden."""
    cfg = json.loads((REPO / "ds_configs" / f"{template}.json").read_text())
    for key, value in overrides.items():
        if key == "lr":
            cfg["optimizer"]["params"]["lr"] = value
        elif key.startswith("scheduler_"):
            cfg["scheduler"]["params"][key.removeprefix("scheduler_")] = value
        else:
            cfg[key] = value
    path.write_text(json.dumps(cfg))
    return path


def tiny_ds_config(tmp_path: Path, template: str = "zero2_fp32") -> Path:
    """ds_configs/TEMPLATE.json for tiny test runs: micro batch 4, lr 3e-3 (a 2-layer model visibly learns in 8
    steps), linear warmup over 2 steps."""
    return write_ds_config(
        tmp_path / f"{template}.json", template, train_micro_batch_size_per_gpu=4, lr=3e-3, scheduler_warmup_num_steps=2
    )


def assert_close_tree(x, y, where: str, skip: tuple[str, ...] = ("ds_config", "ds_version", "mp_world_size")) -> None:
    """Every floating-point tensor of two loaded checkpoint files (nested dicts/lists) equal to 1e-6, same shapes and
    list lengths; dict keys in ``skip`` (settings, versions, world size) are not compared. Raises AssertionError."""
    import torch

    if torch.is_tensor(x):
        assert torch.is_tensor(y) and x.shape == y.shape, where
        if x.is_floating_point():
            torch.testing.assert_close(x, y, rtol=0, atol=1e-6, msg=where)
    elif isinstance(x, dict):
        for k in x:
            if k not in skip:
                assert_close_tree(x[k], y[k], f"{where}/{k}", skip)
    elif isinstance(x, list | tuple):
        assert len(x) == len(y), where
        for i, (u, v) in enumerate(zip(x, y, strict=True)):
            assert_close_tree(u, v, f"{where}[{i}]", skip)


def saved_adam_steps(tag_dir: Path) -> list[float]:
    """Every Adam ``step`` value saved in a native DeepSpeed tag folder (all groups, all ranks; the optimizer is in
    ``*optim_states.pt`` at ZeRO 1-3 and in ``mp_rank_00_model_states.pt`` at stage 0)."""
    import torch

    steps: list[float] = []

    def walk(obj: object) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                if k == "step" and (torch.is_tensor(v) or isinstance(v, int | float)):
                    steps.append(float(v))
                else:
                    walk(v)
        elif isinstance(obj, list | tuple):
            for v in obj:
                walk(v)

    for f in sorted(tag_dir.glob("*_states.pt")):
        walk(torch.load(f, map_location="cpu", weights_only=False))  # the tests' own files
    return steps


@contextmanager
def held_ranks(cmds: list[list[str]], tmp: Path, point: str, armed: Sequence[int] | None = None,
               timeout: float = 240) -> Iterator[tuple[list[subprocess.Popen], list, set[int]]]:  # fmt: skip
    """Start one rank per command on loopback with the test-only hold point ``point`` armed (runtime/crash_points.py;
    on the ranks ``armed``, default all), each logging to a file under ``tmp``, and wait until a process holds
    there. Yields (the processes, their open log files, the PIDs holding); at the end every process still running
    is killed and the logs closed. Fails the test, with the logs' tail, when a process ends first or ``timeout``
    seconds pass."""
    from growlm.runtime.crash_points import HOLD_AT_ENV, HOLD_DIR_ENV
    from growlm.runtime.launch import rank_env

    hold_dir, port = tmp / f"hold-{time.monotonic_ns()}", int(base_env()["MASTER_PORT"])
    procs, logs = [], []
    try:
        for rank, cmd in enumerate(cmds):
            arm = armed is None or rank in armed
            extra = {HOLD_AT_ENV: point, HOLD_DIR_ENV: str(hold_dir)} if arm else {}
            logs.append(open(tmp / f"rank{rank}-{time.monotonic_ns()}.log", "w+"))  # noqa: SIM115  closed below
            env = rank_env(rank, len(cmds), port, base=base_env(), **extra)
            procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=logs[-1], stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout
        while not (hold_dir.is_dir() and any(hold_dir.iterdir())):
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                text = "".join(f.seek(0) or f.read() for f in logs)
                pytest.fail(f"no process reached {point} (exit codes {[p.poll() for p in procs]}):\n{text[-3000:]}")
            time.sleep(0.2)
        yield procs, logs, {int(m.name.rsplit(".", 1)[1]) for m in hold_dir.iterdir()}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in logs:
            f.close()
