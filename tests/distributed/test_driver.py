"""growlm-run end to end (trainer/driver/): a 3-model plan (start, a live stage, a stage on other resources) run by
the driver with the DeepSpeed launcher, compared with the same plan on fixed resources; the driver SIGKILLed in each
phase and restarted; the last stage on two loopback "nodes" (``--no_ssh``). CPU, gloo, preset tiny, seq_len 32, fp32.

The reference run: the same plan run by plain ``train.py --growth_plan`` as one process with the first stage's
resources (1 rank, micro batch 4 x accumulation 2 = 8 sequences per step), every growth live. Its global batch and
data order are those of every stage of the driver's run (1 rank x 4 x 2, then 2 ranks x 4 x 1: the sampler's order
is a function of the consumed samples only), and its first two models run on the very same resources, so any
difference comes from the path under test: stop -> offline grow + reshard -> relaunch on 2 ranks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from dist_utils import (
    REPO,
    SMALL_DATA,
    SMALL_VOCAB,
    assert_close_tree,
    base_env,
    read_metrics,
    run_ranks,
    write_ds_config,
)

from growlm.runtime.processes import group_members

pytestmark = pytest.mark.skipif(
    not any(Path(p, "numactl").exists() for p in os.environ.get("PATH", "").split(os.pathsep)),
    reason="the deepspeed launcher needs numactl on CPU (apt-get install numactl; make setup does)",
)
MAX_STEPS = 7
PLAN = """seed: 0
start: {{preset: {preset}, resources: {{ranks_per_node: 1, zero_stage: {zero}, micro_batch: 4, grad_accum: 2}}}}
stages:
  - name: deeper
    target: {{n_layer: 3}}
    family: masked
    when: {{step: 2}}
    ramp_steps: 2
  - name: wider
    target: {{n_embd: 96, n_head: 6}}
    family: masked
    when: {{step: 5}}
    ramp_steps: 2
    resources: {last}
"""
ONE_NODE = "{ranks_per_node: 2, grad_accum: 1}"
TWO_NODES = "{nodes: 2, ranks_per_node: 1, no_ssh: true, grad_accum: 1}"


def setup_run(tmp: Path, zero: int, last: str, preset: str = "tiny") -> tuple[Path, list[str]]:
    """The plan file and TRAIN_ARGS (without --out_dir) of a run at ZeRO ``zero`` starting from ``preset`` (a
    Llama preset trains on the small-vocabulary corpus)."""
    plan = tmp / f"plan_zero{zero}.yaml"
    start = preset if preset == "tiny" else f"{preset}, vocab_size: {SMALL_VOCAB}"
    plan.write_text(PLAN.format(zero=zero, last=last, preset=start))
    ds = write_ds_config(tmp / f"zero{zero}.json", f"zero{zero}_fp32", train_micro_batch_size_per_gpu=4, lr=3e-3,
                         scheduler_warmup_num_steps=2, gradient_accumulation_steps=2)  # fmt: skip
    args = ["--seq_len", "32", "--no_final_eval", "--log_interval", "1", "--save_interval", "2", "--ds_config", str(ds)]
    if preset != "tiny":
        args += ["--data", str(SMALL_DATA)]
    return plan, [*args, "--max_steps", str(MAX_STEPS)]


def driver_cmd(plan: Path, train_args: list[str], out: Path) -> list[str]:
    return [sys.executable, "-m", "growlm.trainer.driver", str(plan), "--", *train_args, "--out_dir", str(out)]


def run_driver(plan: Path, train_args: list[str], out: Path) -> subprocess.CompletedProcess:
    r = subprocess.run(driver_cmd(plan, train_args, out), cwd=REPO, env=base_env(), capture_output=True, text=True,
                       timeout=900)  # fmt: skip
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return r


def reference(tmp: Path, zero: int, preset: str = "tiny") -> Path:
    plan, args = setup_run(tmp, zero, ONE_NODE, preset)
    r = run_ranks([*args, "--growth_plan", str(plan), "--out_dir", str(tmp / "ref")], nproc=1)
    assert r.returncode == 0, r.stdout[-3000:]
    return tmp / "ref"


@pytest.fixture(scope="module")
def zero2(tmp_path_factory, builtin_data) -> tuple[Path, Path, Path, list[str]]:
    """(reference run, driver run, plan, TRAIN_ARGS) at ZeRO-2, the last stage on 2 ranks of one node."""
    tmp = tmp_path_factory.mktemp("driver_zero2")
    ref = reference(tmp, 2)
    plan, args = setup_run(tmp, 2, ONE_NODE)
    run_driver(plan, args, tmp / "run")
    return ref, tmp / "run", plan, args


def assert_same_losses(ref: Path, run: Path) -> list[dict]:
    a, b = read_metrics(ref), read_metrics(run)
    assert [m["step"] for m in b] == list(range(1, MAX_STEPS + 1))  # each step once
    for x, y in zip(a, b, strict=True):
        assert abs(x["loss"] - y["loss"]) <= 1e-6, (x, y)
        assert x["lr"] == pytest.approx(y["lr"], rel=1e-12)
        assert (x["consumed_samples"], x["flops"]) == (y["consumed_samples"], y["flops"])  # tokens, FLOPs continue
    assert b[-1]["loss"] < b[0]["loss"] - 0.1  # it trained
    return b


def tag_state(run: Path, step: int) -> dict:
    return json.loads((run / "checkpoints" / f"global_step{step}" / "growlm_state.json").read_text())


def assert_tensorboard_timeline(run: Path, train: list[dict]) -> None:
    """One TensorBoard timeline across the jobs (and restarts): each step's loss once, equal to metrics.jsonl's,
    and the driver's growth seconds at the step of the change."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    losses = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    assert [s for s, _ in losses] == list(range(1, MAX_STEPS + 1))  # an interrupted job's steps purged on resume
    assert [v for _, v in losses] == pytest.approx([m["loss"] for m in train], rel=1e-6)
    assert [e.step for e in acc.Scalars("growth/grow_s")] == [5]


