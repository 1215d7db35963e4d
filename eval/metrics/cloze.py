"""Last-word prediction in the LAMBADA style (Paperno et al. 2016, arXiv 1606.06031), scored on whole words.

An item is a context and a target word; the model sees the context and must produce the target: it counts as
correct only if **every** BPE token of ``" " + word`` is the greedy (argmax) prediction given the context and the
target's earlier tokens (DESIGN.md, section Evaluation). The target's NLL is summed too (last-word perplexity per word).

Two sources of items:
* ``build_cloze(text)``: a home-made cloze from held-out prose (DESIGN.md, section Evaluation, "Cloze"): passages of
  4-6 consecutive sentences (one passage ends at every sentence); the final word of the last sentence is the
  target (trailing punctuation dropped); only targets that also occur, as a whole word, earlier in the passage are
  kept (LAMBADA's own filter, which makes the word guessable from the passage). A proxy, **not** LAMBADA.
* ``read_lambada(path)``: a real LAMBADA file (``lambada_test.jsonl`` with one ``{"text": ...}`` per line, or a
  plain text file with one passage per line), split the standard way: the target is the last space-separated
  word, the context everything before that space (as GPT-2 / lm-evaluation-harness score it).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from growlm.data.text import InputError, read_json_rows, read_lines
from growlm.data.tokenizer import Tokenizer
from growlm.trainer.scoring import EvalInputError, check_token_ids, checked_logits, token_id_error

_SENTENCE_END = re.compile(r"(?<=[.!?])[\"'\u201d\u2019)\]]*\s+")
_FINAL_WORD = re.compile(r"([A-Za-z]+(?:'[A-Za-z]+)?)[^A-Za-z0-9]*$")


@dataclass(frozen=True)
class ClozeItem:
    """One LAMBADA-style item: a passage and its last word, which also occurs earlier in the passage."""

    context: str  # text before the target, without the separating space
    target: str  # the word; scored as " " + target


def split_sentences(text: str) -> list[str]:
    """Sentences of a text: whitespace (hard wraps included) collapsed, split after . ! ? and closing quotes."""
    flat = re.sub(r"\s+", " ", text).strip()
    return [s.strip() for s in _SENTENCE_END.split(flat) if s.strip()]


def build_cloze(
    text: str, sentences_per_passage: tuple[int, ...] = (4, 5, 6), min_context_words: int = 20
) -> list[ClozeItem]:
    """LAMBADA-style items from held-out prose (rules in the module docstring).

    Every sentence ends one passage: it and the sentences before it, n of them in all, with n cycling through
    ``sentences_per_passage`` (4, 5, 6, 4, ...) along the text, so the set is a pure function of the text; passages
    overlap, targets do not (each sentence's last word is a target at most once). A passage is skipped when
    its last sentence does not end in a word, the context has fewer than ``min_context_words`` words, or the
    target does not occur earlier in the passage (whole word, case-insensitive).
    """
    sents = split_sentences(text)
    items = []
    for end in range(len(sents)):
        n = sentences_per_passage[end % len(sentences_per_passage)]
        if end + 1 < n:
            continue
        passage = " ".join(sents[end + 1 - n : end + 1])
        m = _FINAL_WORD.search(passage)
        if m is None:
            continue
        target, context = m.group(1), passage[: m.start(1)].rstrip()
        if len(context.split()) < min_context_words:
            continue
        if not re.search(rf"(?<![A-Za-z']){re.escape(target)}(?![A-Za-z'])", context, flags=re.IGNORECASE):
            continue
        items.append(ClozeItem(context, target))
    return items


def read_lambada(path: str | Path) -> list[ClozeItem]:
    """Items of a LAMBADA file: .jsonl/.json ({"text": ...} per row) or plain text (one passage per line), read by
    data/text.py (UTF-8, a leading BOM removed).

    Raises:
        EvalInputError: the file is missing or holds no passage.
        data.text.InputError: undecodable bytes, a row that is not an object or has no string "text", or a
            passage without a space between context and last word (each ``FILE:LINE: problem; fix``).
    """
    path = Path(path)
    if not path.is_file():
        raise EvalInputError(f"LAMBADA file {path} does not exist")
    if path.suffix in (".jsonl", ".json"):
        rows = read_json_rows(path, "text", 'a LAMBADA .jsonl file holds one {"text": "..."} object per line')
    else:
        rows = read_lines(path)
    items = []
    for n, line in rows:
        text = line.strip()
        if not text:
            continue
        if " " not in text:
            fix = "a passage needs a context and a last word separated by a space"
            raise InputError(path, n, f"the passage {text[:40]!r} has no space", fix)
        context, target = text.rsplit(" ", 1)
        items.append(ClozeItem(context, target))
    if not items:
        raise EvalInputError(f"LAMBADA file {path} holds no passage")
    return items


@dataclass(frozen=True)
class ClozeResult:
    """Whole-word last-word accuracy and the targets' NLL (nats) over a cloze set."""

    n_items: int
    n_correct: int
    target_nll: float  # summed over every target token (nats)
    n_target_tokens: int
    n_truncated: int  # items whose context was cut on the left to fit the model's context

    @property
    def accuracy(self) -> float:
        return self.n_correct / self.n_items

    def to_dict(self) -> dict:
        return {
            "n_items": self.n_items,
            "n_correct": self.n_correct,
            "accuracy": self.accuracy,
            "target_nll_per_word": self.target_nll / self.n_items,
            "target_nll_per_token": self.target_nll / self.n_target_tokens,
            "n_target_tokens": self.n_target_tokens,
            "n_truncated_contexts": self.n_truncated,
        }


@torch.no_grad()
def score_cloze(
    logits_fn: Callable[[Tensor], Tensor],
    items: list[ClozeItem],
    tokenizer: Tokenizer,
    context: int,
    batch_size: int = 16,
    progress: bool = False,
    vocab_size: int | None = None,
) -> ClozeResult:
    """Whole-word greedy accuracy and target NLL of ``items`` (see the module docstring).

    Each item is fed as ids(context) + ids(" " + target)[:-1], keeping the last ``context`` tokens (the context is
    cut on the left when it is longer), after the tokenizer's bos token where it puts one before each text
    (``Tokenizer.bos_token_id``), which stays first. Batches are right-padded; a causal model's logits at real
    positions do not depend on padding after them. ``vocab_size``: the model's V; every id is checked against it
    before the first forward call (without it, against the logits' width V, see ``checked_logits``).

    Raises:
        EvalInputError: no items, a target longer than ``context`` tokens, or a token id outside the model's
            vocabulary (the tokenizer is not the model's).
    """
    if not items:
        raise EvalInputError("no cloze items to score; the eval text is empty or too short")
    encoded, truncated = [], 0
    head = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]  # where the tokenizer starts texts so
    for it in items:
        c, t = tokenizer.encode(it.context), tokenizer.encode(" " + it.target)
        if len(t) + len(head) >= context:
            raise EvalInputError(f"target {it.target!r} has {len(t)} tokens, not fewer than context={context}")
        seq = head + (c + t)[-(context + 1 - len(head)) :]
        truncated += len(head) + len(c) + len(t) > context + 1
        encoded.append((seq, len(t)))
    if vocab_size is not None:
        check_token_ids([s for s, _ in encoded], vocab_size, tokenizer.name)
    correct, nll, n_tok = 0, 0.0, 0
    batches = [encoded[i : i + batch_size] for i in range(0, len(encoded), batch_size)]
    if progress:
        batches = tqdm(batches, desc="cloze", leave=False)
    for batch in batches:
        width = max(len(s) - 1 for s, _ in batch)
        x = torch.zeros(len(batch), width, dtype=torch.long)
        for j, (s, _) in enumerate(batch):
            x[j, : len(s) - 1] = torch.tensor(s[:-1])
        logp = F.log_softmax(checked_logits(logits_fn, x, tokenizer=tokenizer.name).float(), dim=-1)  # (B, T, V)
        top = max(max(s) for s, _ in batch)  # a target's last token is not an input
        if top >= logp.shape[-1]:
            raise token_id_error(top, logp.shape[-1], tokenizer.name)
        for j, (s, n_t) in enumerate(batch):
            pos = torch.arange(len(s) - 1 - n_t, len(s) - 1)  # positions predicting the target tokens
            tgt = torch.tensor(s[-n_t:])
            lp = logp[j, pos]  # (n_t, V)
            correct += bool((lp.argmax(-1) == tgt).all())
            nll -= float(lp.gather(1, tgt[:, None]).sum())
            n_tok += n_t
    return ClozeResult(len(items), correct, nll, n_tok, truncated)
