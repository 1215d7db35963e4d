"""growlm-eval: perplexity against transformers, window edge cases, the cloze builder and scorer, DeepSpeed checkpoints
of every ZeRO stage (2 real ranks) against their exported transformers folder, and bad input."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch

from growlm.data.tokenizer import gpt2
from growlm.eval.metrics.cloze import ClozeItem, build_cloze, read_lambada, score_cloze
from growlm.eval.metrics.perplexity import document_nll, word_count, word_perplexity
from growlm.model.config import GPTConfig
from growlm.model.gpt2.hf import to_hf
from growlm.model.gpt2.model import GPT
from growlm.trainer.scoring import EvalInputError


def tiny_pair(n_positions: int = 16, vocab: int = 97):
    torch.manual_seed(0)
    ours = GPT(GPTConfig(n_layer=2, n_embd=32, n_head=2, n_positions=n_positions, vocab_size=vocab)).eval()
    return ours, to_hf(ours)


@pytest.mark.parametrize("length", [3, 15, 16, 31, 47, 50])  # shorter than T, exactly T - 1 / 2T - 1 / 3T - 1, tail
def test_document_nll_equals_transformers_loss_on_the_same_windows(length):
    ours, hf = tiny_pair()
    doc = np.random.default_rng(length).integers(1, 97, size=length).tolist()
    got = document_nll(ours, [doc], context=16, stride=16, bos_token_id=0)
    ids = torch.tensor([0, *doc])[None]  # every doc token is predicted, the first from the bos token
    direct = 0.0
    with torch.no_grad():  # non-overlapping chunks of T predictions, scored from HF's logits, the tail included
        for b in range(0, ids.shape[1] - 1, 16):
            chunk = ids[:, b : b + 17]  # T + 1 tokens: T inputs, T next-token targets
            logits = hf(chunk[:, :-1]).logits[0].double()
            direct += torch.nn.functional.cross_entropy(logits, chunk[0, 1:], reduction="sum").item()
    assert got.n_tokens == length
    assert got.total_nll == pytest.approx(direct, rel=1e-5)


def test_overlapping_stride_and_several_documents_add_up():
    ours, _ = tiny_pair()
    docs = [np.random.default_rng(i).integers(1, 97, size=n).tolist() for i, n in enumerate((5, 40, 17))]
    one = document_nll(ours, docs, context=16, stride=5, bos_token_id=0)
    parts = [document_nll(ours, [d], context=16, stride=5, bos_token_id=0) for d in docs]
    assert one.n_tokens == 62 and one.total_nll == pytest.approx(sum(p.total_nll for p in parts), rel=1e-9)
    with pytest.raises(ValueError, match="empty"):
        document_nll(ours, [[], []], context=16, bos_token_id=0)


def test_word_perplexity_counts_whitespace_words():
    assert word_count("  the cat\nsat\t on  ") == 4
    from growlm.trainer.scoring import NLL

    assert word_perplexity(NLL(8.0, 10), 4) == pytest.approx(math.exp(2.0))
    with pytest.raises(ValueError, match="at least one word"):
        word_perplexity(NLL(1.0, 1), 0)


def test_cloze_builder_keeps_only_targets_seen_in_the_context():
    filler = "The morning was grey and quiet over the small town by the river. "
    text = (
        filler * 3 + "She opened the old letter from her sister. "  # target "sister": not earlier -> dropped
        + filler * 3 + "He looked at the river. "  # target "river": in the passage -> kept
        + filler * 3 + "Nobody came to the Town!"  # "Town" with punctuation: matched case-insensitively -> kept
    )  # fmt: skip
    items = build_cloze(text, sentences_per_passage=(4,), min_context_words=5)
    targets = [it.target for it in items]
    assert "sister" not in targets and "letter" not in targets
    assert "river" in targets and "Town" in targets
    for it in items:
        assert re.search(rf"\b{it.target}\b", it.context, flags=re.IGNORECASE)  # seen, as a whole word
        assert not it.context.endswith(" ")


def test_cloze_scores_whole_words_only():
    tok = gpt2()
    item = ClozeItem("We sailed to the island of", "Zanzibar")  # several BPE tokens
    ctx, tgt = tok.encode(item.context), tok.encode(" Zanzibar")
    assert len(tgt) > 1
    seq = ctx + tgt

    def oracle(wrong_last: bool):
        def logits_fn(x):
            out = torch.zeros(*x.shape, tok.vocab_size)
            for i in range(x.shape[1]):
                nxt = seq[i + 1]
                if wrong_last and i + 1 == len(seq) - 1:
                    nxt = (nxt + 1) % tok.vocab_size
                out[:, i, nxt] = 10.0
            return out

        return logits_fn

    right = score_cloze(oracle(False), [item], tok, context=64)
    wrong = score_cloze(oracle(True), [item], tok, context=64)
    assert (right.n_correct, wrong.n_correct) == (1, 0)  # one wrong sub-token makes the whole word wrong
    assert right.n_target_tokens == len(tgt)
    with pytest.raises(EvalInputError, match="no cloze items"):
        score_cloze(oracle(False), [], tok, context=64)


def test_read_lambada_splits_on_the_last_space(tmp_path):
    f = tmp_path / "lambada_test.jsonl"
    f.write_text(json.dumps({"text": "he gave her the ring and said ring"}) + "\n\n")
    assert read_lambada(f) == [ClozeItem("he gave her the ring and said", "ring")]
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(EvalInputError, match="no passage"):
        read_lambada(tmp_path / "empty.jsonl")
