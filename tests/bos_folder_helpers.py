"""A TinyLlama-style transformers folder for the bos tests: a byte-level BPE whose post-processor template puts
``<s>`` before every text (``<unk>`` = 0, ``<s>`` = 1, ``</s>`` = 2, as TinyLlama and Llama 2 number them), saved by
transformers' ``PreTrainedTokenizerFast.save_pretrained`` (so tokenizer_config.json names bos/eos/unk), beside a tiny
``LlamaForCausalLM`` whose config says bos_token_id 1, eos_token_id 2."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from llama_folder_helpers import VOCAB, make_llama_folder

from growlm.data.prepare import builtin_corpus_files
from growlm.data.text import read_text

SPECIAL = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2


@functools.lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    train, _ = builtin_corpus_files()
    t.train_from_iterator([read_text(train[0])[:100_000]], trainer=trainer)
    t.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )  # fmt: skip
    return t.to_str()


def write_bos_tokenizer(path: Path, add_bos_token: bool | None = None) -> Path:
    """The template tokenizer's files in ``path`` (made if missing), written by transformers' save_pretrained; with
    ``add_bos_token`` given, tokenizer_config.json also says it (transformers then rebuilds the template from it)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()), bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(str(path))
    if add_bos_token is not None:
        cfg = json.loads((path / "tokenizer_config.json").read_text())
        (path / "tokenizer_config.json").write_text(json.dumps(cfg | {"add_bos_token": add_bos_token}))
    return path


def make_bos_llama_folder(path: Path, **over) -> Path:
    """A tiny Llama folder (llama_folder_helpers.make_llama_folder, bos_token_id 1, eos_token_id 2) with the template
    tokenizer."""
    make_llama_folder(path, tokenizer=False, bos_token_id=1, eos_token_id=2, **over)
    return write_bos_tokenizer(path)
