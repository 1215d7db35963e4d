"""A growth is refused before anything is allocated when it cannot fit (runtime.memory): train.py refuses a plan
stage that cannot fit the machine at all, a live growth one that does not fit the memory free now (every rank
alike), growlm-grow one whose working set does not fit the host memory free now or whose output does not fit the
disk, and growlm-run a job on this machine with more ranks than GPUs or more model states than memory; growlm-run's
dry run warns where a node is given more ranks than it has cores or GPUs."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import psutil
import pytest
import torch
from cli_utils import one_error_line, train_fails

from growlm import DS_CONFIG_DIR
from growlm.growth.errors import GrowthError
from growlm.growth.live import grow as live
from growlm.growth.live.transfer import BUCKET_BYTES
from growlm.growth.offline import cli as grow_cli
from growlm.growth.offline import pipeline
from growlm.growth.offline.universal import UniversalStore
from growlm.growth.ops import make_rules
from growlm.growth.ops.rules import param_shapes
from growlm.growth.ops.stores import ParamState
from growlm.growth.stages.plan import parse_stages
from growlm.model.config import GPTConfig, from_preset, largest_param_numel, param_count
from growlm.runtime import collectives, memory
from growlm.trainer import plan_checks
from growlm.trainer import run as train_run
from growlm.trainer.driver import cli as run_cli
from growlm.trainer.driver import fits_here as machine
from growlm.trainer.driver.segments import make_segments
from growlm.trainer.errors import UsageError

HUGE_PLAN = """
start: {preset: tiny, n_layer: 1, n_embd: 32, n_head: 2}
stages:
  - {name: huge, target: {n_layer: 1000, n_embd: 65536, n_head: 512}, family: masked, when: {step: 2}}
