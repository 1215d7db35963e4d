"""One rank of the strict-collectives check (tests/distributed/test_strict_collectives.py): start the group through
runtime.dist (which reads GROWLM_STRICT_COLLECTIVES), then try a collective from a module named like one of growlm's
that calls torch.distributed directly, and one through runtime.collectives. Prints one JSON line."""

from __future__ import annotations

import json

import torch

from growlm.runtime import collectives
from growlm.runtime.dist import init_distributed

info = init_distributed(60)
direct = {"__name__": "growlm.probe_module"}
exec("import torch.distributed as dist\ndef f(t):\n    dist.all_reduce(t)\n", direct)
try:
    direct["f"](torch.ones(1))
    refused = ""
except collectives.UnstagedCollectiveError as e:
    refused = str(e)
total = collectives.all_reduce(torch.tensor([info.rank + 1.0]), op="sum")
print(json.dumps({"rank": info.rank, "refused": refused, "sum": total.item()}), flush=True)
