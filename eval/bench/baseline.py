"""Plain PyTorch baseline for the benchmark: the DeepSpeed run's process layout (the same ranks, threads per rank,
model and global batch) through ``torch.nn.parallel.DistributedDataParallel``, no DeepSpeed.

Each step, on every rank: forward and backward over its share of the global batch (in ``grad_accum`` micro steps,
like DeepSpeed's gradient accumulation; DDP all-reduces the gradients once, in the last one), global-norm clipping,
``torch.optim.AdamW`` with train.py's parameter groups. bf16/fp16 use ``torch.autocast`` (fp16 with a
``GradScaler``): plain PyTorch's mixed precision, where DeepSpeed keeps low-precision weights and fp32 master copies;
both run every matmul in the low precision. Tokens are random: speed does not depend on them. The process group is
gloo on CPUs (loopback) and NCCL on GPUs, from the launcher's RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT; with
WORLD_SIZE unset or 1 it is a single process without DDP.

Run as ``python -m growlm.eval.bench.baseline --config_json '{...}' ...`` under a rank launcher (runtime.launch); every
rank
prints one JSON line (its step times in s).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from growlm.model.config import ModelConfig, config_from_dict
from growlm.model.registry import build_model
from growlm.runtime.commands import HelpFormatter, add_version
from growlm.runtime.dist import end_plain_group, keep_freed_memory, start_plain_group

_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def step_times(
    cfg: ModelConfig,
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
    world_size: int = 1,
    rank: int = 0,
) -> dict:
    """Time ``steps`` plain PyTorch training steps of the model of ``cfg`` (``GPT`` or ``Llama``) on a global batch of
    ``batch`` sequences of ``seq_len`` tokens, split over ``world_size`` ranks (DDP over the initialised default process
    group when > 1).

    Returns ``{"step_times_s": [...], "losses": [...], "peak_device_bytes": int | None}`` (this rank's; the losses
    are this rank's share).

    Raises:
        ValueError: ``batch`` is not a multiple of ``grad_accum * world_size``.
    """
    if batch % (grad_accum * world_size):
        raise ValueError(f"global batch {batch} is not a multiple of grad_accum {grad_accum} x {world_size} ranks")
    torch.manual_seed(seed)
    model = build_model(cfg).to(device).train()
    net = model
    if world_size > 1:
        net = DistributedDataParallel(model, device_ids=[torch.device(device).index] if device != "cpu" else None)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    kind = "cuda" if device.startswith("cuda") else "cpu"
    scaler = torch.amp.GradScaler(kind) if precision == "fp16" else None
    micro = batch // (grad_accum * world_size)
    g = torch.Generator().manual_seed(seed + rank)
    x = torch.randint(0, cfg.vocab_size, (grad_accum, micro, seq_len + 1), generator=g).to(device)  # (A, B, T + 1)
    times, losses = [], []
    for _ in range(steps):
        if kind == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        total = torch.zeros((), dtype=torch.float64, device=device)  # on the device: read once, at the end
        for j in range(grad_accum):
            sync = world_size == 1 or j == grad_accum - 1  # DDP all-reduces in the last micro step only
            with contextlib.nullcontext() if sync else net.no_sync():
                with torch.autocast(kind, dtype=_AUTOCAST.get(precision), enabled=precision in _AUTOCAST):
                    logits = net(x[j, :, :-1])  # (B, T, V)
                    loss = F.cross_entropy(logits.float().flatten(0, 1), x[j, :, 1:].flatten()) / grad_accum
                (scaler.scale(loss) if scaler else loss).backward()
            total += loss.detach().double()
        if scaler:
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if kind == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(total)
    peak = int(torch.cuda.max_memory_allocated()) if kind == "cuda" else None
    return {"step_times_s": times, "losses": torch.stack(losses).tolist(), "peak_device_bytes": peak}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m growlm.eval.bench.baseline", description=__doc__.splitlines()[0])
    p.formatter_class = HelpFormatter  # every flag's default in --help
    add_version(p)
    p.add_argument("--config_json", required=True, help="the model config's to_dict() as JSON (GPT-2 or Llama)")
    p.add_argument("--batch", type=int, required=True, help="global batch (sequences per optimizer step)")
    p.add_argument("--grad_accum", type=int, default=1, help="micro batches per optimizer step")
    p.add_argument("--seq_len", type=int, required=True, help="tokens per sequence")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], required=True, help="training precision")
    p.add_argument("--steps", type=int, required=True, help="optimizer steps to time")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (per rank)")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    p.add_argument("--weight_decay", type=float, default=0.1, help="AdamW weight decay (2-D weights)")
    p.add_argument("--clip", type=float, default=1.0, help="gradient clipping (global norm)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    device = "cpu"
    if not torch.cuda.is_available() or os.environ.get("DS_ACCELERATOR") == "cpu":  # as the DeepSpeed runs beside it
        keep_freed_memory()  # as train.py's ranks do on a CPU (runtime.dist.init_distributed)
    else:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch.cuda.set_device(device)
    if world > 1:
        start_plain_group(device)
    try:
        out = step_times(
            config_from_dict(json.loads(args.config_json)),
            batch=args.batch,
            seq_len=args.seq_len,
            precision=args.precision,
            steps=args.steps,
            grad_accum=args.grad_accum,
            lr=args.lr,
            weight_decay=args.weight_decay,
            clip=args.clip,
            device=device,
            world_size=world,
            rank=rank,
        )
    finally:
        if world > 1:
            end_plain_group()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