"""


def test_the_working_set_and_the_split_follow_the_formulas():
    assert memory.GATHER_BUCKET_BYTES == BUCKET_BYTES  # the memory checks size the gather's bucket as it is
    cfg = GPTConfig(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128)
    assert largest_param_numel(cfg) == 1000 * 64  # the token embedding beats c_fc (64 x 256) and c_attn
    grown = memory.GROWN_PARAM_BYTES  # a grown parameter's three fp32 tensors and its rule's temporaries
    assert grown >= 12
    assert memory.growth_working_set_bytes(10, 10**8, 2**20) == 2 * 2**20 + grown * 10**8  # bucket x 2 + a grown one
    assert memory.growth_working_set_bytes(10**6, 10, 2**20) == 2 * 12 * 10**6 + grown * 10  # a parameter above it
    n = 10**6
    for stage in range(4):
        for precision in ("fp32", "bf16"):
            pg, opt = memory.model_state_split(n, stage, precision, 4)
            assert pg + opt == pytest.approx(memory.model_state_bytes(n, stage, precision, 4))
    assert memory.model_state_split(n, 1, "bf16", 4) == (4 * n, 3 * n)  # 2 + 2 replicated, 12 / 4 partitioned
    assert memory.model_state_split(n, 3, "bf16", 4) == (1 * n, 3 * n)  # everything / 4
    # fp32: DeepSpeed's ZeRO optimizers keep their own fp32 partition for Adam (K = 12); ZeRO-0 steps the parameter
    assert memory.model_state_split(n, 2, "fp32", 4) == (4 * n + n, 3 * n)
    assert memory.model_state_split(n, 3, "fp32", 4) == (2 * n, 3 * n)
    assert memory.bytes_per_param(1, "fp32") == (4, 4, 12) and memory.bytes_per_param(0, "fp32") == (4, 4, 8)
    # where the bytes live: a CPU rank holds everything on the host; a GPU rank the model states and the working
    # set (the growth expands on the GPU), the host only an offloaded optimizer part
    assert memory.placed_bytes(10, 20, 5, False, False) == (0.0, 35)
    assert memory.placed_bytes(10, 20, 5, True, False) == (35, 0.0)
    assert memory.placed_bytes(10, 20, 5, True, True) == (15, 20)


@pytest.mark.bad_input
def test_train_refuses_a_stage_that_cannot_fit_the_machine(tmp_path, capsys):
    plan = tmp_path / "plan.yaml"
    plan.write_text(HUGE_PLAN)
    out = tmp_path / "run"
    line = train_fails(
        capsys,
        ["--growth_plan", str(plan), "--max_steps", "40", "--out_dir", str(out)],
        "stage 'huge' (growing L=1 d=32 H=2",
        "GiB per rank, and this rank's host memory",
        "choose a smaller target, more ranks or a higher ZeRO stage",
    )
    need = float(line.split("needs about ")[1].split(" GiB")[0].replace(",", ""))
    assert need > 1e5  # 5e13 parameters: hundreds of TiB, not a rounding artefact
    assert not out.exists()


def fake_engine(cfg: GPTConfig) -> SimpleNamespace:
    module = torch.nn.Linear(2, 2)
    return SimpleNamespace(
        zero_optimization_stage=lambda: 2,
        bfloat16_enabled=lambda: False,
        fp16_enabled=lambda: False,
        zero_offload_optimizer=lambda: None,
        module=module,
    )


@pytest.mark.bad_input
def test_a_live_growth_that_does_not_fit_the_free_memory_is_refused_on_every_rank(monkeypatch):
    old, new = GPTConfig(n_layer=1, n_embd=32, n_head=2), GPTConfig(n_layer=2, n_embd=64, n_head=4)
    plan = make_rules(old, new, "masked")
    monkeypatch.setattr(collectives, "world_size", lambda group=None: 2)
    verdicts = {}

    def gather(msg, group=None):  # rank 0 is this process; rank 1 fits
        verdicts["mine"] = msg
        return [msg, ""]

    monkeypatch.setattr(collectives, "all_gather_object", gather)
    live.check_growth_fits(fake_engine(old), plan)  # the machine has room: nothing raised
    assert verdicts["mine"] == ""
    free = SimpleNamespace(available=100 * 2**20, total=2**40)  # 100 MiB free, shared by 2 ranks on this node
    monkeypatch.setattr(psutil, "virtual_memory", lambda: free)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(GrowthError) as e:
        live.check_growth_fits(fake_engine(old), plan)
    need = memory.model_state_bytes(param_count(new), 2, "fp32", 2) + memory.growth_working_set_bytes(
        largest_param_numel(old), largest_param_numel(new), BUCKET_BYTES
    )
    assert str(e.value) == (
        f"rank 0: growing {old.shape_str()} into {new.shape_str()} (ZeRO-2, fp32) needs about {need / 2**30:,.1f} "
        "GiB per rank, and "
        "this rank's host memory (2 rank(s) on this node) has 0.0 GiB free: choose a smaller target, more ranks or a "
        "higher ZeRO stage"
    )
    # another rank's refusal is every rank's
    monkeypatch.setattr(collectives, "all_gather_object", lambda msg, group=None: ["", "rank one's figures"])
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=2**40, total=2**40))
    with pytest.raises(GrowthError, match="^rank 1: rank one's figures$"):
        live.check_growth_fits(fake_engine(old), plan)


@pytest.mark.bad_input
def test_dry_run_warns_of_more_ranks_per_node_than_the_machine_has(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    (tmp_path / "plan.yaml").write_text(
        "start: {preset: tiny, resources: {ranks_per_node: 64, zero_stage: 2, micro_batch: 1}}\n"
        "stages:\n  - {name: deeper, target: {n_layer: 3}, family: masked, when: {step: 2}}\n"
    )
    assert run_cli.main(["plan.yaml", "--dry_run", "--", "--seq_len", "32", "--out_dir", "runs/x"]) == 0
    out = capsys.readouterr().out
    assert out.count("WARNING: 64 ranks per node, and this machine has 2 CPU core(s)") == 1  # once per job
    assert "growlm-run dry run: 1 warning(s)" in out


def fake_source(tmp_path, zero_stage: int = 2) -> SimpleNamespace:
    """What growlm-grow's checks read of a checkpoint (growth.offline.pipeline.Source), with no tensor files: a
    refused growth must not need them."""
    tag = tmp_path / "ckpt" / "global_step3"
    tag.mkdir(parents=True)
    state = SimpleNamespace(global_step=3, growth_masks=None, schedule=None, ds_config={}, zero_stage=zero_stage)
    return SimpleNamespace(
        state=state, config=from_preset("tiny"), tag=tag.name, tag_dir=tag, ckpt_dir=tag.parent,
        universal=False, zero_stage=zero_stage,
    )  # fmt: skip


def grow_refused(tmp_path, capsys, monkeypatch, extra: list[str]) -> str:
    src = fake_source(tmp_path)
    monkeypatch.setattr(pipeline, "open_source", lambda path, verifying=None: src)  # cli imports it when it runs
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert grow_cli.main([str(src.ckpt_dir), str(tmp_path / "out"), *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written, no lock file
    return one_error_line(captured.err, "growlm-grow")


@pytest.mark.bad_input
def test_grow_refuses_a_target_that_does_not_fit_the_free_host_memory(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=8 * 2**30, total=2**40))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    huge = ["--n_layer", "1000", "--n_embd", "65536", "--n_head", "512"]
    line = grow_refused(tmp_path, capsys, monkeypatch, huge)
    old = from_preset("tiny")
    new = replace(old, n_layer=1000, n_embd=65536, n_head=512)
    need = 12 * (largest_param_numel(old) + 2 * largest_param_numel(new))
    assert need == memory.offline_growth_host_bytes(largest_param_numel(old), largest_param_numel(new))
    assert line == (
        f"growing {old.shape_str()} into {new.shape_str()} offline needs about {need / 2**30:,.1f} GiB of host "
        "memory (the largest parameter's fp32 weight and Adam moments, old and grown), and this machine has 8.0 GiB "
        "free: choose a smaller target, or free memory"
    )


@pytest.mark.bad_input
def test_grow_refuses_an_output_that_does_not_fit_the_free_disk_space(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(memory.shutil, "disk_usage", lambda path: SimpleNamespace(free=2**20, total=2**30, used=0))
    line = grow_refused(tmp_path, capsys, monkeypatch, ["--n_layer", "4"])
    old = from_preset("tiny")
    new = replace(old, n_layer=4)
    need = 12 * param_count(new) + 4 * new.vocab_size * new.n_embd  # + the tied lm_head.weight (ZeRO-2)
    assert line == (
        f"growing {old.shape_str()} into {new.shape_str()} offline writes a checkpoint that needs about "
        f"{memory.size_text(need)} on disk, and {tmp_path} has 1.0 MiB free: choose a smaller target, or an output "
        "folder on a disk with room"
    )
    assert need > 2**20 and memory.size_text(need).endswith(" MiB")  # tiny: tens of MiB, not "0.0 GiB"


def test_sizes_are_written_in_the_unit_that_shows_them():
    assert [memory.size_text(n) for n in (512, 1536, 5 * 2**20, 3 * 2**30 + 2**29)] == [
        "0.5 KiB", "1.5 KiB", "5.0 MiB", "3.5 GiB",
    ]  # fmt: skip


def test_the_disk_figure_matches_what_the_universal_writer_writes(tmp_path):
    cfg = GPTConfig(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128)
    shapes = param_shapes(cfg)
    store = UniversalStore(tmp_path / "zero", shapes, flat=False, step=torch.tensor(3.0))
    for name, shape in shapes.items():
        store.write(name, ParamState(torch.zeros(shape), torch.zeros(shape), torch.zeros(shape)))
    store.write_tied("lm_head.weight", torch.zeros(cfg.vocab_size, cfg.n_embd))
    actual = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    predicted = memory.universal_checkpoint_bytes(param_count(cfg), cfg.vocab_size * cfg.n_embd)
    files = sum(1 for p in tmp_path.rglob("*") if p.is_file())
    assert predicted <= actual <= predicted + 2048 * files  # the tensors' bytes, plus each file's pickle framing


def run_plan(tmp_path, monkeypatch, text: str) -> list[str]:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan.yaml").write_text(text)
    return ["plan.yaml", "--", "--seq_len", "32", "--out_dir", "runs/x"]


def cpu_machine(monkeypatch, cores: int, host_gib: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=0, total=host_gib * 2**30))


@pytest.mark.bad_input
def test_run_refuses_more_ranks_than_this_machines_gpus_before_launching(tmp_path, capsys, monkeypatch):
    argv = run_plan(tmp_path, monkeypatch, "start: {preset: tiny, resources: {ranks_per_node: 8, micro_batch: 1}}\n"
                    "stages:\n  - {name: deeper, target: {n_layer: 3}, family: masked, when: {step: 2}}\n")  # fmt: skip
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    assert run_cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert one_error_line(captured.err, "growlm-run") == (
        "job 0: resources.ranks_per_node 8, and this machine has 2 GPU(s), one per rank; lower ranks_per_node, or run "
        "the job on machines with more GPUs (resources.hosts or resources.hostfile)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.yaml"]  # nothing launched or written


@pytest.mark.bad_input
def test_run_refuses_a_live_growth_that_cannot_fit_this_machines_memory_before_launching(tmp_path, capsys, monkeypatch):
    argv = run_plan(
        tmp_path,
        monkeypatch,
        "start: {preset: tiny, n_layer: 1, n_embd: 32, n_head: 2, resources: {ranks_per_node: 4, zero_stage: 2, "
        "micro_batch: 1}}\nstages:\n  - {name: huge, target: {n_layer: 1000, n_embd: 65536, n_head: 512}, family: "
        "masked, when: {step: 2}}\n",
    )
    cpu_machine(monkeypatch, cores=2, host_gib=64)
    assert run_cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    old = from_preset("tiny", n_layer=1, n_embd=32, n_head=2)
    new = replace(old, n_layer=1000, n_embd=65536, n_head=512)
    need = (
        memory.model_state_bytes(param_count(old), 2, "bf16", 4)
        + memory.model_state_bytes(param_count(new), 2, "bf16", 4)
        + memory.growth_working_set_bytes(largest_param_numel(old), largest_param_numel(new), BUCKET_BYTES)
    )
    assert one_error_line(captured.err, "growlm-run") == (  # one line: no warning with a refusal
        f"job 0: stage 'huge' (growing {old.shape_str()} into {new.shape_str()} live), ZeRO-2, bf16, 4 rank(s) needs "
        f"about {need / 2**30:,.1f} GiB per rank, and this machine's host memory is 16.0 GiB per rank (4 rank(s) on "
        "it): choose a smaller target or a higher ZeRO stage, or run the job on larger machines (resources.hosts or "
        "resources.hostfile)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.yaml"]


def test_jobs_on_other_machines_are_not_checked_here_and_a_small_job_fits(monkeypatch):
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 2}}
    doc = {
        "start": {"preset": "tiny", "resources": {"ranks_per_node": 2, "micro_batch": 1, "grad_accum": 64}},
        "stages": [
            {"name": "deeper", "target": {"n_layer": 3}, "family": "masked", "when": {"step": 2}},
            {"name": "far", "target": {"n_layer": 4}, "family": "masked", "when": {"step": 4},
             "resources": {"nodes": 2, "hosts": ["n0", "n1"], "ranks_per_node": 64, "micro_batch": 1, "grad_accum": 1}},
        ],
    }  # fmt: skip
    plan = parse_stages(doc)
    segments = make_segments(plan, ds)
    assert [machine.runs_here(s) for s in segments] == [True, False]
    assert [name for name, _, _ in machine.job_models(plan, segments[0])] == [
        f"stage 'start' ({plan.start.shape_str()})",
        f"stage 'deeper' (growing {plan.start.shape_str()} into {plan.stages[0].target.shape_str()} live)",
    ]
    cpu_machine(monkeypatch, cores=2, host_gib=64)
    assert machine.check_jobs_fit_here(plan, segments, ds) == []  # 64 ranks on n0 and n1: not this machine's
    monkeypatch.setattr("os.cpu_count", lambda: 1)  # 2 ranks on 1 core: legal, slow, said before the launch
    assert machine.check_jobs_fit_here(plan, segments, ds) == [
        "growlm-run: WARNING: job 0: 2 ranks per node, and this machine has 1 CPU core(s): the ranks share cores and "
        "every step crawls; lower ranks_per_node to 1"
    ]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=80 * 2**30))
    monkeypatch.delenv("DS_ACCELERATOR")
    assert machine.check_jobs_fit_here(plan, segments, ds) == []


def host_of(monkeypatch, gib: float) -> None:
    """This machine as a CPU host of ``gib`` GiB in all (the one hook of every host-memory check: psutil)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=0, total=int(gib * 2**30)))


