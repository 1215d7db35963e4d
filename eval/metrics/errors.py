"""The error an evaluation raises for bad input (model, eval set, window sizes, or a tokenizer that does not fit the
model), and the one check of token ids against a model's vocabulary that every scorer makes."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class EvalInputError(ValueError):
    """Bad input to an evaluation (model, eval file, window sizes, tokenizer/model mismatch); the message names the fix.

    Problems inside a user's eval file are ``data.text.InputError`` (``FILE:LINE: problem; fix``) and a tokenizer
    that cannot be loaded is ``data.tokenizer.TokenizerError``; growlm-eval reports all three the same way (exit
    status 2, one line).
    """


def token_id_error(token_id: int, vocab_size: int, tokenizer: str | None = None) -> EvalInputError:
    """The EvalInputError for a token id outside [0, vocab_size): the tokenizer is not the model's."""
    who = f"the tokenizer ({tokenizer})" if tokenizer else "the tokenizer"
    return EvalInputError(
        f"token id {token_id} is outside the model's vocabulary [0, {vocab_size}): {who} does not match the model "
        "(tokenizer/model mismatch); score with the model's own tokenizer: growlm-eval reads it from an export's "
        "tokenizer.json or from the token folder the checkpoint was trained on, or give it with --tokenizer gpt2, "
        "--tokenizer TOKENIZER.json or --tokenizer DATA_DIR"
    )


def check_token_ids(ids: np.ndarray | Iterable[Iterable[int]], vocab_size: int, tokenizer: str | None = None) -> None:
    """Check that every id is in [0, vocab_size) before a model sees it.

    Args:
        ids: a 1-D id array (any integer dtype, e.g. a uint16 memmap) or a list of id lists (documents, items).
        vocab_size: V, the model's vocabulary (rows of its embedding).
        tokenizer: the tokenizer's name, for the message.

    Raises:
        EvalInputError: an id >= V or < 0 (``token_id_error``).
    """
    if isinstance(ids, np.ndarray):
        parts = [ids]
    else:
        parts = [np.asarray(x, dtype=np.int64) for x in ids]
    for a in parts:
        if a.size and (int(a.max()) >= vocab_size or int(a.min()) < 0):
            bad = int(a.max()) if int(a.max()) >= vocab_size else int(a.min())
            raise token_id_error(bad, vocab_size, tokenizer)
