"""train.py --init_from with a transformers Llama folder, real runs: the folder (written by transformers, GQA with 4
query and 2 key/value heads) goes into a fresh engine exactly: the fp32 masters equal the folder's tensors, the first
loss equals transformers' LlamaForCausalLM loss on the same batch (1e-5, fp32), and two steps at LR 0 leave every
weight as it was; untied at ZeRO-2 on one rank, tied and sharded at ZeRO-3 on two."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dist_utils import run_ranks, write_ds_config
from llama_folder_helpers import llama_token_folder, make_llama_folder

RUN = ["--seq_len", "32", "--no_final_eval", "--log_interval", "1", "--max_steps", "2"]


def probe(tmp_path: Path, folder: Path, template: str, nproc: int) -> dict:
    """The probe's record of an --init_from run of ``folder`` (2 steps at LR 0, 4 windows per rank)."""
    data = llama_token_folder(tmp_path / "tokens", folder)
    cfg = write_ds_config(tmp_path / "lr0.json", template, train_micro_batch_size_per_gpu=4, lr=0.0)
    out = tmp_path / "probe.json"
    args = [str(out), *RUN, "--init_from", str(folder), "--data", str(data), "--ds_config", str(cfg),
            "--out_dir", str(tmp_path / "run")]  # fmt: skip
    r = run_ranks(args, nproc=nproc, script="tests/llama_init_from_probe.py")
    assert r.returncode == 0, r.stdout[-3000:]
    return json.loads(out.read_text())


def check(d: dict, n_params: int, zero_stage: int) -> None:
    assert d["zero_stage"] == zero_stage and d["n_params"] == n_params
    assert max(d["master_diff_before"].values()) == 0.0  # the fp32 masters ARE the folder's tensors
    assert d["losses"][0] == pytest.approx(d["hf_loss"], abs=1e-5)  # transformers' own loss on the same batch
    assert abs(d["hf_loss"] - 5.7038) > 0.1  # not ln(300), a uniform model's loss: the weights matter
    assert d["lrs"] == [0.0, 0.0]
    assert max(d["master_diff_after"].values()) == 0.0  # two steps at LR 0: every weight unchanged


def test_untied_gqa_folder_zero2_one_rank(tmp_path):
    folder = make_llama_folder(tmp_path / "untied")
    check(probe(tmp_path, folder, "zero2_fp32", 1), n_params=21, zero_stage=2)


def test_tied_sharded_folder_zero3_two_ranks(tmp_path):
    folder = make_llama_folder(tmp_path / "tied", tied=True, max_shard_size="40KB")
    assert (folder / "model.safetensors.index.json").is_file()
    check(probe(tmp_path, folder, "zero3_fp32", 2), n_params=20, zero_stage=3)