@pytest.mark.bad_input
@pytest.mark.parametrize("ranks_here", [1, 2])
def test_train_refuses_a_model_that_cannot_fit_the_host_before_building_it(tmp_path, capsys, monkeypatch, ranks_here):
    """A released-model preset on a small host: refused in one line with its figures and what would fit, before
    the model is built or anything is written (a plain train.py run was killed by the kernel instead). Ranks on
    one host share its memory (LOCAL_WORLD_SIZE); at ZeRO-2 each holds all parameters and 1/N of the rest."""
    host_of(monkeypatch, 23.5)

    def past_the_checks(cfg):
        raise AssertionError("train.py went past its checks: it would build a 3.2B-parameter model")

    monkeypatch.setattr(train_run, "join", past_the_checks)  # where the process group, data and model come next
    for key in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.setenv(key, str(ranks_here))
    out = tmp_path / "run"
    cfg_path = str(DS_CONFIG_DIR / "zero2_fp32.json")  # micro batch 8
    argv = ["--preset", "llama-3.2-3b", "--ds_config", cfg_path, "--seq_len", "128", "--out_dir", str(out)]
    line = train_fails(capsys, argv)
    cfg = from_preset("llama-3.2-3b")
    n = param_count(cfg)
    states = memory.model_state_bytes(n, 2, "fp32", ranks_here)
    assert states == (4 + 16 / ranks_here) * n  # parameters replicated; gradients and Adam state (fp32 master) split
    acts = memory.activation_bytes(cfg, memory.MicroBatch(8, 128), "fp32")  # per rank: ZeRO does not shard them
    assert line.startswith(
        f"growlm-train: error: the model {cfg.shape_str()} (3.21B parameters; ZeRO-2, fp32, {ranks_here} rank(s)), "
        f"its model states {states / 2**30:,.1f} GiB + activations of one micro batch of 8 x 128 tokens "
        f"{acts / 2**30:,.1f} GiB, needs about {(states + acts) / 2**30:,.1f} GiB per rank, and this rank's host "
        f"memory ({ranks_here} rank(s) on this node) has {23.5 / ranks_here:,.1f} GiB in all: it cannot fit; what "
        "would (model states and activations within 80% of the memory): a smaller preset (smollm-360m, 0.36B "
        "parameters, about "
    ), line
    # ZeRO-3: 20 bytes x 3.21B parameters = 59.8 GiB over ranks whose hosts keep 80% of 23.5 GiB less this batch's
    # 6.6 GiB of activations each (not sharded): 5
    ranks = math.ceil(memory.model_state_bytes(n, 3, "fp32", 1) / (23.5 * 2**30 / 1.25 - acts))
    assert ranks == 5
    assert line.endswith(
        f"or ZeRO-3 (ds_configs/zero3_fp32.json) on {ranks} ranks, each on a host of this size (ranks on one host "
        "share its memory); CPU offload moves nothing off a CPU rank's host"
    ), line
    assert not out.exists()  # no train.lock, metrics.jsonl or tb/


