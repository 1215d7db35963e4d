"""Tokenizers for the tests of vocabularies past 65,535 ids (uint32 token folders)."""

from __future__ import annotations

from pathlib import Path


def big_tokenizer(path: Path, texts: list[str]) -> Path:
    """A word-level ``tokenizers`` JSON of 70,001 ids (more than uint16 holds, as Llama 3's 128,256 and Qwen's
    151,669) in which every word of ``texts`` has an id past 65,535 and ``<|endoftext|>`` is the last id."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted({w for t in texts for w in t.split()} - {"<|endoftext|>"})
    vocab = {f"w{i}": i for i in range(70_000 - len(words))}
    vocab |= {w: 70_000 - len(words) + i for i, w in enumerate(words)} | {"<|endoftext|>": 70_000}
    t = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    t.save(str(path))
    return path
