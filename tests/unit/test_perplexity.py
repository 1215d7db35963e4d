"""Sliding-window perplexity: every token predicted once, and equal to a direct computation with transformers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from growlm.model.config import GPTConfig
from growlm.model.gpt2.hf import to_hf
from growlm.model.gpt2.model import GPT
from growlm.trainer.scoring import STOP_CHECK_EVERY, EvalStopped, sliding_windows, token_nll


@pytest.mark.parametrize("n, context, stride", [(2, 8, 8), (9, 8, 8), (17, 8, 8), (100, 8, 3), (5, 8, 1), (33, 8, 4)])
def test_windows_predict_every_token_exactly_once(n, context, stride):
    predicted = []
    for w in sliding_windows(n, context, stride):
        assert w.end - w.begin <= context and 1 <= w.n_target <= w.end - w.begin
        predicted += list(range(w.end - w.n_target + 1, w.end + 1))  # target indices scored by this window
    assert predicted == list(range(1, n))


def test_window_errors():
    with pytest.raises(ValueError, match="nothing to predict"):
        sliding_windows(1, 8, 8)
    with pytest.raises(ValueError, match="stride=9"):
        sliding_windows(100, 8, 9)


@pytest.mark.parametrize("stride", [16, 5])
def test_token_nll_equals_direct_transformers_computation(stride):
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_embd=32, n_head=2, n_positions=16, vocab_size=97)
    ours = GPT(cfg).eval()
    hf = to_hf(ours)
    tokens = np.random.default_rng(0).integers(0, 97, size=70).astype(np.uint16)
    got = token_nll(ours, tokens, context=16, stride=stride, batch_size=3)
    # direct: each target t_i (i >= 1) scored by HF with the same left context as the window that scores it
    total = 0.0
    with torch.no_grad():
        for w in sliding_windows(len(tokens), 16, stride):
            x = torch.tensor(tokens[w.begin : w.end + 1].astype(np.int64))[None]
            logp = torch.log_softmax(hf(x[:, :-1]).logits.double(), -1)[0]
            tgt = x[0, 1:]
            total -= sum(logp[j, tgt[j]].item() for j in range(len(tgt) - w.n_target, len(tgt)))
    assert got.n_tokens == len(tokens) - 1
    assert got.total_nll == pytest.approx(total, rel=1e-5)
    assert got.perplexity == pytest.approx(math.exp(total / (len(tokens) - 1)), rel=1e-5)


def test_ranks_split_windows_and_sum_to_the_single_rank_value():
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=1, n_embd=32, n_head=2, n_positions=8, vocab_size=50)).eval()
    tokens = np.random.default_rng(1).integers(0, 50, size=61).astype(np.uint16)
    single = token_nll(m, tokens, context=8, batch_size=2)
    parts = [
        token_nll(m, tokens, context=8, batch_size=2, rank=r, world_size=3, all_reduce_sum=lambda t: t)
        for r in range(3)
    ]
    assert sum(p.n_tokens for p in parts) == single.n_tokens == 60
    assert sum(p.total_nll for p in parts) == pytest.approx(single.total_nll, rel=1e-6)  # fp32 sums in another order


def test_a_stop_check_runs_before_every_forward_call_and_ends_the_scoring():
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=1, n_embd=32, n_head=2, n_positions=8, vocab_size=50)).eval()
    tokens = np.random.default_rng(1).integers(0, 50, size=161).astype(np.uint16)
    calls, forwards = [], []

    def model(x):
        forwards.append(len(x))
        return m(x)

    def never() -> int:
        calls.append(len(forwards))
        return 0

    plain = token_nll(m, tokens, context=8, batch_size=1)  # 20 windows, 20 forward calls
    assert token_nll(model, tokens, context=8, batch_size=1, stop_check=never) == plain
    assert calls == list(range(0, 20, STOP_CHECK_EVERY)) and STOP_CHECK_EVERY == 1  # before every call
    forwards.clear()
    with pytest.raises(EvalStopped) as e:
        token_nll(model, tokens, context=8, batch_size=1, stop_check=lambda: 15 if len(forwards) >= 8 else 0)
    assert e.value.signum == 15 and len(forwards) == 8  # stopped at the check before the 9th call