def test_the_activations_follow_the_published_count():
    """Korthikanti et al. 2022 (arXiv 2205.05198), eq. 1 without the score term a fused attention kernel never keeps
    (Sec. 5), by hand for L=2 d=64 H=4 V=1000, B=3, T=16."""
    cfg = GPTConfig(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128)
    batch = memory.MicroBatch(3, 16)
    layer = 16 * 3 * 64 * 34  # 34 s b h = 3072 x 34 = 104,448 bytes in 16-bit
    assert layer == 104_448
    logits = 3 * 16 * 1000 * 2 + 3 * 16 * 1000 * 4  # half logits + their fp32 copy for the loss: 288,000
    assert memory.activation_bytes(cfg, batch, "bf16") == 2 * layer + logits == 496_896
    assert memory.activation_bytes(cfg, batch, "fp16") == 496_896
    # fp32: every activation twice the bytes, the logits 4 + 4
    assert memory.activation_bytes(cfg, batch, "fp32") == 2 * 2 * layer + 3 * 16 * 1000 * 8 == 801_792
    # checkpointing (Sec. 5): each layer keeps its input, 2 s b h bytes, plus one layer's full activations
    ckpt = memory.MicroBatch(3, 16, checkpointing=True)
    assert memory.activation_bytes(cfg, ckpt, "bf16") == 2 * (2 * 16 * 3 * 64) + layer + logits == 404_736
    assert memory.activation_bytes(cfg, ckpt, "fp32") == 2 * 2 * (2 * 16 * 3 * 64) + 2 * layer + 384_000 == 617_472
    # no score matrix is kept: twice the sequence, exactly twice the bytes
    assert memory.activation_bytes(cfg, memory.MicroBatch(3, 32), "bf16") == 2 * 496_896
    with pytest.raises(ValueError, match="micro batch 0"):
        memory.activation_bytes(cfg, memory.MicroBatch(0, 16), "bf16")
    # placed with the model states: on a CPU all on the host; on a GPU on the device, beside the offloaded Adam part
    assert memory.placed_bytes(10, 20, 0, False, False, 7) == (0.0, 37)
    assert memory.placed_bytes(10, 20, 0, True, True, 7) == (17, 20)


