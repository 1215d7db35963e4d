"""runtime/: atomic writes and file modes, RunState (fixtures written by the code before RunState), the checkpoint
opener, safe loading (a crafted pickle is refused by every growlm loader and never runs), and the rank launcher.
Single process, no DeepSpeed engine; about 20 s."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from growlm import DS_CONFIG_DIR
from growlm.runtime import atomic
from growlm.runtime.checkpoint import (
    CheckpointError,
    check_pickles,
    open_checkpoint,
    safe_load,
)
from growlm.runtime.rng import rng_state, set_rng_state
from growlm.runtime.run_state import STATE_FILE, VERSION, RunState, RunStateError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TRAIN_V1 = FIXTURES / "growlm_state_train_v1.json"  # train.py before RunState: tiny, 1 rank, ZeRO-2, 2 steps
GROW_V1 = FIXTURES / "growlm_state_grow_v1.json"  # growlm-grow before RunState: that checkpoint, masked n_layer 3


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


# ----- atomic writes --------------------------------------------------------------------------------------------


def test_atomic_file_follows_umask_and_refuses_to_overwrite(tmp_path, umask_022):
    p = atomic.write_text(tmp_path / "a.txt", "one")
    assert p.read_text() == "one" and p.stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        atomic.write_text(p, "two")
    assert p.read_text() == "one"
    atomic.write_json(p, {"x": [1, 2]}, overwrite=True)
    assert json.loads(p.read_text()) == {"x": [1, 2]}
    with pytest.raises(RuntimeError), atomic.atomic_path(tmp_path / "b.bin") as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("writer died")
    assert not (tmp_path / "b.bin").exists()
    assert sorted(q.name for q in tmp_path.iterdir()) == ["a.txt"]  # no temporary file left
    os.umask(0o077)
    assert atomic.write_bytes(tmp_path / "c.bin", b"x").stat().st_mode & 0o777 == 0o600  # the umask, whatever it is


def test_atomic_dir_commits_whole_folders_with_umask_modes(tmp_path, umask_022):
    out = tmp_path / "out"
    with atomic.atomic_dir(out) as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "w.bin").write_bytes(b"w")
        os.chmod(tmp / "sub" / "w.bin", 0o600)  # as a library writing through tempfile.mkstemp leaves it
        assert not out.exists()
    assert (out / "sub" / "w.bin").stat().st_mode & 0o777 == 0o644
    assert out.stat().st_mode & 0o777 == (out / "sub").stat().st_mode & 0o777 == 0o755
    with pytest.raises(FileExistsError), atomic.atomic_dir(out) as tmp:
        (tmp / "new").write_text("n")
    assert not (out / "new").exists()  # the existing folder is never replaced unless asked
    with atomic.atomic_dir(out, overwrite=True) as tmp:
        (tmp / "new").write_text("n")
    assert sorted(q.name for q in out.iterdir()) == ["new"]
    with pytest.raises(KeyError), atomic.atomic_dir(tmp_path / "never") as tmp:
        raise KeyError("failed half way")
    assert sorted(q.name for q in tmp_path.iterdir()) == ["out"]  # no .tmp-*, no .old-*, no half folder


# ----- RunState -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", [TRAIN_V1, GROW_V1])
def test_run_state_reads_files_written_before_it_and_round_trips(fixture):
    doc = json.loads(fixture.read_text())
    assert "version" not in doc  # written by the code before RunState
    st = RunState.from_json(fixture.read_text())
    assert st.version == 1 and st.global_step == 2 and st.consumed_samples == 16 and st.seq_len == 32
    assert st.consumed_tokens == doc["consumed_tokens"] == 512
    assert st.world_size == 1 and st.zero_stage == 2 and st.seed == 1234 and st.precision == "fp32"
    assert st.data.train_sha256 == doc["data"]["train_sha256"] and st.ds_config == doc["ds_config"]
    again = st.to_json()
    assert again["version"] == VERSION and again["format"] == "growlm-checkpoint-v1"
    assert {k: v for k, v in again.items() if k != "version"} == {
        k: v for k, v in doc.items() if k not in ("universal", "growth")
    } | {"universal": doc.get("universal", False), "growth": doc.get("growth", [])}
    assert RunState.from_json(st.dumps()) == RunState.from_json(again) and RunState.from_json(again).version == VERSION


def test_run_state_of_growlm_grow_keeps_masks_and_history():
    st = RunState.from_json(GROW_V1.read_text())
    assert st.universal and st.model_config.n_layer == 3
    assert st.growth_masks is not None and list(st.growth_masks.new_layers) == [2] and st.growth_masks.ramp_steps == 4
    assert [(g["step"], g["family"], g["from"]["n_layer"], g["to"]["n_layer"]) for g in st.growth] == [
        (2, "masked", 2, 3)
    ]
    plain = RunState.from_json(TRAIN_V1.read_text())
    assert not plain.universal and plain.growth == [] and plain.growth_masks is None and plain.schedule is None


@pytest.mark.bad_input
def test_run_state_refuses_what_it_cannot_read():
    doc = json.loads(TRAIN_V1.read_text())
    with pytest.raises(RunStateError, match="no 'model_config'"):
        RunState.from_json({k: v for k, v in doc.items() if k != "model_config"})
    with pytest.raises(RunStateError, match="no 'seq_len'"):
        RunState.from_json({k: v for k, v in doc.items() if k != "seq_len"})
    with pytest.raises(RunStateError, match="newer growlm"):
        RunState.from_json({**doc, "version": VERSION + 1})
    with pytest.raises(RunStateError, match="format 'nanogpt'"):
        RunState.from_json({**doc, "format": "nanogpt"})
    with pytest.raises(RunStateError, match="not valid JSON"):
        RunState.from_json('{"format": "growlm-checkpoint-v1", "glob')
    with pytest.raises(RunStateError, match="invalid model_config"):
        RunState.from_json({**doc, "model_config": {"n_layer": 2, "colour": "red"}})
    kept = RunState.from_json({**doc, "future_key": {"a": 1}})  # a key this version does not know is written back
    assert kept.to_json()["future_key"] == {"a": 1}


# ----- opening a checkpoint and safe loading --------------------------------------------------------------------


class _CreatesAFile:
    """A pickle payload: unpickling it runs ``open(path, 'w')`` (any callable would do)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _crafted(path: Path, marker: Path, wrap=lambda x: x) -> Path:
    torch.save(wrap(_CreatesAFile(marker)), path)
    return path


