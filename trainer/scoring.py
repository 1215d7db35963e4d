"""Token scoring: the summed negative log-likelihood of a token sequence under a causal LM, with an explicit context
and stride (sliding window, nothing dropped), windows shared among data-parallel ranks; and the one check of token ids
against a model's vocabulary that every scorer makes, with the error an evaluation raises for bad input.

The trainer's held-out evaluation (trainer.evaluation) scores with ``token_nll``; growlm-eval (eval.metrics: document
and word perplexity, cloze) builds on it and on ``check_token_ids`` / ``checked_logits``.

For a text of N tokens t_0 .. t_{N-1}, every token t_1 .. t_{N-1} is predicted exactly once (N - 1 predictions).
Window w feeds tokens [b_w, e_w) (at most ``context`` of them) and scores only the targets not scored by an
earlier window, so each prediction sees at least ``context - stride`` tokens of context (except near the start).
Perplexity = exp(total NLL / predicted tokens). Definitions: DESIGN.md, section Evaluation (the seeds' mistakes were a
dropped tail and train-mode dropout; here the caller's model must be in eval mode and gradients are off).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm


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


STOP_CHECK_EVERY = 1  # forward calls between two stop checks of ``token_nll`` (a collective each): a slow batch
# (seconds on a loaded CPU) times this must stay well inside a launcher's grace before SIGKILL (DeepSpeed's: 30 s)


class EvalStopped(Exception):
    """``token_nll``'s ``stop_check`` asked it to stop; ``signum`` is the signal the ranks agreed on."""

    def __init__(self, signum: int):
        super().__init__(f"stopped for signal {signum}")
        self.signum = signum


@dataclass(frozen=True)
class Window:
    """Input tokens [begin, end) of the text; the last ``n_target`` of their next-token targets are scored."""

    begin: int
    end: int
    n_target: int


def sliding_windows(n_tokens: int, context: int, stride: int) -> list[Window]:
    """Windows covering every prediction of an N-token text once.

    Args:
        n_tokens: N, length of the text in tokens (>= 2).
        context: longest window T (tokens fed to the model).
        stride: tokens the window advances by, 1 <= stride <= context.

    Raises:
        ValueError: the text is shorter than 2 tokens, or stride is not in [1, context].
    """
    if n_tokens < 2:
        raise ValueError(f"a text of {n_tokens} token(s) has nothing to predict; give at least 2 tokens")
    if not 1 <= stride <= context:
        raise ValueError(f"stride={stride} must be in [1, context={context}]")
    windows, scored_to, begin = [], 0, 0  # scored_to: predictions of targets t_1 .. t_{scored_to} are done
    while scored_to < n_tokens - 1:
        end = min(begin + context, n_tokens - 1)
        windows.append(Window(begin, end, end - scored_to))
        scored_to, begin = end, begin + stride
    return windows


@dataclass(frozen=True)
class NLL:
    """Summed negative log-likelihood (nats) over ``n_tokens`` predictions."""

    total_nll: float
    n_tokens: int

    @property
    def loss(self) -> float:
        """Mean NLL per predicted token (nats)."""
        return self.total_nll / self.n_tokens

    @property
    def perplexity(self) -> float:
        """exp(mean NLL per token)."""
        return math.exp(self.loss)


def checked_logits(
    logits_fn: Callable[[Tensor], Tensor], x: Tensor, vocab_size: int | None = None, tokenizer: str | None = None
) -> Tensor:
    """``logits_fn(x)`` (x: ids (B, T) int64 -> logits (B, T, V)), with ids that do not fit the model reported as an
    EvalInputError naming the tokenizer/model mismatch, never as an IndexError from the embedding lookup.

    With ``vocab_size`` the ids are checked before the call; without it V is the logits' width, and an IndexError
    of the call itself (an id >= V, or a window longer than n_positions) is reported the same way.

    Raises:
        EvalInputError: an id outside [0, V), or the model raised IndexError on the input.
    """
    if vocab_size is not None:
        check_token_ids(x.flatten().cpu().numpy(), vocab_size, tokenizer)
    try:
        logits = logits_fn(x)
    except IndexError as e:
        raise EvalInputError(
            f"the model could not take the input (IndexError: {e}): a token id (the largest is {int(x.max())}) "
            f"outside its vocabulary, i.e. a tokenizer that is not the model's, or a window of {x.shape[-1]} tokens "
            "longer than its n_positions; score with the model's own tokenizer (--tokenizer) and --context <= "
            "n_positions"
        ) from e
    if x.numel() and int(x.max()) >= logits.shape[-1]:
        raise token_id_error(int(x.max()), logits.shape[-1], tokenizer)
    return logits


