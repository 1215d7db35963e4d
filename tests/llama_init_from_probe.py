"""Run by tests/distributed/test_llama_init_from.py as every rank of a real job: resolve a train.py command line with
--init_from (a transformers Llama folder), build the engine exactly as train.py does (trainer.run.build), and record
what it holds against the folder's tensors and against transformers' own forward pass, then train two steps.

    python tests/llama_init_from_probe.py OUT_JSON TRAIN_PY_ARGS...

Rank 0 writes OUT_JSON with: per parameter the largest |gathered fp32 master - folder tensor| before any step and
after the two steps; the loss of the first optimizer step (trainer.loop.train_step, mean over ranks) and
LlamaForCausalLM's fp32 loss on the same micro batches (mean over ranks); both steps' LR; the ZeRO stage and the
number of parameters.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from growlm import train  # noqa: E402  (selects DeepSpeed's accelerator)

out_path, argv = sys.argv[1], sys.argv[2:]
from growlm.trainer.config import resolve  # noqa: E402

cfg = resolve(train.parse_args(argv))

import deepspeed.utils as dsu  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

from growlm.trainer.checkpointing import restore  # noqa: E402
from growlm.trainer.init_from import stage0_masters  # noqa: E402
from growlm.trainer.loop import Batches, sync_steps, train_step  # noqa: E402
from growlm.trainer.run import build, join, open_data  # noqa: E402

info = join(cfg)
run_data = open_data(cfg, info)
engine = build(cfg)
data = Batches(run_data.windows, run_data.sampler, engine.train_micro_batch_size_per_gpu(),
               engine.gradient_accumulation_steps(), info)  # fmt: skip
src = cfg.init_from
want = {}
for f in sorted(set(src.files.values())):
    want |= load_file(str(f))


def master_diff() -> dict[str, float]:
    """Per parameter: largest |fp32 master (gathered) - the folder's tensor|."""
    masters0, out = stage0_masters(engine), {}
    for name, p in engine.module.named_parameters():
        w = want[src.keys[name]].float()
        master = dsu.safe_get_full_fp32_param(p)
        if master is None:  # ZeRO stage 0: the wrapper's fp32 master, or the parameter itself (fp32)
            master = masters0.get(id(p), p)
        out[name] = float((master.detach().float().cpu().reshape(w.shape) - w).abs().max())
    return out


before = master_diff()
hf = LlamaForCausalLM.from_pretrained(str(src.path), use_safetensors=True, dtype=torch.float32).eval()
hf_loss = torch.zeros((), dtype=torch.float64)
with torch.no_grad():
    for j in range(data.gas):
        x, y = data.micro_batch(0, j)
        logits = hf(x.cpu()).logits
        hf_loss += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.cpu().reshape(-1)).double()
hf_loss = hf_loss.to(info.device)
dist.all_reduce(hf_loss)
p = restore(engine, cfg, info)
steps = [train_step(p, data, own_grad_norm=False) for _ in range(2)]
losses = sync_steps(steps, info).losses
after = master_diff()
if info.rank == 0:
    Path(out_path).write_text(
        json.dumps(
            {
                "zero_stage": cfg.zero_stage,
                "n_params": len(before),
                "master_diff_before": before,
                "master_diff_after": after,
                "lrs": [s.lr for s in steps],
                "losses": [float(x) for x in losses],
                "hf_loss": float(hf_loss) / data.gas / info.world_size,
            }
        )
    )
dist.barrier()
from growlm.runtime.dist import close_distributed  # noqa: E402

close_distributed()
