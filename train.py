"""growlm training entry point: pretrain a GPT-2, Llama or Qwen 2 model with DeepSpeed ZeRO on a prepared token file.

Launch with the deepspeed launcher (``deepspeed --num_gpus 2 train.py ...``; on a CPU DeepSpeed's CPU
accelerator and gloo are chosen automatically), with ``torchrun --nproc_per_node 2 train.py ...``, with
``mpirun -n 2 python train.py ...`` (mpi4py discovery), or as a single process (``python train.py ...``).
DeepSpeed settings (ZeRO stage, precision, micro batch, gradient accumulation, clipping, AdamW, LR schedule) come
from the JSON given by --ds_config; see ds_configs/README.md. Run ``python train.py --help`` for every flag.

This file is the script the launchers run; the command line is trainer/cli.py and the run itself trainer/run.py.
Installed, it is ``growlm.train`` (console script ``growlm-train``; ``python -m growlm.train``).
"""

import sys

from growlm.trainer.cli import build_parser, main, parse_args

__all__ = ["main", "build_parser", "parse_args"]

if __name__ == "__main__":
    sys.exit(main())  # process groups are closed by main (and atexit: runtime.dist.init_distributed)