def test_plan_with_a_resource_change_matches_fixed_resources_zero2(zero2):
    ref, run, _, _ = zero2
    b = assert_same_losses(ref, run)
    growths = read_metrics(run, "growth")
    assert [(g["stage"], bool(g.get("driver"))) for g in growths] == [("deeper", False), ("wider", True)]
    rec = growths[1]
    assert rec["step"] == 5 and (rec["world_size_from"], rec["world_size_to"]) == (1, 2)
    assert all(rec[k] > 0 for k in ("save_s", "grow_s", "relaunch_s"))
    assert rec["seconds"] == pytest.approx(rec["save_s"] + rec["grow_s"] + rec["relaunch_s"])
    assert rec["to"]["n_embd"] == 96 and rec["params_to"] > rec["params_from"]
    assert [s["step"] for s in read_metrics(run, "stop")] == [5]
    # one checkpoints folder across both jobs: 1 rank before the change, 2 after
    assert (tag_state(run, 4)["world_size"], tag_state(run, 6)["world_size"]) == (1, 2)
    final = tag_state(run, MAX_STEPS)
    assert final["growth_stage"] == 2 and final["model_config"]["n_layer"] == 3 and final["zero_stage"] == 2
    assert [g["stage"] for g in final["growth"]] == ["deeper", "wider"]
    assert_tensorboard_timeline(run, b)
    assert json.loads((run / "driver" / "progress.json").read_text())["phase"] == "done"


def test_zero3_and_the_last_stage_on_two_no_ssh_nodes(tmp_path, builtin_data):
    ref = reference(tmp_path, 3)
    plan, args = setup_run(tmp_path, 3, TWO_NODES)
    r = run_driver(plan, args, tmp_path / "run")
    assert r.stdout.count("--no_ssh --node_rank=") == 2  # one launcher per node
    assert_same_losses(ref, tmp_path / "run")
    assert (tmp_path / "run" / "driver" / "hostfile.segment1").read_text() == "node0 slots=1\nnode1 slots=1\n"
    final = tag_state(tmp_path / "run", MAX_STEPS)
    assert (final["world_size"], final["zero_stage"], final["model_config"]["n_embd"]) == (2, 3, 96)


def test_a_llama_plan_with_a_resource_change_matches_fixed_resources(tmp_path, small_vocab_data):
    """The same plan from llama-tiny (masked depth live, then masked width with heads and key/value heads on 2 ranks
    after an offline growth) at ZeRO-1: every step's loss and LR equal the reference's."""
    ref = reference(tmp_path, 1, "llama-tiny")
    plan, args = setup_run(tmp_path, 1, ONE_NODE, "llama-tiny")
    run_driver(plan, args, tmp_path / "run")
    assert_same_losses(ref, tmp_path / "run")
    growths = read_metrics(tmp_path / "run", "growth")
    assert [(g["stage"], bool(g.get("driver"))) for g in growths] == [("deeper", False), ("wider", True)]
    final = tag_state(tmp_path / "run", MAX_STEPS)
    assert final["model_config"]["arch"] == "llama" and final["world_size"] == 2
    assert (final["model_config"]["n_embd"], final["model_config"]["n_head"], final["model_config"]["n_layer"]) == (
        96,
        6,
        3,
    )