@pytest.mark.bad_input
def test_train_refuses_the_1b_preset_whose_activations_cannot_fit_the_host(tmp_path, capsys, monkeypatch):
    """llama-3.2-1b at its default seq_len (n_positions, 131,072) on a 23.5 GiB host: its 23.0 GiB of fp32 model
    states alone pass, and the kernel killed it in step 1; with one micro batch's activations it is refused in one
    line before the model is built, by train.py, growlm-run and its dry run alike."""
    host_of(monkeypatch, 23.5)
    for key in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)

    def past_the_checks(cfg):
        raise AssertionError("train.py went past its checks: it would build a 1.24B-parameter model")

    monkeypatch.setattr(train_run, "join", past_the_checks)
    cfg = from_preset("llama-3.2-1b")
    states = memory.model_state_bytes(param_count(cfg), 2, "fp32", 1)
    assert states < 23.5 * 2**30  # the model-state check alone let it through
    acts = memory.activation_bytes(cfg, memory.MicroBatch(8, cfg.n_positions), "fp32")
    out = tmp_path / "run"
    cfg_path = str(DS_CONFIG_DIR / "zero2_fp32.json")
    line = train_fails(capsys, ["--preset", "llama-3.2-1b", "--ds_config", cfg_path, "--out_dir", str(out)])
    assert line.startswith(
        f"growlm-train: error: the model {cfg.shape_str()} (1.24B parameters; ZeRO-2, fp32, 1 rank(s)), its model "
        f"states 23.0 GiB + activations of one micro batch of 8 x 131072 tokens {acts / 2**30:,.1f} GiB, needs about "
        f"{(states + acts) / 2**30:,.1f} GiB per rank, and this rank's host memory (1 rank(s) on this node) has 23.5 "
        "GiB in all: it cannot fit; what would (model states and activations within 80% of the memory): "
    ), line
    assert "ZeRO-3 (ds_configs/zero3_fp32.json) on 2 ranks" in line and "--seq_len 2048" in line, line
    assert not out.exists()
    # growlm-run: the job's model and micro batch at train.py's default seq_len, refused before launching
    argv = run_plan(
        tmp_path,
        monkeypatch,
        "start: {preset: llama-3.2-1b, resources: {ranks_per_node: 1}}\n"
        "stages:\n  - {name: deeper, target: {n_layer: 17}, family: masked, when: {step: 2}}\n",
    )
    argv = [argv[0], "--", "--ds_config", cfg_path, "--out_dir", "runs/x"]  # no --seq_len: n_positions
    cpu_machine(monkeypatch, cores=2, host_gib=23.5)
    assert run_cli.main(argv) == 2
    refusal = one_error_line(capsys.readouterr().err, "growlm-run")
    assert refusal.startswith(
        f"job 0: stage 'start' ({cfg.shape_str()}), ZeRO-2, fp32, 1 rank(s), model states 23.0 GiB + activations "
        f"of one micro batch of 8 x 131072 tokens {acts / 2**30:,.1f} GiB, needs about "
        f"{(states + acts) / 2**30:,.1f} GiB per rank, and this machine's host memory is 23.5 GiB per rank"
    ), refusal
    assert "a smaller micro_batch, a shorter --seq_len or --activation_checkpointing" in refusal
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.yaml"]  # nothing launched or written
    assert run_cli.main([argv[0], "--dry_run", *argv[1:]]) == 0
    dry = capsys.readouterr().out
    assert f"activations of one micro batch of 8 x 131072 tokens: {acts / 2**30:.3f} GiB per rank" in dry
    assert f"  WARNING: {refusal}; growlm-run without --dry_run refuses it" in dry


