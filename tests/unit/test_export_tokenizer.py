"""An exported model is self-sufficient: ``growlm-grow CKPT --export_hf DIR`` carries the model's own tokenizer (GPT-2
BPE, or the trained tokenizer.json of a small-vocabulary run), ``transformers.AutoTokenizer`` loads it offline,
``growlm-eval DIR`` scores exactly as on the checkpoint, every scorer refuses token ids outside the model's
vocabulary with EvalInputError, and every written file follows the umask."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from growlm.data import tokenizer as tok
from growlm.data.prepare import builtin_corpus_files
from growlm.data.small_vocab import train_tokenizer
from growlm.data.text import read_text
from growlm.eval.metrics.cloze import ClozeItem, score_cloze
from growlm.eval.metrics.perplexity import document_nll
from growlm.model.config import GPTConfig
from growlm.model.gpt2.model import GPT
from growlm.trainer.scoring import EvalInputError, token_nll

SMALL_V = 320
MISMATCH = "tokenizer/model mismatch"


def heldout_text(chars: int = 6000) -> str:
    _, val = builtin_corpus_files()
    return read_text(val[0])[20000 : 20000 + chars]


# ----- the tokenizer files ------------------------------------------------------------------------------------------


def test_gpt2_tokenizers_json_encodes_exactly_as_tiktoken(tmp_path):
    """The tokenizer.json built from data/gpt2_bpe gives tiktoken's ids on held-out and training text and on
    special-token strings (encoded as text by both)."""
    t = tok.gpt2()
    (tmp_path / "tokenizer.json").write_text(t.tokenizers_json())
    other = tok.from_file(tmp_path / "tokenizer.json")
    assert (other.vocab_size, other.eot_token_id) == (50257, 50256)
    train, val = builtin_corpus_files()
    texts = [read_text(p) for p in [*val, train[0]]]
    texts += ["Hello world", "a <|endoftext|> b", "  spaces\n\n\ttab 'll 'S émoji 🤖", "x\r\ny"]
    for text in texts:
        assert other.encode(text) == t.encode(text)
    assert other.encode("Hello world") == [15496, 995]


@pytest.mark.parametrize("kind", ["gpt2", "small"])
def test_save_hf_is_loaded_by_autotokenizer_offline(tmp_path, kind, monkeypatch):
    from transformers import AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if kind == "gpt2":
        t = tok.gpt2()
    else:
        train_tokenizer([heldout_text(20000)], SMALL_V).save(str(tmp_path / "trained.json"))
        t = tok.from_file(tmp_path / "trained.json")
    out = tmp_path / "hf"
    out.mkdir()
    t.save_hf(out, model_max_length=128)
    assert sorted(p.name for p in out.iterdir()) == sorted(tok.HF_TOKENIZER_FILES)
    hf = AutoTokenizer.from_pretrained(str(out))
    text = heldout_text(2000)
    assert hf(text)["input_ids"] == t.encode(text)
    assert hf.eos_token_id == t.eot_token_id and hf.model_max_length == 128
    back = tok.from_hf_dir(out)
    assert back.encode(text) == t.encode(text) and back.eot_token_id == t.eot_token_id


# ----- every scorer checks ids against the model's vocabulary -----------------------------------------------------


@pytest.mark.bad_input
def test_every_scorer_refuses_ids_outside_the_vocabulary():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_embd=32, n_head=2, n_positions=16, vocab_size=97)).eval()
    g = tok.gpt2()  # ids up to 50256 for a 97-token model
    ids = g.encode("The tempest rose over the island.")
    assert max(ids) >= 97
    for v in (97, None):  # with the model's vocab_size: before any forward; without: from the logits / IndexError
        with pytest.raises(EvalInputError, match=MISMATCH if v else "tokenizer"):
            token_nll(model, np.asarray(ids), context=8, vocab_size=v)
        with pytest.raises(EvalInputError, match=MISMATCH if v else "tokenizer"):
            document_nll(model, [ids], context=8, bos_token_id=0, vocab_size=v)
        with pytest.raises(EvalInputError, match=MISMATCH if v else "tokenizer"):
            score_cloze(model, [ClozeItem("The tempest rose over the", "island")], g, context=16, vocab_size=v)
    ok = [i % 97 for i in ids]  # the last token alone out of range: a target, never an input
    with pytest.raises(EvalInputError, match=MISMATCH):
        token_nll(model, np.asarray([*ok, 500]), context=8)
    assert token_nll(model, np.asarray(ok), context=8, vocab_size=97).n_tokens == len(ok) - 1


# ----- end to end: train, export, evaluate ------------------------------------------------------------------------
