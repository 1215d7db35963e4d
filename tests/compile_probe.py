"""Run by tests/distributed/test_compile.py as each rank of a train.py job: train.py itself, unchanged (run as
``__main__`` with the given arguments), with inductor's entry point wrapped so that every graph torch.compile hands
to inductor is recorded on its way through.

    python tests/compile_probe.py OUT_PREFIX TRAIN_ARGS...

Each rank writes OUT_PREFIX.rank<R>.json (R: the launch's RANK): a list with one entry per graph inductor compiled,
in order: ``grad`` (whether autograd was on: a training forward, whose backward inductor compiles with it, or an
eval forward under no_grad) and ``inputs`` (the graph's tensor inputs, placeholder name -> shape; with
torch.compile's default of inlining nn.Module calls, each parameter the model's forward reads is one input, named
after its module path, e.g. ``l_self_modules_transformer_modules_h_modules_1_..._weight_``). Nothing is recorded
for an eager run. The exit status is train.py's.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

import torch
import torch._inductor.compile_fx as compile_fx_module

from growlm import TRAIN_SCRIPT

out_prefix, train_args = sys.argv[1], sys.argv[2:]
graphs: list[dict] = []
inductor_compile_fx = compile_fx_module.compile_fx  # dynamo's "inductor" backend imports it from here per graph


def recording_compile_fx(gm, example_inputs, *args, **kwargs):
    """Record the graph's tensor inputs, then compile it with inductor as torch.compile would."""
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = {n: list(x.shape) for n, x in zip(names, example_inputs, strict=False) if torch.is_tensor(x)}
    graphs.append({"grad": torch.is_grad_enabled(), "inputs": inputs})
    return inductor_compile_fx(gm, example_inputs, *args, **kwargs)


compile_fx_module.compile_fx = recording_compile_fx
sys.argv = [str(TRAIN_SCRIPT), *train_args]
try:
    runpy.run_path(str(TRAIN_SCRIPT), run_name="__main__")
finally:
    Path(f"{out_prefix}.rank{os.environ.get('RANK', '0')}.json").write_text(json.dumps(graphs))
