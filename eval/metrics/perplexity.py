"""Document and word perplexity for growlm-eval: each document scored alone from its start token with
``trainer.scoring.token_nll`` (the sliding-window scorer training uses too), and word-level perplexity over the
original text's whitespace-separated words. Definitions: DESIGN.md, section Evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from torch import Tensor
from tqdm import tqdm

from growlm.trainer.scoring import NLL, check_token_ids, token_nll


def word_count(text: str) -> int:
    """Words of a text for word-level perplexity: maximal runs of non-whitespace (``len(text.split())``), counted on
    the original text before tokenization, as WikiText's word-level numbers count space-separated tokens."""
    return len(text.split())


def word_perplexity(nll: NLL, n_words: int) -> float:
    """exp(total NLL / words of the original text) (DESIGN.md, section Evaluation); the NLL must cover every token
    of the text.

    Raises:
        ValueError: n_words < 1.
    """
    if n_words < 1:
        raise ValueError(f"word-level perplexity needs at least one word, got {n_words}")
    return math.exp(nll.total_nll / n_words)


def document_nll(
    logits_fn: Callable[[Tensor], Tensor],
    documents: list[list[int]],
    context: int,
    stride: int | None = None,
    batch_size: int = 8,
    *,
    bos_token_id: int,
    progress: bool = False,
    vocab_size: int | None = None,
) -> NLL:
    """Summed NLL of several documents, each scored alone as ``[bos] + tokens`` so that every token of every
    document is predicted once (the first from the end-of-text token, as GPT-2 starts a document).

    ``vocab_size``: the model's V; every id (bos included) is checked against it before the first forward call.

    Raises:
        ValueError: no document has a token.
        EvalInputError: a token id outside the model's vocabulary (the tokenizer is not the model's).
    """
    docs = [d for d in documents if len(d)]
    if not docs:
        raise ValueError("no document has any token; the eval text is empty")
    if vocab_size is not None:
        check_token_ids([[bos_token_id], *docs], vocab_size)
    total, count = 0.0, 0
    iterator = docs
    if progress:
        iterator = tqdm(docs, desc="documents", leave=False)
    for d in iterator:
        ids = np.asarray([bos_token_id, *d], dtype=np.int64)
        r = token_nll(logits_fn, ids, context, stride, batch_size, vocab_size=vocab_size)
        total, count = total + r.total_nll, count + r.n_tokens
    return NLL(total, count)
