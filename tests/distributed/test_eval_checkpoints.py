"""growlm-eval: perplexity against transformers, window edge cases, the cloze builder and scorer, DeepSpeed checkpoints
of every ZeRO stage (2 real ranks) against their exported transformers folder, and bad input."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from dist_utils import run_ranks, write_ds_config

from growlm.eval.metrics import cli
from growlm.eval.metrics.cloze import build_cloze, score_cloze
from growlm.eval.metrics.load import load, load_deepspeed, load_transformers
from growlm.eval.metrics.perplexity import word_count
from growlm.model.gpt2.hf import to_hf
from growlm.trainer.scoring import EvalInputError

TEXT = (
    "It was a bright cold day in April, and the clocks were striking thirteen. Winston Smith, his chin nuzzled "
    "into his breast in an effort to escape the vile wind, slipped quickly through the glass doors of Victory "
    "Mansions, though not quickly enough to prevent a swirl of gritty dust from entering along with him."
)


class _Checkpoints(dict):
    """{ZeRO stage: tag folder} of a 2-rank, 3-step tiny run, trained on first use."""

    def __init__(self, root):
        super().__init__()
        self.root = root

    def __missing__(self, stage: int):
        ds = write_ds_config(self.root / f"z{stage}.json", f"zero{stage}_fp32", train_micro_batch_size_per_gpu=2)
        run = self.root / f"z{stage}"
        r = run_ranks(["--preset", "tiny", "--seq_len", "32", "--no_final_eval", "--ds_config", str(ds),
                                                                                                    "--max_steps", "3",
                       "--out_dir", str(run)])  # fmt: skip
        assert r.returncode == 0, r.stdout[-3000:]
        self[stage] = run / "checkpoints" / "global_step3"
        return self[stage]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, builtin_data):
    return _Checkpoints(tmp_path_factory.mktemp("eval_ckpt"))


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_checkpoint_of_every_zero_stage_scores_like_its_transformers_export(checkpoints, stage, tmp_path):
    m = load_deepspeed(checkpoints[stage])
    assert m.tokenizer.name == "gpt2" and m.config.n_layer == 2
    if stage in (1, 2):  # the module copy of ZeRO-1/2 holds the full weights: the merged partitions must equal it
        module = torch.load(checkpoints[stage] / "mp_rank_00_model_states.pt", weights_only=False)["module"]
        for k, v in m.model.state_dict().items():
            torch.testing.assert_close(v, module[k].float(), rtol=0, atol=0)
    to_hf(m.model).save_pretrained(tmp_path / "hf")
    h = load_transformers(tmp_path / "hf", "gpt2")  # a bare folder names no tokenizer: growlm-eval refuses to guess
    docs = {"a": TEXT, "b": TEXT[:40]}
    a = cli.perplexity_of(m, docs, context=32, stride=16, batch_size=4, progress=False)
    b = cli.perplexity_of(h, docs, context=32, stride=16, batch_size=4, progress=False)
    assert a["tokens"] == b["tokens"] and a["words"] == word_count(TEXT) + word_count(TEXT[:40])
    assert a["total_nll"] == pytest.approx(b["total_nll"], rel=1e-5)
    assert a["word_perplexity"] > a["token_perplexity"]  # more tokens than words
    items = build_cloze(TEXT * 3, sentences_per_passage=(2,), min_context_words=5)
    ca, cb = (score_cloze(x.logits_fn, items, x.tokenizer, context=64).to_dict() for x in (m, h))
    assert ca["n_correct"] == cb["n_correct"]
    assert ca["target_nll_per_word"] == pytest.approx(cb["target_nll_per_word"], rel=1e-5)


def test_cli_writes_json_for_files(checkpoints, tmp_path, capsys):
    wt, lam = tmp_path / "wiki.test.raw", tmp_path / "lambada.jsonl"
    wt.write_text(TEXT)
    lam.write_text(json.dumps({"text": TEXT}) + "\n")
    out = tmp_path / "res.json"
    rc = cli.main([str(checkpoints[2].parent.parent), "--sets", "", "--wikitext", str(wt), "--lambada",
                   str(lam), "--context", "64", "--out", str(out), "--no_progress"])  # fmt: skip
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["context"] == 64 and res["stride"] == 64  # non-overlapping windows, as train.py --eval_stride
    assert res["results"]["wikitext_file"]["words"] == word_count(TEXT)
    assert res["results"]["lambada_file"]["n_items"] == 1


@pytest.mark.bad_input
def test_bad_input_gives_clear_errors(checkpoints, tmp_path, capsys):
    ck = tmp_path / "ck" / "global_step3"
    shutil.copytree(checkpoints[2], ck)
    state = json.loads((ck / "growlm_state.json").read_text())
    bad = dict(state, model_config={**state["model_config"], "n_embd": 128})
    (ck / "growlm_state.json").write_text(json.dumps(bad))
    with pytest.raises(EvalInputError, match="the manifest says"):  # the manifest is checked first
        load(ck)
    (ck / "growlm_manifest.json").unlink()  # as a checkpoint from before manifests: the weights are checked
    with pytest.raises(EvalInputError, match=r"transformer.wte.weight, but its shape in the checkpoint's model config "
                       r"is \(50257, 128\): the shards belong to another model or are damaged"):  # fmt: skip
        load(ck)
    (ck / "growlm_state.json").write_text(json.dumps({k: v for k, v in state.items() if k != "model_config"}))
    with pytest.raises(EvalInputError, match="no 'model_config'"):
        load(ck)
    with pytest.raises(EvalInputError, match="not a growlm checkpoint"):
        load(tmp_path)
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    assert cli.main([str(checkpoints[0]), "--sets", "", "--wikitext", str(empty), "--no_progress"]) == 2
    assert "is empty" in capsys.readouterr().err
    assert cli.main([str(checkpoints[0]), "--sets", "heldout", "--context", "4096", "--no_progress"]) == 2
    assert "n_positions=128" in capsys.readouterr().err


def test_checkpoint_saved_mid_mask_ramp_scores_as_train_py_did(tmp_path, builtin_data):
    """A masked growth at step 2 ramping over 4 steps, saved at step 4 (ramp 0.5): the loaded model, masks rebuilt,
    must give the held-out loss train.py logged for the same tokens and windows."""
    from dist_utils import read_metrics

    from growlm.data.prepare import open_tokens
    from growlm.trainer.scoring import token_nll

    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "start: {preset: tiny}\nstages:\n  - name: deeper\n    target: {n_layer: 4}\n    family: masked\n"
        "    when: {step: 2}\n    ramp_steps: 4\n"
    )
    ds = write_ds_config(
        tmp_path / "ds.json", "zero2_fp32", train_micro_batch_size_per_gpu=2, scheduler_warmup_num_steps=2
    )
    r = run_ranks(["--growth_plan", str(plan), "--seq_len", "32", "--final_eval_tokens", "512", "--ds_config",
                   str(ds), "--max_steps", "4", "--out_dir", str(tmp_path / "run")])  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:]
    m = load(tmp_path / "run")
    assert m.config.n_layer == 4 and m.model.growth_masks is not None
    assert m.model.growth_masks.value(4) == pytest.approx(0.5)
    logged = [v for v in read_metrics(tmp_path / "run", "val") if v["step"] == 4][-1]
    ours = token_nll(m.logits_fn, open_tokens(builtin_data, "val")[:512], context=32)
    assert ours.loss == pytest.approx(logged["val_loss"], rel=1e-5)
