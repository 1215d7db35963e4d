"""growlm-eval: perplexity (token and word level) and LAMBADA-style last-word accuracy of a trained model.

    growlm-eval runs/default/checkpoints                 # a growlm DeepSpeed checkpoint (any ZeRO stage / world size)
    growlm-eval export/ --sets heldout,cloze             # an exported transformers folder; same numbers
    growlm-eval CKPT --wikitext wiki.test.raw --lambada lambada_test.jsonl --out results.json

Sets (``--sets``, default heldout,cloze,wikipedia):
  heldout    the built-in validation split (Persuasion, Hamlet, The Tempest): token and word perplexity
  cloze      LAMBADA-style whole-word accuracy on a cloze built from Persuasion (a proxy, not LAMBADA)
  wikipedia  the held-out articles of the gensim Wikipedia sample (``--wiki_split``; Wikipedia-style, not WikiText)
Files: ``--wikitext FILE`` is scored as one document (sliding window over the whole file; word perplexity over its
whitespace-separated words), ``--lambada FILE`` as LAMBADA (last space-separated word of each passage).
Perplexities use a sliding window of ``--context`` tokens advancing by ``--stride`` (every token predicted once);
word perplexity = exp(total NLL / whitespace-separated words of the original text).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from growlm.data.tokenizer import Tokenizer, TokenizerError, resolve
from growlm.eval.metrics.cloze import ClozeItem, build_cloze, read_lambada, score_cloze
from growlm.eval.metrics.load import LoadedModel, load
from growlm.eval.metrics.perplexity import document_nll, word_count, word_perplexity
from growlm.eval.metrics.textsets import cloze_source, heldout_documents, read_text_file, wikipedia_documents
from growlm.runtime.atomic import write_failed_message, write_text
from growlm.runtime.commands import HelpFormatter, add_version, interruptible
from growlm.trainer.scoring import EvalInputError, check_token_ids

SETS = ("heldout", "cloze", "wikipedia")
DEFAULT_SETS = ",".join(SETS)


def check_windows(m: LoadedModel, context: int | None, stride: int | None) -> tuple[int, int]:
    """(context, stride) with defaults context = n_positions, stride = context (non-overlapping, as train.py).

    Raises:
        EvalInputError: context > n_positions, or stride outside [1, context].
    """
    n_pos = m.config.n_positions
    context = n_pos if context is None else context  # 0 is refused, not taken for "the default"
    if not 2 <= context <= n_pos:
        raise EvalInputError(
            f"--context {context} must be in [2, n_positions={n_pos}] of this model ({m.config.shape_str()})"
        )
    stride = context if stride is None else stride
    if not 1 <= stride <= context:
        raise EvalInputError(f"--stride {stride} must be in [1, --context {context}]")
    return context, stride


def start_token(t: Tokenizer) -> int:
    """The id a scored document starts from: the tokenizer's bos token where it puts one before each text (as the
    model saw every document in pretraining: growlm-prepare starts each with it), else the end-of-text token."""
    return t.bos_token_id if t.bos_token_id is not None else t.eot_token_id


def perplexity_of(m: LoadedModel, docs: dict[str, str], context: int, stride: int, batch_size: int, progress: bool):
    """Token and word perplexity of a set of documents, each scored alone from its start token (``start_token``:
    the bos token where the tokenizer adds one, else end-of-text)."""
    ids = [m.tokenizer.encode(t) for t in docs.values()]
    if sum(len(x) for x in ids) < 1:
        raise EvalInputError("the eval text has no tokens")
    check_token_ids(ids, m.config.vocab_size, m.tokenizer.name)
    nll = document_nll(
        m.logits_fn,
        ids,
        context,
        stride,
        batch_size,
        bos_token_id=start_token(m.tokenizer),
        progress=progress,
        vocab_size=m.config.vocab_size,
    )
    words = sum(word_count(t) for t in docs.values())
    return {
        "documents": len(docs),
        "tokens": nll.n_tokens,
        "words": words,
        "loss": nll.loss,
        "token_perplexity": nll.perplexity,
        "word_perplexity": word_perplexity(nll, words),
        "total_nll": nll.total_nll,
    }


@dataclass(frozen=True)
class EvalFiles:
    """A user's eval files, read (data/text.py) and checked before any model is loaded."""

    wikitext: str | None = None  # path
    wikitext_text: str = ""
    lambada: str | None = None  # path
    lambada_items: tuple[ClozeItem, ...] = ()