def _tag_folder(root: Path) -> Path:
    tag = root / "checkpoints" / "global_step2"
    tag.mkdir(parents=True)
    shutil.copy(TRAIN_V1, tag / STATE_FILE)
    (root / "checkpoints" / "latest").write_text("global_step2")
    return tag


def test_open_checkpoint_resolves_reads_and_checks(tmp_path):
    tag = _tag_folder(tmp_path)
    torch.save({"module": {"w": torch.ones(2)}}, tag / "mp_rank_00_model_states.pt")
    torch.save(rng_state(), tag / "rng_state_rank0.pt")
    for path in (tmp_path, tmp_path / "checkpoints", tag):  # run folder, checkpoint folder, tag folder
        ck = open_checkpoint(path)
        assert (ck.ckpt_dir, ck.tag, ck.state.global_step) == (tmp_path / "checkpoints", "global_step2", 2)
    from growlm.runtime.manifest import write_manifest

    write_manifest(tag)
    (tag / "rng_state_rank0.pt").write_bytes(b"x" * (tag / "rng_state_rank0.pt").stat().st_size)
    with pytest.raises(CheckpointError, match="sha256"):
        open_checkpoint(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="not a growlm checkpoint"):
        open_checkpoint(tmp_path / "empty")


def test_checkpoint_tags_are_listed_in_step_order(tmp_path):
    from growlm.runtime import checkpoint

    for name in ("global_step11", "global_step9", "global_step100", "final", ".tmp-global_step12"):
        (tmp_path / name).mkdir()
        (tmp_path / name / STATE_FILE).write_text("{}")
    (tmp_path / "global_step13").mkdir()  # no state file: not a finished checkpoint
    assert checkpoint.existing_tags(tmp_path) == ["final", "global_step9", "global_step11", "global_step100"]
    with pytest.raises(CheckpointError, match=r"e\.g\. .*global_step100\)"):  # the hint names the newest tag
        open_checkpoint(tmp_path)