@pytest.mark.bad_input
def test_train_refuses_a_stage_whose_grown_model_cannot_train_here(tmp_path, capsys, monkeypatch):
    """A growth that fits (both models and the working set) whose grown model's activations do not: 1,600 layers at
    8 x 128 tokens, refused with the grown model's figures before anything is built."""
    host_of(monkeypatch, 8)
    for key in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "start: {preset: tiny}\nstages:\n  - {name: deep, target: {n_layer: 1600}, family: masked, when: {step: 2}}\n"
    )
    out = tmp_path / "run"
    cfg_path = str(DS_CONFIG_DIR / "zero2_fp32.json")
    argv = ["--growth_plan", str(plan), "--ds_config", cfg_path, "--max_steps", "40", "--out_dir", str(out)]
    line = train_fails(capsys, argv)
    start = from_preset("tiny")
    deep = replace(start, n_layer=1600)
    states = memory.model_state_bytes(param_count(deep), 2, "fp32", 1)
    acts = memory.activation_bytes(deep, memory.MicroBatch(8, 128), "fp32")
    assert line == (
        f"growlm-train: error: stage 'deep' (training {deep.shape_str()} after its growth, ZeRO-2, fp32), model "
        f"states {memory.size_text(states)} + activations of one micro batch of 8 x 128 tokens "
        f"{memory.size_text(acts)}, needs about {(states + acts) / 2**30:,.1f} GiB per rank, and this rank's host "
        "memory (1 rank(s) on this node) has 8.0 GiB in all: choose a smaller target, more ranks or a higher ZeRO "
        "stage, or a smaller micro batch, a shorter --seq_len or --activation_checkpointing"
    )
    assert not out.exists()


