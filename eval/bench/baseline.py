"""Plain PyTorch baseline for the benchmark: one process, no DeepSpeed, the same model and global batch.

Each step: forward and backward over the global batch (in ``grad_accum`` micro steps, like DeepSpeed's gradient
accumulation), global-norm clipping, ``torch.optim.AdamW`` with train.py's parameter groups. bf16/fp16 use
``torch.autocast`` (fp16 with a ``GradScaler``): plain PyTorch's mixed precision, where DeepSpeed keeps low-precision
weights and fp32 master copies; both run every matmul in the low precision. Tokens are random: speed does not
depend on them.

Run as ``python -m eval.bench.baseline --config_json '{...}' ...``; it prints one JSON line (step times in s).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from model.config import GPTConfig
from model.gpt import GPT

_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def step_times(
    cfg: GPTConfig,
    *,
    batch: int,
    seq_len: int,
    precision: str,
    steps: int,
    grad_accum: int = 1,
    lr: float = 1e-3,
    weight_decay: float = 0.1,
    clip: float = 1.0,
    device: str = "cpu",
    seed: int = 1234,
) -> dict:
    """Time ``steps`` plain PyTorch training steps of GPT(cfg) on ``batch`` sequences of ``seq_len`` tokens.

    Returns ``{"step_times_s": [...], "losses": [...], "peak_device_bytes": int | None}``.
    """
    torch.manual_seed(seed)
    model = GPT(cfg).to(device).train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    scaler = torch.amp.GradScaler(device) if precision == "fp16" else None
    micro = batch // grad_accum
    x = torch.randint(0, cfg.vocab_size, (grad_accum, micro, seq_len + 1), device=device)  # (A, B, T + 1)
    times, losses = [], []
    for _ in range(steps):
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        total = 0.0
        for j in range(grad_accum):
            with torch.autocast(device, dtype=_AUTOCAST.get(precision), enabled=precision in _AUTOCAST):
                logits = model(x[j, :, :-1])  # (B, T, V)
                loss = F.cross_entropy(logits.float().flatten(0, 1), x[j, :, 1:].flatten()) / grad_accum
            (scaler.scale(loss) if scaler else loss).backward()
            total += float(loss)
        if scaler:
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if device != "cpu":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(total)
    peak = int(torch.cuda.max_memory_allocated()) if device != "cpu" else None
    return {"step_times_s": times, "losses": losses, "peak_device_bytes": peak}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.bench.baseline", description=__doc__.splitlines()[0])
    p.add_argument("--config_json", required=True, help="GPTConfig.to_dict() as JSON")
    p.add_argument("--batch", type=int, required=True, help="global batch (sequences per optimizer step)")
    p.add_argument("--grad_accum", type=int, default=1)
    p.add_argument("--seq_len", type=int, required=True)
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight_decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = step_times(
        GPTConfig.from_dict(json.loads(args.config_json)),
        batch=args.batch,
        seq_len=args.seq_len,
        precision=args.precision,
        steps=args.steps,
        grad_accum=args.grad_accum,
        lr=args.lr,
        weight_decay=args.weight_decay,
        clip=args.clip,
        device=device,
    )
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
