"""One rank of the save-verdict check (tests/distributed/test_lost_rank.py): each rank saves into its own view of
the checkpoint folder (``<argv[1]>/rank<R>``), and only rank 0's holds the tag already, as a folder that one node
sees differently would. Every rank must refuse with the same error at once; no rank may go on to write. Prints one
JSON line: the rank and what ``checkpoint.save`` raised."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

from growlm.runtime import checkpoint, collectives
from growlm.runtime.dist import close_distributed, init_distributed

info = init_distributed(20)
save_dir = Path(sys.argv[1]) / f"rank{info.rank}"
if info.rank == 0:
    (save_dir / checkpoint.tag_for(3)).mkdir(parents=True)
try:
    checkpoint.save(None, save_dir, SimpleNamespace(global_step=3), rank=info.rank)  # no engine: refused before
    raised = "nothing"
except checkpoint.CheckpointError as e:
    raised = f"CheckpointError: {e}"
except Exception as e:  # a rank that went on without the verdict
    raised = f"{type(e).__name__}: {e}"
print(json.dumps({"rank": info.rank, "raised": raised}), flush=True)
collectives.barrier()  # a rank that went on waits in the save's barrier: this one meets it there
close_distributed()