def test_the_tiny_cpu_runs_of_the_suite_fit_a_24_gib_host(monkeypatch):
    """cpu-small and llama-cpu-small at seq_len 128 (and their n_positions) on the shipped configs' micro batch 8."""
    host_of(monkeypatch, 24)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for name in ("cpu-small", "llama-cpu-small", "tiny"):
        cfg = from_preset(name)
        for precision, ds in (("fp32", {}), ("bf16", {"bf16": {"enabled": True}})):
            for seq_len in (128, cfg.n_positions):
                ds_cfg = {**ds, "zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 8}
                plan_checks.check_run_fits_memory(cfg, ds_cfg, 1, memory.MicroBatch(8, seq_len))
                assert memory.activation_bytes(cfg, memory.MicroBatch(8, seq_len), precision) < 2**30


def test_on_a_gpu_the_refusal_names_the_offload_that_fits(monkeypatch):
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(plan_checks, "run_device", lambda: gpu)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=80 * 2**30))
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=0, total=2**40))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    ds = {"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}
    batch = memory.MicroBatch(1, 1024)
    big = from_preset("llama-3.1-8b")
    with pytest.raises(UsageError) as e:
        plan_checks.check_run_fits_memory(big, ds, 1, batch)
    msg = str(e.value)
    acts = memory.activation_bytes(big, batch, "bf16")  # on the GPU, beside the model states
    need = memory.model_state_bytes(param_count(big), 2, "bf16", 1) + acts  # 119.7 GiB of model states
    assert f"needs about {need / 2**30:,.1f} GiB per rank, and this rank's GPU has 80.0 GiB in all: it cannot" in msg
    # 16 bytes x 8.03B (119.7 GiB) over GPUs keeping 80% of 80 GiB less 10.0 GiB of activations each: 3; the offload
    # leaves 4 bytes a parameter (30 GiB) and the activations on the GPU
    assert msg.endswith(
        "or ZeRO-3 (ds_configs/zero3_bf16.json) on 3 GPUs, or the optimizer offloaded to the CPU "
        "(ds_configs/zero2_bf16_offload.json)"
    ), msg
    plan_checks.check_run_fits_memory(from_preset("llama-3.2-1b"), ds, 1, batch)  # 18.4 + 3.9 GiB: fits


@pytest.mark.bad_input
def test_dry_run_warns_where_the_real_run_refuses_for_memory(tmp_path, capsys, monkeypatch):
    argv = run_plan(
        tmp_path,
        monkeypatch,
        "start: {preset: llama-3.2-3b, resources: {ranks_per_node: 1}}\n"
        "stages:\n  - {name: deeper, target: {n_layer: 30}, family: masked, when: {step: 2}}\n",
    )
    argv = [argv[0], "--", "--ds_config", str(DS_CONFIG_DIR / "zero2_fp32.json"), *argv[2:]]
    cpu_machine(monkeypatch, cores=2, host_gib=23.5)
    assert run_cli.main(argv) == 2
    refusal = one_error_line(capsys.readouterr().err, "growlm-run")
    cfg = from_preset("llama-3.2-3b")
    need = memory.model_state_bytes(param_count(cfg), 2, "fp32", 1) + memory.activation_bytes(
        cfg, memory.MicroBatch(8, 32), "fp32"
    )  # the config's micro batch 8, --seq_len 32
    assert refusal.startswith("job 0: stage 'start' (llama L=28") and f"needs about {need / 2**30:,.1f} GiB" in refusal
    assert run_cli.main([argv[0], "--dry_run", *argv[1:]]) == 0
    out = capsys.readouterr().out
    assert "model states per rank: 59.842 GiB" in out and out.count("WARNING") == 1  # once per job
    assert f"  WARNING: {refusal}; growlm-run without --dry_run refuses it" in out
    assert "growlm-run dry run: 1 warning(s)" in out
