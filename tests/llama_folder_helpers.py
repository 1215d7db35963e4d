"""Transformers Llama folders for the Llama --init_from, export and growlm-eval tests: written by transformers itself
(``LlamaForCausalLM(config).save_pretrained``), with a small byte-level BPE trained by the ``tokenizers`` library on
the built-in corpus, whose end-of-text token is Llama's ``</s>`` (not GPT-2's ``<|endoftext|>``)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

from growlm.data.prepare import builtin_corpus_files
from growlm.data.text import read_text

VOCAB = 300  # the tokenizer's 300 tokens fill the model's vocabulary exactly
SPECIAL = ["<s>", "</s>", "<unk>"]


@functools.lru_cache(maxsize=1)
def tokenizer_json() -> str:
    """A ByteLevel BPE of ``VOCAB`` tokens (``<s>``=0, ``</s>``=1, ``<unk>``=2) trained on the corpus's first
    training file, as a ``tokenizers`` JSON document."""
    from tokenizers import ByteLevelBPETokenizer

    train, _ = builtin_corpus_files()
    t = ByteLevelBPETokenizer()
    t.train_from_iterator([read_text(train[0])[:200_000]], vocab_size=VOCAB, min_frequency=2, special_tokens=SPECIAL)
    return t._tokenizer.to_str()


def write_tokenizer(path: Path, n_positions: int = 64) -> None:
    """tokenizer.json + tokenizer_config.json (eos ``</s>``, bos ``<s>``), as a Llama folder carries them."""
    (path / "tokenizer.json").write_text(tokenizer_json())
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
           "unk_token": "<unk>", "model_max_length": n_positions}  # fmt: skip
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))


def hf_config(tied: bool = False, n_head: int = 4, n_kv_head: int = 2, family: str = "llama", **over):
    """A transformers LlamaConfig (or Qwen2Config for ``family`` "qwen2": q/k/v biases): L=2, d=64, H=4, K=2 (GQA),
    F=96, P=64, V=300 unless overridden."""
    from transformers import LlamaConfig, Qwen2Config

    kw = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=n_head,
              num_key_value_heads=n_kv_head, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0,
              tie_word_embeddings=tied, bos_token_id=0, eos_token_id=1)  # fmt: skip
    return (Qwen2Config if family == "qwen2" else LlamaConfig)(**(kw | over))


def make_llama_folder(
    path: Path, tied: bool = False, seed: int = 3, tokenizer: bool = True, max_shard_size: str | None = None, **over
) -> Path:
    """Write ``LlamaForCausalLM(hf_config(tied, **over))`` (``Qwen2ForCausalLM`` with ``family="qwen2"``; seeded by
    ``seed``, norms and biases perturbed so none is all ones or zeros) with ``save_pretrained`` (safetensors; sharded
    when ``max_shard_size`` is given) and, if ``tokenizer``, the BPE tokenizer files."""
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

    torch.manual_seed(seed)
    model_cls = Qwen2ForCausalLM if over.get("family") == "qwen2" else LlamaForCausalLM
    model = model_cls(hf_config(tied, **over))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
            elif "embed" in name or "lm_head" in name:
                p.mul_(10.0)  # logits far from uniform: a wrong weight shows in the loss
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(path), safe_serialization=True, **kw)
    if tokenizer:
        write_tokenizer(path, model.config.max_position_embeddings)
    return path


def hf_loss(path: Path, ids: torch.Tensor) -> float:
    """transformers' own fp32 loss (mean next-token cross entropy) of ``ids`` (B, T) int64 under the folder."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(ids).logits
    return float(torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1)))


def llama_token_folder(out: Path, model_dir: Path, chars: int = 40_000) -> Path:
    """A token folder of slices of the built-in corpus (three train documents, one val), tokenized by growlm-prepare
    with ``model_dir``'s own tokenizer (``--tokenizer``)."""
    from growlm.data.prepare import prepare_dataset

    train, val = builtin_corpus_files()
    text_dir = out.parent / f"{out.name}_text"
    text_dir.mkdir(parents=True)
    files = {}
    for name, path in [("train0", train[0]), ("train1", train[1]), ("train2", train[2]), ("val0", val[0])]:
        (text_dir / f"{name}.txt").write_text(read_text(path)[:chars])
        files[name] = text_dir / f"{name}.txt"
    trains = [files["train0"], files["train1"], files["train2"]]
    return prepare_dataset(trains, [files["val0"]], out, tokenizer=str(model_dir))
