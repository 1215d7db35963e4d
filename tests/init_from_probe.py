"""Run by tests/distributed/test_init_from.py as every rank of a real job: resolve a train.py command line that has
--init_from, build the engine exactly as train.py does (trainer.run.build), and record, before and at the first
optimizer step, what it holds against the folder's weights and against transformers' own forward pass.

    python tests/init_from_probe.py OUT_JSON TRAIN_PY_ARGS...

Rank 0 writes OUT_JSON with: per parameter the largest |gathered fp32 master - loaded weight| and |working copy -
loaded weight rounded to the working dtype|, before any step; the Adam state (entries, largest moment, largest
step) and the LR before the first step; the loss of the first optimizer step (trainer.loop.train_step, mean over
ranks) and GPT2LMHeadModel's loss on the same micro batches (fp32, mean over ranks); the working dtype and the ZeRO
stage.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from growlm import train  # noqa: E402  (selects DeepSpeed's accelerator)

out_path, argv = sys.argv[1], sys.argv[2:]
from growlm.trainer.config import resolve  # noqa: E402

cfg = resolve(train.parse_args(argv))

import deepspeed  # noqa: E402
import deepspeed.utils as dsu  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import GPT2LMHeadModel  # noqa: E402

from growlm.runtime.engine import inner_optimizer  # noqa: E402
from growlm.trainer.checkpointing import restore  # noqa: E402
from growlm.trainer.init_from import stage0_masters  # noqa: E402
from growlm.trainer.loop import Batches, sync_steps, train_step  # noqa: E402
from growlm.trainer.run import build, join, open_data  # noqa: E402

info = join(cfg)
run_data = open_data(cfg, info)
engine = build(cfg)
data = Batches(run_data.windows, run_data.sampler, engine.train_micro_batch_size_per_gpu(),
               engine.gradient_accumulation_steps(), info)  # fmt: skip
want = load_file(str(cfg.init_from.weights))
master_diff, working_diff = {}, {}
masters0 = stage0_masters(engine)
for name, p in engine.module.named_parameters():
    w = want[cfg.init_from.keys[name]].float()
    master = dsu.safe_get_full_fp32_param(p)
    if master is None:  # ZeRO stage 0: the wrapper's fp32 master (fp16/bf16), or the parameter itself (fp32)
        master = masters0.get(id(p), p)
    master_diff[name] = float((master.detach().float().cpu().reshape(w.shape) - w).abs().max())
    with deepspeed.zero.GatheredParameters([p], enabled=hasattr(p, "ds_id")):
        working = p.detach().clone()
    working_diff[name] = float((working.float().cpu() - w.to(working.dtype).float()).abs().max())
adam = inner_optimizer(engine).state.values()  # none yet, or (ZeRO-0 bf16/fp16 wrappers) made zero at build
adam_before = {
    "entries": len(adam),
    "max_abs_moment": max([float(st[k].abs().max()) for st in adam for k in ("exp_avg", "exp_avg_sq")], default=0.0),
    "max_step": max([float(st["step"]) for st in adam], default=0.0),
}
lr_before = engine.get_lr()[0]

hf = GPT2LMHeadModel.from_pretrained(str(cfg.init_from.path), use_safetensors=True).float().eval()
hf_loss = torch.zeros((), dtype=torch.float64)
with torch.no_grad():
    for j in range(data.gas):
        x, y = data.micro_batch(0, j)
        logits = hf(x.cpu()).logits
        hf_loss += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.cpu().reshape(-1)).double()
hf_loss = hf_loss.to(info.device)
dist.all_reduce(hf_loss)
p = restore(engine, cfg, info)
first = train_step(p, data, own_grad_norm=False)
first_loss = sync_steps([first], info).losses[0]
if info.rank == 0:
    Path(out_path).write_text(
        json.dumps(
            {
                "zero_stage": cfg.zero_stage,
                "dtype": str(next(engine.module.parameters()).dtype),
                "master_diff": master_diff,
                "working_diff": working_diff,
                "adam_before": adam_before,
                "lr_before_first_step": lr_before,
                "first_step_lr": first.lr,
                "first_loss": first_loss,
                "hf_loss": float(hf_loss) / data.gas / info.world_size,
            }
        )
    )
dist.barrier()
from growlm.runtime.dist import close_distributed  # noqa: E402

close_distributed()
