"""runtime.collectives is the one home of torch.distributed calls: read from the source, no other growlm module
calls torch.distributed (or DeepSpeed's comm layer) directly; on a one-rank gloo group, results come back where the
caller asks and strict mode refuses a direct call and an unstaged tensor."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import growlm
from growlm.runtime import collectives
from growlm.runtime.collectives import UnstagedCollectiveError

PACKAGE = Path(growlm.__file__).resolve().parent
HOME = PACKAGE / "runtime" / "collectives.py"
SETUP = PACKAGE / "runtime" / "dist.py"  # starts and ends the group: only these torch.distributed names
SETUP_NAMES = {"is_available", "is_initialized", "init_process_group", "destroy_process_group", "nn", "cdb"}
COMM_MODULES = ("torch.distributed", "deepspeed.comm")


def package_modules() -> list[Path]:
    """Every .py file of the package (not tests/, not setup.py, not a virtual environment)."""
    skip = {"tests", ".venv", "build", "dist", "runs"}
    return sorted(
        f for f in PACKAGE.rglob("*.py") if not skip & set(f.relative_to(PACKAGE).parts[:-1]) and f.name != "setup.py"
    )


def comm_uses(path: Path) -> list[tuple[int, str]]:
    """(line, what) of each import of torch.distributed / deepspeed.comm and each use of ``torch.distributed.X``
    (also through ``import torch.distributed as NAME`` or ``from torch import distributed``)."""
    tree = ast.parse(path.read_text())
    aliases: set[str] = set()
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith(COMM_MODULES):
                    out.append((node.lineno, f"import {a.name}"))
                    if a.asname:
                        aliases.add(a.asname)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [a.name for a in node.names]
            if node.module.startswith(COMM_MODULES) or (node.module == "torch" and "distributed" in names):
                out.append((node.lineno, f"from {node.module} import {', '.join(names)}"))
                aliases.update(a.asname or a.name for a in node.names if a.name == "distributed")
            elif node.module == "deepspeed" and "comm" in names:
                out.append((node.lineno, "from deepspeed import comm"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value
            if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
                if base.value.id == "torch" and base.attr == "distributed":
                    out.append((node.lineno, f"torch.distributed.{node.attr}"))
            elif isinstance(base, ast.Name) and base.id in aliases:
                out.append((node.lineno, f"{base.id}.{node.attr}"))
    return out


def test_no_module_but_the_home_calls_torch_distributed():
    bad = []
    for f in package_modules():
        if f == HOME:
            continue
        for line, what in comm_uses(f):
            name = what.split(".")[-1]
            if f == SETUP and (
                name in SETUP_NAMES or what.startswith(("import torch.distributed", "import deepspeed"))
            ):
                continue  # runtime.dist starts and destroys the group (and DeepSpeed's handle on it)
            bad.append(f"{f.relative_to(PACKAGE)}:{line}: {what}")
    assert not bad, "call runtime.collectives instead of torch.distributed:\n" + "\n".join(bad)


def test_the_source_check_sees_every_form_of_call(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        "import torch\nimport torch.distributed as d\nfrom torch import distributed\nimport deepspeed.comm\n"
        "torch.distributed.barrier()\nd.all_reduce(x)\ndistributed.broadcast(x, 0)\n"
    )
    whats = [w for _, w in comm_uses(f)]
    for needle in ("torch.distributed.barrier", "d.all_reduce", "distributed.broadcast", "import deepspeed.comm"):
        assert needle in whats, whats


@pytest.fixture(scope="module")
def one_rank_group():
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    collectives.set_strict(False)
    dist.destroy_process_group()


def test_a_one_rank_gloo_group_reduces_gathers_and_broadcasts_on_the_cpu(one_rank_group):
    assert collectives.group_device() == torch.device("cpu")
    t = torch.tensor([1.5, -2.0], dtype=torch.float64)
    r = collectives.all_reduce(t, op="max", device="cpu")
    assert r.tolist() == [1.5, -2.0] and r.dtype == torch.float64
    g = collectives.all_gather(torch.arange(3.0))
    assert g.tolist() == [0.0, 1.0, 2.0]
    b = collectives.broadcast(torch.tensor([7]), src=0)
    assert b.tolist() == [7]
    assert collectives.all_gather_object({"a": 1}) == [{"a": 1}]
    assert collectives.broadcast_object("msg") == "msg"
    assert collectives.rank() == 0 and collectives.world_size() == 1 and collectives.global_rank(None, 0) == 0
    with pytest.raises(ValueError, match="all_reduce op 'avg'"):
        collectives.all_reduce(t, op="avg")


def test_strict_mode_refuses_a_direct_call_from_growlm_and_an_unstaged_tensor(one_rank_group):
    direct = {"__name__": "growlm.some_module"}
    exec("import torch, torch.distributed as dist\ndef f(t):\n    dist.all_reduce(t)\n", direct)
    collectives.set_strict(True)  # what init_distributed does under GROWLM_STRICT_COLLECTIVES=1
    try:
        collectives.barrier()  # through the home: fine
        assert collectives.all_reduce(torch.ones(2), op="sum").tolist() == [1.0, 1.0]
        with pytest.raises(UnstagedCollectiveError, match="growlm.some_module called torch.distributed.all_reduce"):
            direct["f"](torch.ones(2))
        # a tensor that reaches torch.distributed from the home without being staged
        with pytest.raises(UnstagedCollectiveError, match="not staged"):
            collectives._all_gather_single(torch.empty(2), torch.ones(2), None)
        dist.all_reduce(torch.ones(1))  # a caller outside growlm (a test, DeepSpeed) passes unchecked
    finally:
        collectives.set_strict(False)
    direct["f"](torch.ones(2))  # strict mode off again: the wrapper passes everything