def read_eval_files(wikitext: str | None, lambada: str | None) -> EvalFiles:
    """Read ``--wikitext`` (one document) and ``--lambada`` (passages).

    Raises:
        EvalInputError: a file is missing or empty.
        data.text.InputError: undecodable bytes or a bad row (``FILE:LINE: problem; fix``).
    """
    text = read_text_file(wikitext) if wikitext else ""
    items = tuple(read_lambada(lambada)) if lambada else ()
    return EvalFiles(wikitext, text, lambada, items)


def evaluate(
    m: LoadedModel,
    sets: list[str],
    *,
    context: int | None = None,
    stride: int | None = None,
    batch_size: int = 8,
    wiki_split: str = "test",
    files: EvalFiles = EvalFiles(),  # noqa: B008  (frozen, never mutated)
    max_cloze_items: int = 0,
    progress: bool = True,
    skip_missing_wikipedia: bool = False,
) -> dict[str, Any]:
    """Every requested metric of a loaded model as a JSON-safe dict (see the module docstring).

    ``skip_missing_wikipedia``: when the Wikipedia sample is not built, record it as skipped instead of failing
    (used for the default --sets; asking for it explicitly fails with the command that builds it).
    """
    if batch_size < 1:
        raise EvalInputError(f"--batch_size {batch_size} must be >= 1 (windows per forward pass)")
    unknown = [s for s in sets if s not in SETS]
    if unknown:
        raise EvalInputError(f"unknown eval set(s) {unknown}; choose from {', '.join(SETS)}")
    context, stride = check_windows(m, context, stride)
    out: dict[str, Any] = {
        "model": m.source,
        "format": m.kind,
        "config": m.config.to_dict(),
        "tokenizer": m.tokenizer.name,
        "context": context,
        "stride": stride,
        "results": {},
    }
    res = out["results"]
    for name in sets:
        t0 = time.perf_counter()
        if name == "heldout":
            res[name] = perplexity_of(m, heldout_documents(), context, stride, batch_size, progress)
        elif name == "wikipedia":
            try:
                docs = wikipedia_documents(wiki_split)
            except EvalInputError as e:
                if not skip_missing_wikipedia:
                    raise
                print(f"growlm-eval: skipping wikipedia: {e}", file=sys.stderr)
                res[name] = {"skipped": str(e)}
                continue
            res[name] = {"split": wiki_split} | perplexity_of(m, docs, context, stride, batch_size, progress)
        elif name == "cloze":
            items = build_cloze(cloze_source())
            items = items[:max_cloze_items] if max_cloze_items else items
            res[name] = {"source": "persuasion (held out), LAMBADA-style proxy"} | score_cloze(
                m.logits_fn, items, m.tokenizer, context, progress=progress, vocab_size=m.config.vocab_size
            ).to_dict()
        res[name]["seconds"] = round(time.perf_counter() - t0, 2)
    if files.wikitext:
        res["wikitext_file"] = {"path": files.wikitext} | perplexity_of(
            m, {"file": files.wikitext_text}, context, stride, batch_size, progress
        )
    if files.lambada:
        res["lambada_file"] = {"path": files.lambada} | score_cloze(
            m.logits_fn,
            list(files.lambada_items),
            m.tokenizer,
            context,
            progress=progress,
            vocab_size=m.config.vocab_size,
        ).to_dict()
    return out


