"""The held-out texts growlm evaluates on, as lists of documents (strings). None of them is ever trained on.

* ``heldout``: the built-in corpus's validation split (Persuasion, Hamlet, The Tempest; data/corpus/val/).
* ``wikipedia``: the gensim English Wikipedia sample (May 2016), split by article; the ``val`` and ``test`` articles
  (10 each) are held out (data/build_corpus.py ``--extra wikipedia`` writes them; Wikipedia-style, not WikiText).
* ``cloze_source``: the held-out novel (Persuasion) the LAMBADA-style cloze is built from (DESIGN.md, section
  Evaluation, "Cloze").
* ``read_text_file``: a user's file (e.g. WikiText-103 ``wiki.test.raw``), one document, scored as given.
"""

from __future__ import annotations

from pathlib import Path

from growlm.data.build_corpus import extra_dir
from growlm.data.prepare import builtin_corpus_files
from growlm.data.text import read_text
from growlm.trainer.scoring import EvalInputError

CLOZE_NOVEL = "persuasion"
_read = read_text  # every file is read by data/text.py, the one reader of text files


def heldout_documents() -> dict[str, str]:
    """name -> text of the built-in validation split, in MANIFEST.json order."""

    _, val = builtin_corpus_files()
    return {p.name.removesuffix(".txt.xz"): _read(p) for p in val}


def cloze_source() -> str:
    """The held-out novel the cloze set is built from."""
    return heldout_documents()[CLOZE_NOVEL]


def wikipedia_dir() -> Path:
    """Where ``python -m growlm.data.build_corpus --extra wikipedia`` writes the Wikipedia sample (split by article)."""

    return extra_dir() / "wikipedia"


def wikipedia_documents(split: str = "test") -> dict[str, str]:
    """title -> text of the held-out Wikipedia articles of ``split`` ('val' or 'test').

    Raises:
        EvalInputError: the split is unknown, or the extra source has not been built (the message says how).
    """
    if split not in ("val", "test"):
        raise EvalInputError(f"Wikipedia split {split!r}: use 'val' or 'test' (the 'train' articles are trained on)")
    folder = wikipedia_dir() / split
    files = sorted(folder.glob("*.txt"))
    if not files:
        raise EvalInputError(
            f"the held-out Wikipedia sample is not built ({folder} is empty or missing); build it once with "
            "`python -m growlm.data.build_corpus --extra wikipedia` (downloads gensim's wheel, needs mwparserfromhell)"
        )
    return {p.stem: _read(p) for p in files}


WIKITEXT_FILES = ("wiki.test.raw", "wiki.test.tokens")  # a WikiText folder's test split, raw first


def read_text_file(path: str | Path) -> str:
    """A user's eval file (UTF-8 text, .xz allowed, a leading BOM removed; data/text.py) as one document. A
    WikiText folder (e.g. wikitext-103-raw/) stands for its test split: its first file of ``WIKITEXT_FILES``.

    Raises:
        EvalInputError: missing, a folder without a WikiText test file (the message names what is missing and
            what the folder holds), or empty (whitespace only).
        data.text.InputError: undecodable bytes (``FILE:LINE: problem; fix``).
    """
    p = Path(path)
    if p.is_dir():
        found = [p / name for name in WIKITEXT_FILES if (p / name).is_file()]
        if not found:
            held = sorted(x.name for x in p.iterdir())
            shown = ", ".join(held[:8]) + (f", ... ({len(held)} entries)" if len(held) > 8 else "") or "nothing"
            raise EvalInputError(
                f"eval folder {p} has no {' or '.join(WIKITEXT_FILES)} (it holds: {shown}); give the file to score "
                f"itself, e.g. --wikitext {p / WIKITEXT_FILES[0]}"
            )
        p = found[0]
    if not p.exists():
        raise EvalInputError(f"eval file {p} does not exist; check the path")
    if not p.is_file():
        raise EvalInputError(f"eval file {p} is not a regular file; give a text file")
    text = _read(p)
    if not text.strip():
        raise EvalInputError(f"eval file {p} is empty; nothing to score")
    return text