def test_rng_state_file_is_tensors_only_and_restores(tmp_path):
    import random

    import numpy as np

    torch.save(rng_state(), tmp_path / "rng.pt")
    want = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))  # no allow-list needed
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == want


@pytest.mark.bad_input
def test_a_crafted_pickle_is_refused_by_every_growlm_loader(tmp_path):
    """Where each loader reads: the checkpoint opener (resume, growlm-grow, growlm-eval: every .pt of the tag folder,
    RNG files included), a universal checkpoint's tensor file, growlm-eval's module weights, and a
    transformers folder holding a pickle instead of safetensors. The file the payload would create never appears."""
    from growlm.eval.metrics.load import load, load_transformers
    from growlm.growth.offline.universal import load_file
    from growlm.trainer.scoring import EvalInputError

    marker = tmp_path / "pwned"
    tag = _tag_folder(tmp_path)
    _crafted(tag / "rng_state_rank0.pt", marker, lambda x: {"python": x})
    with pytest.raises(CheckpointError, match="rng_state_rank0.pt: refusing to load it.*io.open"):
        open_checkpoint(tmp_path / "checkpoints")
    with pytest.raises(CheckpointError, match="refusing to load"):
        check_pickles(tag)
    with pytest.raises(CheckpointError, match="refusing to load"):
        safe_load(tag / "rng_state_rank0.pt")
    (tag / "rng_state_rank0.pt").unlink()
    _crafted(tag / "mp_rank_00_model_states.pt", marker, lambda x: {"module": x})
    with pytest.raises(EvalInputError, match="mp_rank_00_model_states.pt: refusing to load"):
        load(tag)  # growlm-eval
    universal = _crafted(tmp_path / "fp32.pt", marker, lambda x: {"param": x, "cat_dim": 0})
    with pytest.raises(CheckpointError, match="fp32.pt: refusing to load"):
        load_file(universal, "fp32 of transformer.wte.weight")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1, "n_embd": 8, "n_head": 2}))
    _crafted(hf / "pytorch_model.bin", marker)
    with pytest.raises(EvalInputError, match="only as pytorch_model.bin, a pickle, which growlm does not load"):
        load_transformers(hf)
    assert not marker.exists()


# ----- the rank launcher ----------------------------------------------------------------------------------------