def build_parser() -> argparse.ArgumentParser:
    """The growlm-eval argument parser."""
    p = argparse.ArgumentParser(
        prog="growlm-eval",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "model",
        help="growlm checkpoint (run folder, checkpoints folder or tag) or transformers folder (safetensors only). "
        "Its files are read with weights-only unpickling (growth.offline.weights); use checkpoints from a trusted "
        "source only all the same (growlm refuses any file holding more than tensor data and a few known types)",
    )
    p.add_argument("--sets", default=DEFAULT_SETS, help="comma-separated sets; '' for files only (default: all)")
    p.add_argument(
        "--tokenizer",
        default=None,
        help="gpt2, a tokenizer.json, or a token folder (default: the model's own: an export's tokenizer.json, or the "
        "token folder a checkpoint was trained on)",
    )
    p.add_argument("--context", type=int, default=None, help="window length T in tokens (default n_positions)")
    p.add_argument(
        "--stride",
        type=int,
        default=None,
        help="window step in tokens (default: the context, non-overlapping windows, as train.py --eval_stride; a "
        "smaller step scores each token with more context: a lower, slower perplexity)",
    )
    p.add_argument("--batch_size", type=int, default=8, help="windows per forward pass")
    p.add_argument("--wiki_split", default="test", choices=("val", "test"), help="held-out Wikipedia articles")
    p.add_argument("--wikitext", default=None, help="a WikiText-style file to score as one document")
    p.add_argument("--lambada", default=None, help="a LAMBADA file (.jsonl {'text'} per line, or one per line)")
    p.add_argument("--max_cloze_items", type=int, default=0, help="score only the first N cloze items (0: all)")
    p.add_argument("--out", default=None, help="write the JSON here too (it always goes to stdout)")
    p.add_argument("--no_progress", action="store_true", help="no progress bars")
    return add_version(p)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def check_flags(args: argparse.Namespace) -> None:
    """Refuse a numeric flag out of range before anything is read (the model's own limits are checked once it is
    loaded: ``check_windows``).

    Raises:
        EvalInputError: --context below 2, --stride or --batch_size below 1, or a negative --max_cloze_items.
    """
    lows = {"context": 2, "stride": 1, "batch_size": 1, "max_cloze_items": 0}
    for name, low in lows.items():
        value = getattr(args, name)
        if value is not None and value < low:
            default = {"context": " (omit it for the model's n_positions)", "stride": " (omit it for the context)",
                       "max_cloze_items": " (0: all)"}.get(name, "")  # fmt: skip
            raise EvalInputError(f"--{name} {value} must be >= {low}{default}")


@interruptible("growlm-eval")
def main(argv: list[str] | None = None) -> int:
    """growlm-eval: 0 after printing the JSON results, 2 on bad input (one ``growlm-eval: error:`` line)."""
    args = parse_args(argv)
    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    try:  # the flags, the user's files and --out first: bad input is refused before a model is loaded
        check_flags(args)
        if args.out:
            check_writable(Path(args.out))
        files = read_eval_files(args.wikitext, args.lambada)
        if args.tokenizer is not None:
            check_tokenizer(args.tokenizer)
        m = load(args.model, args.tokenizer)
        out = evaluate(
            m,
            sets,
            context=args.context,
            stride=args.stride,
            batch_size=args.batch_size,
            wiki_split=args.wiki_split,
            files=files,
            max_cloze_items=args.max_cloze_items,
            progress=not args.no_progress,
            skip_missing_wikipedia=args.sets == DEFAULT_SETS,
        )
    except (EvalInputError, ValueError) as e:  # also data.text.InputError and data.tokenizer.TokenizerError
        print(f"growlm-eval: error: {e}", file=sys.stderr)
        return 2
    text = json.dumps(out, indent=2)
    print(text, flush=True)  # first: a failed write below loses nothing
    if args.out:
        try:
            write_text(Path(args.out), text + "\n", overwrite=True)
        except OSError as e:
            kept = "the results are printed above"
            print(f"growlm-eval: error: {write_failed_message(e, '--out', args.out, kept)}", file=sys.stderr)
            return 2
    return 0


def check_tokenizer(spec: str) -> None:
    """Refuse a ``--tokenizer`` that cannot be read (a token folder whose meta.json growlm cannot read, as
    data.tokens.load_meta says; a damaged tokenizer.json) before any model is loaded; it is checked against the
    model's vocabulary once the model is (data.tokenizer.model_tokenizer).

    Raises:
        EvalInputError: ``--tokenizer SPEC: problem; fix``.
    """
    try:
        resolve(spec)
    except TokenizerError as e:
        raise EvalInputError(f"--tokenizer {spec}: {e}") from None


def check_writable(out: Path) -> None:
    """Refuse an --out that cannot be written (a read-only or full disk, a file where its folder should be) before
    anything is evaluated: its folder is created and a file written and removed there.

    Raises:
        EvalInputError: names the problem, the path and the fix.
    """
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out.parent, prefix=f".{out.name}.probe-"):
            pass
    except OSError as e:
        raise EvalInputError(write_failed_message(e, "--out", out, "nothing was evaluated")) from None


if __name__ == "__main__":
    sys.exit(main())