def kill_at(point: str, plan: Path, args: list[str], out: Path, holds: Path) -> None:
    """Start the driver with hold point ``point``, SIGKILL it (by PID) once a process holds there, and check that
    every job it had started dies with it."""
    env = base_env(GROWLM_TEST_HOLD_AT=point, GROWLM_TEST_HOLD_DIR=str(holds))
    driver = subprocess.Popen(driver_cmd(plan, args, out), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    marker = point.replace(":", "_")
    deadline = time.monotonic() + 600
    while not list(holds.glob(f"{marker}.*")):
        assert driver.poll() is None, f"the driver ended (status {driver.returncode}) before reaching {point}"
        assert time.monotonic() < deadline, f"nothing reached {point}"
        time.sleep(0.2)
    pgids = json.loads((out / "driver" / "progress.json").read_text())["pgids"]
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    for f in holds.glob("*"):
        f.unlink()
    deadline = time.monotonic() + 60
    while any(group_members(g) for g in pgids):  # the jobs' watchdogs and PR_SET_PDEATHSIG
        assert time.monotonic() < deadline, f"jobs outlived the killed driver: {[group_members(g) for g in pgids]}"
        time.sleep(0.2)


def test_driver_killed_in_each_phase_continues_exactly(zero2, tmp_path):
    _, uninterrupted, plan, args = zero2
    out, holds = tmp_path / "run", tmp_path / "holds"
    kill_at("train.step:3", plan, args, out, holds)  # training (step 3 done, checkpoint at 2)
    kill_at("train.stopped:5", plan, args, out, holds)  # the stop checkpoint committed, its stop record not written
    assert (out / "checkpoints" / "global_step5").exists() and not read_metrics(out, "stop")
    kill_at("grow.commit", plan, args, out, holds)  # growing offline: the driver itself holds
    assert not (out / "driver" / "grown" / "stage1").exists()  # only the .tmp- folder
    kill_at("driver.launched:1", plan, args, out, holds)  # relaunching on 2 ranks
    run_driver(plan, args, out)
    b = assert_same_losses(uninterrupted, out)
    assert_tensorboard_timeline(out, b)
    rec = read_metrics(out, "growth")[1]  # the driver's record, written once across the restarts
    assert rec["grow_s"] > 0 and rec["relaunch_s"] > 0  # the regrown folder's and the last launch's seconds
    assert rec["save_s"] is None and rec["seconds"] is None  # the stop save's seconds died with its job
    assert [m["loss"] for m in b] == [m["loss"] for m in read_metrics(uninterrupted)]
    assert [(g["stage"], g["step"]) for g in read_metrics(out, "growth")] == [("deeper", 2), ("wider", 5)]
    assert [s["step"] for s in read_metrics(out, "stop")] == [5]
    a_dir, b_dir = (d / "checkpoints" / f"global_step{MAX_STEPS}" for d in (uninterrupted, out))
    assert sorted(p.name for p in a_dir.iterdir()) == sorted(p.name for p in b_dir.iterdir())
    for f in sorted(a_dir.glob("*.pt")):  # weights, each rank's ZeRO-2 partition with its Adam state, RNG
        sa, sb = (torch.load(d / f.name, map_location="cpu", weights_only=False) for d in (a_dir, b_dir))
        assert_close_tree(sa, sb, f.name, ("ds_config", "ds_version", "mp_world_size", "growlm"))


GLOBAL_BATCH_PLAN = """seed: 0
start: {preset: tiny, resources: {ranks_per_node: 1, zero_stage: 2, micro_batch: 4, grad_accum: 2}}
stages:
  - name: wider
    target: {n_embd: 96, n_head: 6}
    family: masked
    when: {step: 3}
    ramp_steps: 2
    resources: {ranks_per_node: 2, micro_batch: 4, grad_accum: 2, global_batch: 16}
"""


def test_a_stated_global_batch_changes_the_batch_between_stages(tmp_path, builtin_data):
    """1 rank x 4 x 2 = 8 sequences a step, then a stage on 2 ranks that states global_batch: 16: the driver runs
    it (it used to refuse it, asking for the very value given), and every step after the stop trains 16."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(GLOBAL_BATCH_PLAN)
    _, args = setup_run(tmp_path, 2, ONE_NODE)
    args[args.index("--max_steps") + 1] = "5"
    out = tmp_path / "run"
    run_driver(plan, args, out)
    train = read_metrics(out)
    assert [m["step"] for m in train] == [1, 2, 3, 4, 5]
    consumed = [m["consumed_samples"] for m in train]
    assert [b - a for a, b in zip([0, *consumed], consumed, strict=False)] == [8, 8, 8, 16, 16]
    cfg = json.loads((out / "driver" / "ds_config.segment1.json").read_text())
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (4, 2)  # x 2 ranks = 16
    assert [g["stage"] for g in read_metrics(out, "growth")] == ["wider"] and train[-1]["loss"] < train[0]["loss"]
