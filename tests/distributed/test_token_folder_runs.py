"""A token folder whose ids lie past its vocabulary, given to a 2-rank train.py run: refused before the ranks join,
in one line (rank 0's) and exit status 2, where it used to end both ranks with an IndexError traceback at step 1;
nothing is written into --out_dir. (Every other bad token folder: tests/unit/test_token_folder_checks.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
from dist_utils import run_ranks, tiny_ds_config

VOCAB = 70_000


@pytest.mark.bad_input
def test_ids_past_the_vocabulary_are_refused_in_one_line_on_two_ranks(tmp_path):
    data = tmp_path / "tok"
    data.mkdir()
    splits = {}
    for split, ids in (("train", VOCAB + np.arange(8002) % 1000), ("val", np.arange(512))):
        (data / f"{split}.bin").write_bytes(ids.astype("<u4").tobytes())
        splits[split] = {"file": f"{split}.bin", "n_tokens": len(ids), "n_documents": 1}
    meta = {"format": "growlm-tokens-v2", "dtype": "uint32", "tokenizer": "gpt2", "vocab_size": VOCAB,
            "eot_token_id": VOCAB - 1, "splits": splits}  # fmt: skip
    (data / "meta.json").write_text(json.dumps(meta))
    out = tmp_path / "run"
    args = ["--preset", "llama-tiny", "--vocab_size", str(VOCAB), "--seq_len", "32", "--max_steps", "2",
            "--ds_config", str(tiny_ds_config(tmp_path)), "--data", str(data), "--out_dir", str(out)]  # fmt: skip
    r = run_ranks(args, nproc=2, timeout=300)
    errors = [line for line in r.stdout.splitlines() if "error" in line.lower()]
    assert r.returncode == 2, r.stdout[-3000:]
    assert errors == [
        f"growlm-train: error: --data {data}: {data / 'train.bin'}: token 0 of 8,002 is {VOCAB}, outside the "
        f"folder's vocabulary [0, {VOCAB}) (meta.json's vocab_size): the ids are not its tokenizer's, or the file is "
        f"damaged; re-run growlm-prepare with --overwrite --out {data}"
    ], r.stdout[-3000:]
    assert "Traceback" not in r.stdout and not out.exists()
    assert sorted(p.name for p in data.iterdir()) == ["meta.json", "train.bin", "val.bin"]