def test_known_noise_is_dropped_and_nothing_else():
    """runtime.quiet: the known DeepSpeed log line and torch FutureWarnings are hidden; other records are kept."""
    import logging
    import warnings

    from growlm.runtime.quiet import quiet_known_noise

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logger = logging.getLogger("DeepSpeed")
    handler = Keep()
    logger.addHandler(handler)
    try:
        quiet_known_noise()
        quiet_known_noise()  # idempotent: one filter
        logger.warning("Attempting to get learning rate from scheduler before it has started")
        logger.warning("total_num_steps 1 is less than warmup_num_steps 20")
    finally:
        logger.removeHandler(handler)
    assert seen == ["total_num_steps 1 is less than warmup_num_steps 20"]
    assert sum(type(f).__name__ == "_DropMessages" for f in logger.filters) == 1
    with warnings.catch_warnings(record=True) as caught:
        quiet_known_noise()
        warnings.warn("`torch.distributed.all_gather_into_tensor` is deprecated", FutureWarning, stacklevel=1)
        warnings.warn("something else", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["something else"]


def test_cuda_gets_torch_fused_adamw_and_nothing_else_changes():
    from growlm.runtime.engine import optimizer_for_device

    cfg = json.loads((DS_CONFIG_DIR / "zero2_bf16.json").read_text())
    fused = optimizer_for_device(cfg, "cuda")
    assert fused["optimizer"]["params"] == {**cfg["optimizer"]["params"], "fused": True}
    assert {k: v for k, v in fused.items() if k != "optimizer"} == {k: v for k, v in cfg.items() if k != "optimizer"}
    assert "fused" not in cfg["optimizer"]["params"]  # the input is not modified
    assert optimizer_for_device(cfg, "cpu") is cfg
    own = {**cfg, "optimizer": {**cfg["optimizer"], "params": {**cfg["optimizer"]["params"], "foreach": True}}}
    assert optimizer_for_device(own, "cuda") is own  # the user's own choice stays
    offload = json.loads((DS_CONFIG_DIR / "zero2_bf16_offload.json").read_text())
    assert optimizer_for_device(offload, "cuda")["optimizer"] == offload["optimizer"]  # DeepSpeed's CPU Adam


def test_adam_step_tensor_lives_where_the_kernel_reads_it():
    import torch

    from growlm.growth.ops.stores import adam_step_tensor

    p = torch.nn.Parameter(torch.ones(3))
    plain = adam_step_tensor(torch.optim.AdamW([p]), 7, p)
    fused = adam_step_tensor(torch.optim.AdamW([p], fused=True), 7, p)
    assert plain.device.type == "cpu" and float(plain) == 7.0 and plain.dtype == torch.float32
    assert fused.device == p.device and fused.dtype == torch.float32 and float(fused) == 7.0
    opt = torch.optim.AdamW([p], lr=0.1, fused=True)  # the fused kernel steps from it
    opt.state[p].update(step=fused, exp_avg=torch.zeros(3), exp_avg_sq=torch.zeros(3))
    p.grad = torch.ones(3)
    opt.step()
    assert float(opt.state[p]["step"]) == 8.0


def test_deepspeed_builds_no_shm_comm_op_once_growlm_skips_it(monkeypatch):
    """runtime.dist.skip_shm_comm_op: DeepSpeed's CPU backend then gets no shared-memory op (nothing compiled or
    loaded); the op's name is still the one in DeepSpeed's table, so a rename fails here instead of building again."""
    monkeypatch.setenv("DS_ACCELERATOR", os.environ.get("DS_ACCELERATOR", "cpu"))
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator
    from deepspeed.comm.torch import build_shm_op

    from growlm.runtime.dist import SHM_COMM_OP, skip_shm_comm_op

    if get_accelerator().device_name() != "cpu":
        pytest.skip("the shared-memory op is DeepSpeed's CPU backend's")
    assert get_accelerator().create_op_builder("ShareMemCommBuilder").NAME == SHM_COMM_OP
    monkeypatch.setitem(deepspeed.ops.__compatible_ops__, SHM_COMM_OP, True)  # as DeepSpeed's probe finds it here
    assert skip_shm_comm_op()
    assert deepspeed.ops.__compatible_ops__[SHM_COMM_OP] is False
    assert build_shm_op() is None


@pytest.mark.parametrize("variable", ["LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"])
def test_a_multi_node_launch_counts_the_ranks_of_this_node(monkeypatch, variable):
    """4 nodes x 8 GPUs (WORLD_SIZE 32) under torchrun, DeepSpeed's launcher (LOCAL_SIZE) or mpirun: 8 ranks share
    the node, so each gets 1/8 of its cores and of its host memory, not 1/32."""
    from growlm.runtime import dist, memory

    for key in memory.NODE_RANK_VARIABLES:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "32")
    monkeypatch.setenv(variable, "8")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(96)))
    assert memory.ranks_on_this_node() == 8 and dist.rank_threads() == 12
    total = memory.psutil.virtual_memory().total
    assert memory.rank_memory_bytes(torch.device("cpu"), free=False) == total // 8


