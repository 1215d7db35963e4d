"""growlm-eval reads a transformers Llama folder (LlamaForCausalLM written by transformers: GQA, tied or untied head,
one safetensors file or shards) with its own tokenizer, scores it with transformers' forward pass, whose logits are
growlm's Llama's on the same weights, and refuses in one line a Llama growlm cannot run exactly or damaged weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from cli_utils import one_error_line
from llama_folder_helpers import make_llama_folder
from safetensors.torch import load_file

from growlm.eval.metrics import cli as eval_cli
from growlm.eval.metrics.load import load
from growlm.model.config import LlamaConfig
from growlm.model.registry import build_model


def growlm_logits(folder: Path, cfg: LlamaConfig, ids: torch.Tensor) -> torch.Tensor:
    """growlm's own Llama with the folder's tensors (every shard), logits (B, T, V)."""
    tensors = {}
    for f in sorted(folder.glob("*.safetensors")):
        tensors |= load_file(str(f))
    model = build_model(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(tensors[name])
        return model.eval()(ids)


@pytest.mark.parametrize(("tied", "shard"), [(False, None), (True, None), (False, "40KB")])
def test_a_transformers_llama_folder_scores_as_growlms_llama(tmp_path, tied, shard):
    folder = make_llama_folder(tmp_path / "llama", tied=tied, max_shard_size=shard)
    m = load(folder)
    assert m.kind == "transformers" and type(m.model).__name__ == "LlamaForCausalLM"
    assert isinstance(m.config, LlamaConfig) and m.config.tie_word_embeddings == tied and m.config.n_kv_head == 2
    assert (m.tokenizer.eot_token, m.tokenizer.eot_token_id, m.tokenizer.vocab_size) == ("</s>", 1, 300)
    ids = torch.tensor([m.tokenizer.encode("The tempest rose over the island, and the ship was lost.")[:32]])
    with torch.no_grad():
        theirs = m.logits_fn(ids)
    ours = growlm_logits(folder, m.config, ids)
    assert theirs.shape == (1, ids.shape[1], 300)
    assert float((theirs - ours).abs().max()) < 1e-5
    assert float(theirs.std()) > 1.0  # far from uniform: a wrong weight would show


def refused(capsys, folder: Path, *needles: str) -> str:
    capsys.readouterr()
    assert eval_cli.main([str(folder), "--sets", "heldout", "--no_progress"]) == 2
    line = one_error_line(capsys.readouterr().err, "growlm-eval")
    for n in needles:
        assert n in line, line
    return line


@pytest.mark.bad_input
def test_growlm_eval_refuses_what_it_cannot_score_exactly(capsys, tmp_path):
    folder = make_llama_folder(tmp_path / "llama", max_shard_size="40KB")
    cfg = json.loads((folder / "config.json").read_text())
    scaling = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8}
    (folder / "config.json").write_text(json.dumps(cfg | {"rope_scaling": scaling}))
    refused(capsys, folder, "rope type 'yarn'", "growlm computes default, linear, llama3")
    (folder / "config.json").write_text(json.dumps(cfg | {"mlp_bias": True}))
    refused(capsys, folder, "attention_bias / mlp_bias")
    (folder / "config.json").write_text(json.dumps(cfg))
    shard = sorted(folder.glob("model-*.safetensors"))[3]
    shard.write_bytes(shard.read_bytes()[:100])
    refused(capsys, folder, f"{folder}: {shard.name} is 100 bytes", "copy the whole file again")
    other = shutil.copytree(folder, tmp_path / "other", ignore=shutil.ignore_patterns("*.safetensors*"))
    (other / "pytorch_model.bin").write_bytes(b"a pickle, never opened")
    refused(capsys, other, "holds its weights only as pytorch_model.bin, a pickle", "LlamaForCausalLM.from_pretrained")
