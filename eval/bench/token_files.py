"""What uint32 token files cost against uint16: growlm-prepare's tokens/s, and training tokens/s, on the same text.

    python -m growlm.eval.bench.token_files --out runs/bench/token_files.json [--chars 500000] [--steps 30]

The same text (the built-in corpus's training files, the first ``--chars`` characters of each) is prepared twice by
growlm-prepare with two word-level tokenizers that split it identically and differ only in their ids: one of
60,001 ids (uint16 files) and one of 70,001 whose words all lie past 65,535 (uint32 files). Then one process trains
the same GPT (``--n_layer`` x ``--n_embd``, a 70,001-id vocabulary for both: a model cannot tell the files apart)
for ``--steps`` steps on each folder, reading its batches through ``data.sampler`` as train.py does, and the
tokens/s of each are recorded (the median of ``--repeats`` runs; the first step of each run, warm-up, is not timed).
The bytes of each folder are recorded too. Prints one line per figure and writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from growlm.data.prepare import builtin_corpus_files, prepare_dataset
from growlm.data.sampler import ResumableSampler, TokenWindows
from growlm.data.text import read_text
from growlm.data.tokens import load_meta, open_tokens
from growlm.model.config import GPTConfig
from growlm.model.gpt2.model import GPT
from growlm.runtime.machine import device_description

EOT = "<|endoftext|>"
SIZES = {"uint16": 60_001, "uint32": 70_001}  # ids of the two tokenizers (the last is EOT)


def word_tokenizer(path: Path, words: list[str], vocab_size: int) -> Path:
    """A word-level ``tokenizers`` JSON of ``vocab_size`` ids, ``words`` on the highest ids below EOT (the last):
    two of them with the same ``words`` split a text identically and differ only in the ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers  # lazy: only to build the tokenizers

    first = vocab_size - 1 - len(words)
    vocab = {f"<pad{i}>": i for i in range(first)} | {w: first + i for i, w in enumerate(words)}
    t = Tokenizer(models.WordLevel(vocab | {EOT: vocab_size - 1}, unk_token=EOT))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    t.save(str(path))
    return path


def train_tokens_per_s(folder: Path, cfg: GPTConfig, steps: int, batch: int, seq_len: int, seed: int = 0) -> float:
    """Training tokens/s of ``cfg`` on ``folder``'s train split: ``steps`` AdamW steps of ``batch`` windows of
    ``seq_len`` tokens after one untimed step, batches read through the sampler as train.py reads them."""
    torch.manual_seed(seed)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    windows = TokenWindows(open_tokens(folder, "train"), seq_len)
    sampler = ResumableSampler(len(windows), seed)
    start = 0.0
    for step in range(steps + 1):
        if step == 1:
            start = time.perf_counter()
        x, y = windows.batch(sampler.sample_ids(step * batch, batch))
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return steps * batch * seq_len / (time.perf_counter() - start)


def run(chars: int, steps: int, repeats: int, n_layer: int, n_embd: int, work: Path) -> dict:
    """Prepare and train on both dtypes ``repeats`` times; returns the JSON record (module docstring)."""
    train_files, _ = builtin_corpus_files()
    texts = [read_text(p)[:chars] for p in train_files]
    (work / "train").mkdir(parents=True, exist_ok=True)
    paths = []
    for i, text in enumerate(texts):
        paths.append(work / "train" / f"{i:02d}.txt")
        paths[-1].write_text(text)
    val = work / "val.txt"
    val.write_text(texts[0][: chars // 10])
    words = sorted({w for t in texts for w in t.split()} - {EOT})[: SIZES["uint16"] - 1]
    cfg = GPTConfig(n_layer=n_layer, n_embd=n_embd, n_head=max(1, n_embd // 32), n_positions=128,
                    vocab_size=SIZES["uint32"])  # fmt: skip
    out: dict = {"device": device_description("cpu"), "chars_per_file": chars, "files": len(paths),
                 "model": cfg.shape_str(), "steps": steps, "repeats": repeats, "dtypes": {}}  # fmt: skip
    for name, size in SIZES.items():
        tok = word_tokenizer(work / f"{name}.json", words, size)
        prep, train = [], []
        folder = work / name
        for _ in range(repeats):
            shutil.rmtree(folder, ignore_errors=True)
            t = time.perf_counter()
            prepare_dataset(paths, [val], folder, tokenizer=str(tok))
            prep.append(time.perf_counter() - t)
            train.append(train_tokens_per_s(folder, cfg, steps, batch=8, seq_len=128))
        meta = load_meta(folder)
        n = meta["splits"]["train"]["n_tokens"] + meta["splits"]["val"]["n_tokens"]
        out["dtypes"][name] = {
            "dtype": meta["dtype"],
            "tokens": n,
            "bytes": sum((folder / f"{s}.bin").stat().st_size for s in ("train", "val")),
            "prepare_s": prep,
            "prepare_tokens_per_s": n / statistics.median(prep),
            "train_tokens_per_s_runs": train,
            "train_tokens_per_s": statistics.median(train),
        }
    a, b = out["dtypes"]["uint16"], out["dtypes"]["uint32"]
    shifted = [np.asarray(open_tokens(work / n, "train"), dtype=np.int64) - (SIZES[n] - 1 - len(words)) for n in SIZES]
    if not np.array_equal(*shifted):  # the same split into words, only the ids differ: else the comparison is void
        raise RuntimeError("the two tokenizers split the text differently")
    out["uint32_over_uint16"] = {
        "bytes": b["bytes"] / a["bytes"],
        "prepare_tokens_per_s": b["prepare_tokens_per_s"] / a["prepare_tokens_per_s"],
        "train_tokens_per_s": b["train_tokens_per_s"] / a["train_tokens_per_s"],
    }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m growlm.eval.bench.token_files", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/bench/token_files.json"))
    p.add_argument("--chars", type=int, default=500_000, help="characters taken from each training file")
    p.add_argument("--steps", type=int, default=30, help="timed training steps per run")
    p.add_argument("--repeats", type=int, default=3, help="runs per dtype (the median is reported)")
    p.add_argument("--n_layer", type=int, default=2)
    p.add_argument("--n_embd", type=int, default=64)
    a = p.parse_args(argv)
    for name in ("chars", "steps", "repeats", "n_layer", "n_embd"):
        if getattr(a, name) < 1:
            print(f"token_files: error: --{name} must be >= 1", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="growlm-token-files-") as work:
        rec = run(a.chars, a.steps, a.repeats, a.n_layer, a.n_embd, Path(work))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(rec, indent=2) + "\n")
    for name, d in rec["dtypes"].items():
        print(f"{name}: {d['tokens']:,} tokens, {d['bytes']:,} bytes; growlm-prepare {d['prepare_tokens_per_s']:,.0f} "
              f"tokens/s; training {d['train_tokens_per_s']:,.0f} tokens/s")  # fmt: skip
    r = rec["uint32_over_uint16"]
    print(f"uint32 / uint16: bytes x{r['bytes']:.2f}, prepare tokens/s x{r['prepare_tokens_per_s']:.3f}, training "
          f"tokens/s x{r['train_tokens_per_s']:.3f} -> {a.out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
