"""Multi-node launching, simulated on this machine over loopback: two "nodes" of one rank each must train and
checkpoint exactly like one node with two ranks (fp32, same losses, same saved weights and Adam state).

Forms covered (docs/multi-node.md): the deepspeed launcher with a hostfile and ``--no_ssh`` (one launcher per
node, ``--node_rank``, master address/port), and ``mpirun`` with mpi4py discovery, each rank in its own UTS
namespace so that MPI sees two host names, and on one host. Plus an unreachable master: a clear message and exit 2,
not a hang.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from dist_utils import REPO, assert_close_tree, base_env, free_port, read_metrics, run_ranks, write_ds_config

DEEPSPEED = str(REPO / ".venv" / "bin" / "deepspeed") if (REPO / ".venv/bin/deepspeed").exists() else "deepspeed"


def train_args(tmp: Path, out: Path) -> list[str]:
    ds = write_ds_config(
        tmp / "zero2_fp32.json", "zero2_fp32", train_micro_batch_size_per_gpu=4, lr=3e-3, scheduler_warmup_num_steps=2
    )
    return ["--preset", "tiny", "--seq_len", "32", "--no_final_eval", "--ds_config", str(ds), "--max_steps", "4",
            "--out_dir", str(out)]  # fmt: skip


@pytest.fixture(scope="module")
def single_node(tmp_path_factory, builtin_data) -> Path:
    """The reference: one node, 2 ranks (RANK/WORLD_SIZE env, like torchrun), 4 steps, checkpoint at the end."""
    tmp = tmp_path_factory.mktemp("single")
    r = run_ranks(train_args(tmp, tmp / "out"))
    assert r.returncode == 0, r.stdout[-3000:]
    return tmp / "out"


def assert_same_run(ref: Path, other: Path) -> None:
    a, b = read_metrics(ref), read_metrics(other)
    assert [m["step"] for m in b] == [1, 2, 3, 4]
    for x, y in zip(a, b, strict=True):
        assert abs(x["loss"] - y["loss"]) <= 1e-6, (x, y)
        assert x["consumed_samples"] == y["consumed_samples"]
    assert a[-1]["loss"] != a[0]["loss"]  # it trained
    ck_a, ck_b = ref / "checkpoints" / "global_step4", other / "checkpoints" / "global_step4"
    assert (other / "checkpoints" / "latest").read_text() == "global_step4"
    assert sorted(p.name for p in ck_a.iterdir()) == sorted(p.name for p in ck_b.iterdir())
    for f in sorted(ck_a.glob("*.pt")):  # module weights, each rank's ZeRO-2 fp32 partition + Adam state, RNG
        sa, sb = (torch.load(d / f.name, map_location="cpu", weights_only=False) for d in (ck_a, ck_b))
        assert_close_tree(sa, sb, f.name)


def _wait_all(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str]]:
    out = []
    try:
        for p in procs:
            text, _ = p.communicate(timeout=timeout)
            out.append((p.returncode, text))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return out


def test_deepspeed_hostfile_no_ssh_two_nodes_match_one_node(tmp_path, single_node):
    if shutil.which("numactl") is None:
        pytest.skip("the deepspeed launcher needs numactl on CPU (apt-get install numactl; make setup does)")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node0 slots=1\nnode1 slots=1\n")  # with --no_ssh the names are never resolved or contacted
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [
                DEEPSPEED,
                "--hostfile",
                str(hostfile),
                "--no_ssh",
                f"--node_rank={node}",
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                port,
                "train.py",
                *train_args(tmp_path, tmp_path / "out"),
            ],  # fmt: skip
            cwd=REPO,
            env=base_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    results = _wait_all(procs, timeout=600)
    for rc, text in results:
        assert rc == 0, text[-3000:]
    assert "2 rank(s) on cpu" in results[0][1]
    assert "WORLD INFO DICT: {'node0': [0], 'node1': [0]}" in results[1][1]
    assert_same_run(single_node, tmp_path / "out")


def _uts_namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    r = subprocess.run(["unshare", "--uts", "sh", "-c", "hostname node1 && hostname"], capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.strip() == "node1"


@pytest.mark.parametrize("nodes", [1, 2])
def test_mpirun_with_mpi4py_discovery_matches_torchrun_style_ranks(tmp_path, single_node, nodes):
    """``mpirun -n 2`` on one host (docs/multi-node.md); two simulated nodes of one rank each (``unshare --uts``)."""
    pytest.importorskip("mpi4py", reason="mpi4py needs an MPI: make setup installs openmpi and growlm[mpi]")
    if shutil.which("mpirun") is None:
        pytest.skip("no mpirun (apt-get install openmpi-bin)")
    if nodes == 2 and not _uts_namespaces_work():
        pytest.skip("needs `unshare --uts` (root) to give each simulated node its own host name")
    args = [sys.executable, "train.py", *train_args(tmp_path, tmp_path / "out")]
    line = " ".join(args)
    contexts = ["-n", "2", *args]  # one host: Open MPI numbers the local ranks itself
    if nodes == 2:
        contexts = []
        for node in ("node0", "node1"):  # MPMD: one context per node, each rank sees what it would on its own node:
            contexts += [":"] if contexts else []  # its host name, node-local rank 0 of 1 (Open MPI's local numbering)
            per_node = f"hostname {node} && OMPI_COMM_WORLD_LOCAL_RANK=0 OMPI_COMM_WORLD_LOCAL_SIZE=1 exec {line}"
            contexts += ["-n", "1", "unshare", "--uts", "sh", "-c", per_node]
    # MASTER_ADDR through -x only (to the first context of two): discovery hands rank 0's address to every rank
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-x", "MASTER_ADDR=127.0.0.1",
           "-x", f"MASTER_PORT={free_port()}", *contexts]  # fmt: skip
    env = base_env()
    del env["MASTER_ADDR"]  # only through -x
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "2 rank(s) on cpu" in r.stdout + r.stderr
    assert_same_run(single_node, tmp_path / "out")


@pytest.mark.bad_input
def test_unreachable_master_times_out_with_a_clear_message(tmp_path):
    """Rank 1 of 2 waits for a master at a loopback port where nobody listens: exit 2 and a message, not a hang."""
    port = free_port()  # closed again: nothing listens there
    env = base_env(RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_PORT=str(port))
    cmd = [sys.executable, "train.py", "--preset", "tiny", "--seq_len", "32", "--no_final_eval", "--max_steps", "1",
           "--ds_config", "ds_configs/zero2_fp32.json", "--dist_timeout_s", "3",
           "--out_dir", str(tmp_path / "o")]  # fmt: skip
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)  # a hang fails here
    print(f"gave up after {time.monotonic() - t0:.1f} s")  # information only: never asserted
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("growlm-train: error:")]
    assert len(errors) == 1, r.stderr[-3000:]
    assert f"could not join the process group at 127.0.0.1:{port} within 3 s" in errors[0]
    assert "check that the master address is reachable" in errors[0]
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "o" / "checkpoints").exists()
