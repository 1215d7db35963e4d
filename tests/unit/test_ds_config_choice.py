"""The shipped DeepSpeed configs' GPU variants (ds_configs/gpu/) and their choice by accelerator
(runtime.ds_config.choose_ds_config, trainer.run.pick_ds_config), checked on the CPU with the accelerator's name
faked."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest

from growlm import DS_CONFIG_DIR
from growlm.runtime.ds_config import GPU_CONFIG_DIR, check_ds_config_meaning, choose_ds_config, shipped_ds_config
from growlm.trainer.run import pick_ds_config

VARIANTS = sorted(p.name for p in GPU_CONFIG_DIR.glob("*.json"))


def test_every_zero_1_to_3_config_has_a_gpu_variant_that_differs_only_in_its_zero_section():
    assert VARIANTS == [f"zero{s}_{p}.json" for s in (1, 2, 3) for p in ("bf16", "fp16", "fp32")]
    for name in VARIANTS:
        cpu = json.loads((DS_CONFIG_DIR / name).read_text())
        gpu = json.loads((GPU_CONFIG_DIR / name).read_text())
        assert cpu.pop("zero_optimization")["stage"] == gpu.pop("zero_optimization")["stage"]
        assert cpu == gpu, name  # optimizer, schedule, precision, batch: the same


def test_gpu_variants_carry_deepspeeds_gpu_defaults_and_pass_its_parser():
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    defaults = DeepSpeedZeroConfig()
    for name in VARIANTS:
        cfg = json.loads((GPU_CONFIG_DIR / name).read_text())
        zero = DeepSpeedZeroConfig(**cfg["zero_optimization"])
        assert zero.reduce_bucket_size == defaults.reduce_bucket_size == 500_000_000
        assert zero.allgather_bucket_size == defaults.allgather_bucket_size == 500_000_000
        assert zero.contiguous_gradients is True and zero.overlap_comm is True
        if zero.stage == 3:
            for field in ("prefetch_bucket_size", "param_persistence_threshold", "max_live_parameters",
                          "max_reuse_distance", "sub_group_size"):  # fmt: skip
                assert getattr(zero, field) == getattr(defaults, field), (name, field)
        check_ds_config_meaning(cfg, 2)
    # the CPU configs keep their measured values
    cpu = json.loads((DS_CONFIG_DIR / "zero2_bf16.json").read_text())["zero_optimization"]
    assert (cpu["reduce_bucket_size"], cpu["contiguous_gradients"]) == (2_000_000, False)


def test_a_shipped_config_is_replaced_by_its_gpu_variant_on_cuda_only():
    shipped = str(DS_CONFIG_DIR / "zero2_bf16.json")
    assert choose_ds_config(shipped, "cpu") == (shipped, None)
    path, note = choose_ds_config(shipped, "cuda")
    assert path == str(GPU_CONFIG_DIR / "zero2_bf16.json")
    assert note.startswith(f"growlm: --ds_config {shipped} is a shipped config with CPU-measured values; on CUDA")
    assert "ds_configs/gpu/zero2_bf16.json" in note
    zero0 = str(DS_CONFIG_DIR / "zero0_bf16.json")  # no variant: stage 0 has no buckets to size
    assert choose_ds_config(zero0, "cuda") == (zero0, None)
    explicit = str(GPU_CONFIG_DIR / "zero3_fp32.json")  # asked for by name: used as given, on any accelerator
    assert choose_ds_config(explicit, "cpu") == (explicit, None) == choose_ds_config(explicit, "cuda")
    assert shipped_ds_config(1, "fp32", "cuda") == GPU_CONFIG_DIR / "zero1_fp32.json"
    assert shipped_ds_config(1, "fp32", "cpu") == DS_CONFIG_DIR / "zero1_fp32.json"


def test_a_users_own_config_is_never_replaced(tmp_path, monkeypatch):
    mine = tmp_path / "zero2_bf16.json"  # a copy of a shipped config, same name, another folder
    shutil.copy(DS_CONFIG_DIR / "zero2_bf16.json", mine)
    assert choose_ds_config(str(mine), "cuda") == (str(mine), None)
    missing = str(tmp_path / "nope.json")
    assert choose_ds_config(missing, "cuda") == (missing, None)  # the reader refuses it, naming it


@pytest.mark.parametrize("rank", ["0", "1"])
def test_train_py_says_which_config_it_chose_on_rank_0(capsys, monkeypatch, rank):
    monkeypatch.setenv("RANK", rank)
    args = argparse.Namespace(ds_config=str(DS_CONFIG_DIR / "zero3_bf16.json"))
    pick_ds_config(args, "cuda")
    assert args.ds_config == str(GPU_CONFIG_DIR / "zero3_bf16.json")
    out = capsys.readouterr().out
    assert ("ds_configs/gpu/zero3_bf16.json is used" in out) == (rank == "0")
    args = argparse.Namespace(ds_config=str(DS_CONFIG_DIR / "zero3_bf16.json"))
    pick_ds_config(args, "cpu")
    assert args.ds_config == str(DS_CONFIG_DIR / "zero3_bf16.json") and capsys.readouterr().out == ""


def test_growlm_run_gives_its_jobs_the_gpu_variant_too(tmp_path, capsys, monkeypatch):
    from growlm.trainer.driver import cli as run_cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(run_cli, "select_accelerator", lambda: "cuda")
    (tmp_path / "plan.yaml").write_text(
        "start: {preset: tiny, resources: {ranks_per_node: 1, zero_stage: 2, micro_batch: 1}}\n"
        "stages:\n  - {name: deeper, target: {n_layer: 3}, family: masked, when: {step: 2}}\n"
    )
    shipped = str(DS_CONFIG_DIR / "zero2_fp32.json")
    argv = ["plan.yaml", "--dry_run", "--", "--seq_len", "32", "--out_dir", "runs/x", "--ds_config", shipped]
    assert run_cli.main(argv) == 0
    out = capsys.readouterr().out
    assert f"growlm-run: --ds_config {shipped} is a shipped config" in out
    assert "ds_configs/gpu/zero2_fp32.json is used" in out
