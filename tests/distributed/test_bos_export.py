"""growlm-grow --export_hf of a checkpoint trained on data from a TinyLlama-style folder (a tokenizer whose template
puts ``<s>`` = 1 first, ``</s>`` = 2, ``<unk>`` = 0): config.json, generation_config.json and the tokenizer files of
the export name bos 1, eos 2, unk 0, and transformers' AutoTokenizer on the export encodes exactly as on the source
folder, ``<s>`` first, as the token files the model trained on begin each document."""

from __future__ import annotations

import json

import numpy as np
from bos_folder_helpers import make_bos_llama_folder
from dist_utils import run_ranks, write_ds_config
from llama_folder_helpers import llama_token_folder

from growlm.data.tokens import load_meta
from growlm.growth.offline.cli import main as grow_main

TEXT = "The tempest rose over the island, and the sailors cried out to the sea."


def test_export_of_bos_template_data_names_the_folders_bos_eos_and_unk(tmp_path):
    from transformers import AutoTokenizer

    folder = make_bos_llama_folder(tmp_path / "src")
    data = llama_token_folder(tmp_path / "tokens", folder, chars=4000)
    meta = load_meta(data)
    assert meta["add_bos_token"] is True and meta["special_tokens"]["bos_token"] == {"token": "<s>", "id": 1}
    train = np.fromfile(data / "train.bin", dtype="<u2")
    assert train[0] == 1 and int((train == 1).sum()) == meta["splits"]["train"]["n_documents"] == 3
    cfg = write_ds_config(tmp_path / "ds.json", "zero2_fp32", train_micro_batch_size_per_gpu=2, lr=3e-3)
    run = tmp_path / "run"
    r = run_ranks(["--seq_len", "32", "--no_final_eval", "--max_steps", "1", "--init_from", str(folder), "--data",
                   str(data), "--ds_config", str(cfg), "--out_dir", str(run)], nproc=1)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:]
    hf_dir = tmp_path / "hf"
    assert grow_main([str(run / "checkpoints"), "--export_hf", str(hf_dir)]) == 0

    config = json.loads((hf_dir / "config.json").read_text())
    generation = json.loads((hf_dir / "generation_config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (1, 2)
    tk_config = json.loads((hf_dir / "tokenizer_config.json").read_text())
    assert (tk_config["bos_token"], tk_config["eos_token"], tk_config["unk_token"]) == ("<s>", "</s>", "<unk>")
    ours, source = AutoTokenizer.from_pretrained(str(hf_dir)), AutoTokenizer.from_pretrained(str(folder))
    assert ours(TEXT)["input_ids"] == source(TEXT)["input_ids"] and ours(TEXT)["input_ids"][0] == 1
    assert (ours.bos_token_id, ours.eos_token_id, ours.unk_token_id) == (1, 2, 0)
