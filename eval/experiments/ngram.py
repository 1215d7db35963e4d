"""Count-based reference losses for the experiment's report: unigram and bigram validation loss (nats/token) of a
token folder, the levels below which a language model has learned more than token and token-pair frequencies.

Unigram: add-one counts. Bigram: P(b | a) = lam * count(a, b) / count(a) + (1 - lam) * P_unigram(b) (Jelinek-
Mercer interpolation), lam chosen on a grid by the loss on the last 5% of the training tokens given (counts from the
first 95%), then counts refitted on all of them. Neither uses the validation tokens for fitting.
"""

from __future__ import annotations

import numpy as np


def _unigram(train: np.ndarray, vocab: int) -> np.ndarray:
    counts = np.bincount(train, minlength=vocab).astype(np.float64) + 1.0
    return counts / counts.sum()


def _bigram_nll(train: np.ndarray, evals: np.ndarray, vocab: int, lams: tuple[float, ...]) -> list[float]:
    """Mean -log P(b | a) over the pairs of ``evals`` with counts from ``train`` (nats/token), one per lambda."""
    uni = _unigram(train, vocab)
    codes = train[:-1].astype(np.int64) * vocab + train[1:]
    keys, counts = np.unique(codes, return_counts=True)
    ctx = np.bincount(train[:-1], minlength=vocab).astype(np.float64)
    q = evals[:-1].astype(np.int64) * vocab + evals[1:]
    pos = np.clip(np.searchsorted(keys, q), 0, len(keys) - 1)
    pair = np.where(keys[pos] == q, counts[pos], 0).astype(np.float64)
    c = ctx[evals[:-1]]
    p_bi = np.divide(pair, c, out=np.zeros_like(pair), where=c > 0)
    out = []
    for lam in lams:
        lam_eff = np.where(c > 0, lam, 0.0)
        out.append(float(-np.mean(np.log(lam_eff * p_bi + (1 - lam_eff) * uni[evals[1:]]))))
    return out


def ngram_losses(train: np.ndarray, val: np.ndarray, vocab: int) -> dict[str, float]:
    """{"unigram": nats/token, "bigram": nats/token, "bigram_lambda": lam} on ``val`` from counts of ``train``
    (int token ids < vocab, 1-D).

    Raises:
        ValueError: fewer than 100 training or 2 validation tokens.
    """
    if len(train) < 100 or len(val) < 2:
        raise ValueError(f"need >= 100 training and >= 2 validation tokens, have {len(train)} and {len(val)}")
    train = np.asarray(train, dtype=np.int64)
    val = np.asarray(val, dtype=np.int64)
    cut = int(len(train) * 0.95)
    lams = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
    held = _bigram_nll(train[:cut], train[cut:], vocab, lams)
    lam = lams[int(np.argmin(held))]
    uni = _unigram(train, vocab)
    return {"unigram": float(-np.mean(np.log(uni[val]))), "bigram": _bigram_nll(train, val, vocab, (lam,))[0],
            "bigram_lambda": lam}  # fmt: skip