def _batches(windows: list[Window], batch_size: int) -> list[list[Window]]:
    """Consecutive windows of equal length, at most batch_size per batch."""
    out: list[list[Window]] = []
    for w in windows:
        if out and len(out[-1]) < batch_size and out[-1][0].end - out[-1][0].begin == w.end - w.begin:
            out[-1].append(w)
        else:
            out.append([w])
    return out


@torch.no_grad()
def token_nll(
    logits_fn: Callable[[Tensor], Tensor],
    tokens: np.ndarray,
    context: int,
    stride: int | None = None,
    batch_size: int = 8,
    *,
    rank: int = 0,
    world_size: int = 1,
    all_reduce_sum: Callable[[Tensor], Tensor] | None = None,
    device: torch.device | str = "cpu",
    progress: bool = False,
    vocab_size: int | None = None,
    stop_check: Callable[[], int] | None = None,
) -> NLL:
    """Total NLL of a token sequence under a causal LM, windows shared among data-parallel ranks.

    Args:
        logits_fn: maps input ids (B, T) int64 to logits (B, T, V); e.g. an eval-mode GPT or DeepSpeed engine.
        tokens: the text as token ids, 1-D (N,).
        context: window length T (<= the model's n_positions).
        stride: window step; None means ``context`` (non-overlapping windows).
        batch_size: windows per forward call.
        rank, world_size: this rank takes windows rank, rank + world_size, ...; every rank makes the same number
            of forward calls (padding with a zero-weight batch), as ZeRO-3 requires.
        all_reduce_sum: sums a float64 tensor over ranks in place and returns it (needed when world_size > 1).
        device: where inputs are placed.
        progress: show a tqdm bar.
        vocab_size: the model's V; when given, every id is checked against it before the first forward call (else
            each batch's ids are checked against the logits' width, see ``checked_logits``).
        stop_check: called before the first forward call and every ``STOP_CHECK_EVERY`` calls after, at the same
            calls on every rank (so it may be a collective): a non-zero return (a signal number) stops the scoring.

    Returns:
        NLL summed over all N - 1 predictions of the text (all ranks get the same value).

    Raises:
        ValueError: see ``sliding_windows``; world_size > 1 without all_reduce_sum.
        EvalInputError: a token id outside the model's vocabulary (the tokenizer is not the model's).
        EvalStopped: ``stop_check`` returned a signal number (on every rank at the same call).
    """
    if world_size > 1 and all_reduce_sum is None:
        raise ValueError("world_size > 1 needs all_reduce_sum to combine the ranks' sums")
    if vocab_size is not None:
        check_token_ids(np.asarray(tokens), vocab_size)
    windows = sliding_windows(len(tokens), context, stride or context)
    per_rank = [_batches(windows[r::world_size], batch_size) for r in range(world_size)]
    n_calls = max(len(b) for b in per_rank)
    mine = per_rank[rank]
    total = torch.zeros(2, dtype=torch.float64)  # (nll, count)
    iterator = range(n_calls)
    if progress:
        iterator = tqdm(iterator, desc="eval", leave=False)
    for i in iterator:
        if stop_check is not None and i % STOP_CHECK_EVERY == 0 and (signum := stop_check()):
            raise EvalStopped(signum)
        batch, weight = (mine[i], 1.0) if i < len(mine) else (mine[0] if mine else per_rank[0][0], 0.0)
        rows = np.stack([np.asarray(tokens[w.begin : w.end + 1], dtype=np.int64) for w in batch])
        rows = torch.from_numpy(rows).to(device)  # (B, T + 1)
        x, y = rows[:, :-1], rows[:, 1:].clone()
        for j, w in enumerate(batch):
            y[j, : (w.end - w.begin) - w.n_target] = -100  # context-only positions: scored by an earlier window
        logits = checked_logits(logits_fn, x)  # ids checked against vocab_size above, when given
        if int(y.max()) >= logits.shape[-1]:  # the text's last token is a target only
            raise token_id_error(int(y.max()), logits.shape[-1])
        nll = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum")
        total += weight * torch.tensor([nll.item(), float((y != -100).sum())], dtype=torch.float64)
    if world_size > 1:
        total = all_reduce_sum(total)
    return NLL(total_nll=float(total[0]), n_tokens=int(round(float(total[1]))))