def test_each_rank_gets_its_share_of_the_nodes_cores_on_any_accelerator(monkeypatch):
    from growlm.runtime import dist

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # an 8-GPU node: 2 threads each for growth's CPU work
    assert dist.rank_threads() == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")  # more ranks than cores: still one thread
    assert dist.rank_threads() == 1
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.setenv("WORLD_SIZE", "4")  # a launcher that names no local world size
    assert dist.rank_threads() == 4
    # the setting is made for every accelerator, not only the CPU (read from the source, not by starting a group)
    import inspect

    src = inspect.getsource(dist.init_distributed)
    assert 'if "OMP_NUM_THREADS" not in os.environ:\n        torch.set_num_threads(rank_threads())' in src


class _Built(Exception):
    """Raised by the stand-in for deepspeed.initialize, carrying the module it was handed."""


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_grown_model_is_built_on_the_ranks_device_in_its_training_dtype(monkeypatch, precision, arch):
    """With uninitialised=True (a live growth, every weight written next) build_engine creates the module on the
    accelerator's current device in the config's training dtype, so no rank holds a host fp32 copy (6 bytes per
    parameter for DeepSpeed to cast and move); a fresh run's build (without the flag) keeps the family's init on the
    host in fp32. The device is faked as "meta": whatever is not built in place stays on the CPU and is seen."""
    import deepspeed
    import deepspeed.accelerator

    from growlm.model.config import from_preset
    from growlm.runtime import engine

    class FakeAccelerator:
        def device_name(self):
            return "cuda"

        def current_device_name(self):
            return "meta"

    def initialize(model, **_):
        raise _Built(model)

    monkeypatch.setattr(deepspeed.accelerator, "get_accelerator", lambda: FakeAccelerator())
    monkeypatch.setattr(deepspeed, "initialize", initialize)
    cfg = from_preset("tiny" if arch == "gpt2" else "llama-tiny")
    ds_cfg = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    if precision != "fp32":
        ds_cfg[precision] = {"enabled": True}
    dtype = engine.TRAINING_DTYPES[precision]
    with pytest.raises(_Built) as built:
        engine.build_engine(cfg, None, ds_cfg, uninitialised=True)
    tensors = [*built.value.args[0].parameters(), *built.value.args[0].buffers()]
    assert {(t.device.type, t.dtype) for t in tensors if t.is_floating_point()} == {("meta", dtype)}
    assert torch.get_default_dtype() == torch.float32 and torch.empty(1).device.type == "cpu"  # restored
    with pytest.raises(_Built) as built:
        engine.build_engine(cfg, None, ds_cfg)
    assert {(p.device.type, p.dtype) for p in built.value.args[0].parameters()} == {("cpu", torch.float32)}


@pytest.mark.bad_input
def test_a_resume_in_another_precision_is_refused_before_deepspeed_looks_for_its_files(tmp_path):
    """An fp32 checkpoint resumed by a bf16 run: DeepSpeed would look for bf16_zero_* optimizer files the fp32 run
    never wrote and fail with a FileNotFoundError traceback; refused first, naming the config that fits."""
    from growlm.runtime.resume_checks import check_compatible

    state = replace(RunState.from_json(TRAIN_V1.read_text()), precision="fp32")
    shape = state.model_config.to_dict()
    same = {"model_config": shape, "world_size": state.world_size, "zero_stage": 2, "path": tmp_path}
    with pytest.raises(CheckpointError) as e:
        check_compatible(state, **same, precision="bf16", ds_config="ds_configs/zero2_bf16.json")
    assert str(e.value) == (
        f"{tmp_path} was saved in fp32 and this run's DeepSpeed config (ds_configs/zero2_bf16.json) trains in "
        "bf16: DeepSpeed keeps the optimizer state per precision. Resume with a config of the saved precision "
        "(--ds_config, e.g. ds_configs/zero2_fp32.json)"
    )
    check_compatible(state, **same, precision="fp32")  # the saved precision
    check_compatible(replace(state, precision=None), **same, precision="bf16")  # a state that does not say
    check_compatible(replace(state, universal=True), **same, precision="bf16")  # growlm-grow's: loads at any
