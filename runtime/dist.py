"""Process-group setup for DeepSpeed on GPUs and CPUs, under the deepspeed launcher, torchrun or mpirun.

The only job of this module: turn the launcher's environment into an initialised ``torch.distributed`` group.
It imports deepspeed lazily, after choosing the accelerator, because DeepSpeed picks its accelerator at import.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch

# torch.distributed.nn.functional binds ``group=group.WORLD`` as a default argument when it is imported: imported after
# the group exists (DeepSpeed's engine imports it lazily), ten functions hold the default group for the life of the
# process and destroy_process_group cannot free it (its worker threads then meet the interpreter's teardown).
# Imported here, before any group exists, the defaults hold None (the default group at call time).
import torch.distributed.nn  # noqa: F401, E402  (isort: keep this after torch)

from growlm.runtime import collectives, peers, stop
from growlm.runtime.launch import free_port
from growlm.runtime.memory import ranks_on_this_node
from growlm.runtime.processes import watch_launchers
from growlm.runtime.quiet import quiet_known_noise


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: global rank, world size, rank within its node, and the torch device it uses."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device


def select_accelerator() -> str:
    """Set ``DS_ACCELERATOR=cpu`` when no CUDA device exists (unless the user set it); return its value.

    Must run before deepspeed is imported anywhere in the process. Also installs growlm's filters of known
    third-party noise (``runtime.quiet``), since every process that uses DeepSpeed calls it first.
    """
    quiet_known_noise()
    if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"
    return os.environ.get("DS_ACCELERATOR", "cuda")


def discover_mpi() -> bool:
    """Fill RANK, WORLD_SIZE, LOCAL_RANK (and MASTER_ADDR/PORT if unset) from an MPI launch; True if it did.

    Unlike DeepSpeed's own ``mpi_discovery`` this keeps a MASTER_ADDR the user exported (``mpirun -x
    MASTER_ADDR=...``), and when every rank runs on one host it uses 127.0.0.1 instead of the host's
    non-loopback address. Across hosts without MASTER_ADDR, rank 0's resolved host name is used.

    LOCAL_RANK and LOCAL_WORLD_SIZE are Open MPI's node-local numbers when it sets them, else counted from the
    ranks' host names. Every rank takes rank 0's MASTER_ADDR and MASTER_PORT (an ``-x`` given to only some MPMD
    contexts still works).

    Raises:
        RuntimeError: launched by mpirun but mpi4py is not installed, or the ranks span hosts, MASTER_ADDR is
            unset and rank 0's host name does not resolve (raised on every rank).
    """
    if "RANK" in os.environ or not any(k in os.environ for k in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")):
        return False
    try:
        from mpi4py import MPI  # lazy: importing mpi4py.MPI initialises MPI: only under mpirun
    except ImportError as e:
        raise RuntimeError("launched by mpirun but mpi4py is missing; pip install 'growlm[mpi]' (needs an MPI)") from e
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    hosts = comm.allgather(MPI.Get_processor_name())
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    # Open MPI's own node-local numbering when it gives one (DeepSpeed asserts LOCAL_RANK equals it), else host names
    os.environ["LOCAL_RANK"] = os.environ.get(
        "OMPI_COMM_WORLD_LOCAL_RANK", str(sum(h == hosts[rank] for h in hosts[:rank]))
    )
    os.environ["LOCAL_WORLD_SIZE"] = os.environ.get(
        "OMPI_COMM_WORLD_LOCAL_SIZE", str(sum(h == hosts[rank] for h in hosts))
    )
    # rank 0's MASTER_ADDR/PORT (or its choice) for every rank: all ranks take part, so none waits in a bcast
    # that rank 0 never reaches, and a failure is raised on every rank instead of one rank crashing
    addr, port, error = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "29500"), None
    if rank == 0 and addr is None:
        try:
            addr = "127.0.0.1" if len(set(hosts)) == 1 else socket.gethostbyname(socket.gethostname())
        except OSError as e:
            error = (
                f"ranks run on {len(set(hosts))} hosts and MASTER_ADDR is not set; rank 0's host name "
                f"{socket.gethostname()!r} does not resolve ({e}): pass mpirun -x MASTER_ADDR=<address of rank 0's "
                "node>"
            )
    addr, port, error = comm.bcast((addr, port, error), root=0)
    if error:
        raise RuntimeError(error)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, port
    return True


def launch_rank() -> int:
    """This process's global rank as its launcher gave it (RANK, else Open MPI's OMPI_COMM_WORLD_RANK), 0 when
    neither is set or the value is not an integer (``check_launch_env`` then names the problem); for deciding who
    prints before the process group exists."""
    value = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    try:
        return int(value)
    except ValueError:
        return 0


def _env_int(key: str, low: int, high: int | None = None) -> int | None:
    """The integer in environment variable ``key`` (None when unset), checked to lie in [low, high).

    Raises:
        RuntimeError: not an integer, or outside the range; the message names the variable and the launchers.
    """
    raw = os.environ.get(key)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise RuntimeError(f"{key}={raw!r} is not an integer; {_LAUNCH_HINT}") from None
    if value < low or (high is not None and value >= high):
        bound = f"in [{low}, {high})" if high is not None else f">= {low}"
        raise RuntimeError(f"{key}={value} must be {bound}; {_LAUNCH_HINT}")
    return value


_LAUNCH_HINT = "the launch environment is inconsistent: start the ranks with deepspeed, torchrun or mpirun"


def check_launch_env(accelerator: str = "cpu") -> None:
    """Refuse an inconsistent launch environment before any rank waits for another: RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE and MASTER_PORT must be integers with 0 <= RANK < WORLD_SIZE, 0 <= LOCAL_RANK <
    LOCAL_WORLD_SIZE <= WORLD_SIZE and LOCAL_RANK <= RANK; with more than one rank RANK, LOCAL_RANK, MASTER_ADDR and
    MASTER_PORT must be set; on CUDA LOCAL_RANK must name a visible device. (A rank numbered past the world size
    would otherwise wait for the rendezvous until the timeout and blame the network.)

    Raises:
        RuntimeError: the first inconsistency, naming the variables and their values.
    """
    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    if world is None and rank is not None:
        raise RuntimeError(f"RANK={rank} is set but WORLD_SIZE is not; {_LAUNCH_HINT}")
    world = world or 1
    rank = _env_int("RANK", 0, world)
    local_world = _env_int("LOCAL_WORLD_SIZE", 1, world + 1)
    local = _env_int("LOCAL_RANK", 0, local_world)
    _env_int("MASTER_PORT", 1, 65536)
    if world > 1:
        missing = [k for k in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
        if missing:
            verb = "is" if len(missing) == 1 else "are"
            raise RuntimeError(f"WORLD_SIZE={world} but {', '.join(missing)} {verb} not set; {_LAUNCH_HINT}")
    if local is not None and rank is not None and local > rank:
        raise RuntimeError(f"LOCAL_RANK={local} is larger than RANK={rank}; {_LAUNCH_HINT}")
    if accelerator == "cuda" and local is not None and local >= max(1, torch.cuda.device_count()):
        raise RuntimeError(
            f"LOCAL_RANK={local} but this node has {torch.cuda.device_count()} visible GPU(s); start at most that "
            "many ranks per node (hostfile slots=N, --nproc_per_node N) or check CUDA_VISIBLE_DEVICES"
        )


_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc mallopt parameters (malloc.h)


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse instead of returning it to the kernel (CPU training).

    glibc serves every allocation above 32 MiB (e.g. a micro batch's logits, B x T x vocab fp32: 8 x 128 x 50257 x
    4 bytes = 206 MB) with a fresh ``mmap`` and unmaps it on free, so each step page-faults and zero-fills it again:
    on the 2-core development CPU that made system time about equal to user time (measured: 6.9M minor faults and
    24 s sys against 49 s user for 15 steps of the demo; 6 steps side by side: 11.9 -> 6.6 s sys, 3.0M -> 1.6M
    faults, peak RSS 1.31 -> 1.90 GB; DESIGN.md, "DeepSpeed facts"). Equivalent to
    ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=<huge>``: allocations come from the heap and freed chunks stay in it
    (a rank's peak RSS grows by about its largest transient tensors). Does nothing when the user set either
    variable or ``GROWLM_KEEP_FREED=0``, or without glibc. Returns whether it changed the settings.
    """
    if {"MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_"} & set(os.environ) or os.environ.get("GROWLM_KEEP_FREED") == "0":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
    except (OSError, AttributeError):  # not glibc
        return False


def rank_threads() -> int:
    """This rank's share of the node's cores for torch's CPU threads: the cores this process may run on
    (``os.sched_getaffinity``, else ``os.cpu_count``) divided by the ranks on this node
    (``runtime.memory.ranks_on_this_node``), at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // ranks_on_this_node())


def init_distributed(timeout_s: float = 300.0) -> DistInfo:
    """Initialise the default process group (NCCL on CUDA, gloo or oneCCL on CPU) and return where we are.

    Works without a launcher too (a single process, world size 1, on 127.0.0.1). With ``GROWLM_STRICT_COLLECTIVES=1``
    in the environment it turns on ``runtime.collectives``' strict mode (for tests). Torch's CPU threads are set to
    this rank's share of the node's cores (``rank_threads``) unless OMP_NUM_THREADS is set: on a CPU run they do the
    training (oversubscribed threads make steps erratic); on a GPU node they do a live growth's expansion of the
    gathered tensors and the data work, which 8 ranks with every core each would oversubscribe 8 times. On a CPU
    malloc keeps freed memory (``keep_freed_memory``). A rank started by a launcher watches it from then on and is
    told when it is gone (``runtime.processes.watch_launchers``, ``runtime.stop.launcher_gone``). Groups created
    later (DeepSpeed's, one set per engine) get ``timeout_s`` too, and a multi-rank job's ranks keep a heartbeat
    (``runtime.peers``) so that a rank that stops answering can be named.

    Args:
        timeout_s: seconds to wait for the other ranks (rendezvous and every collective).

    Raises:
        RuntimeError: the launch environment is inconsistent (``check_launch_env``), or the rendezvous at
            MASTER_ADDR:MASTER_PORT did not complete within timeout_s; the message names the address so an
            unreachable or wrong master is obvious.
    """
    accelerator = select_accelerator()
    watch_launchers(stop.launcher_gone)  # a rank whose launcher is gone stops (runtime.processes, runtime.stop)
    _ENV_BEFORE.clear()
    _ENV_BEFORE.update({k: os.environ.get(k) for k in _RENDEZVOUS_ENV})
    discover_mpi()
    if "RANK" not in os.environ:  # plain `python train.py`: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    check_launch_env(accelerator)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(rank_threads())
    if accelerator == "cpu":
        keep_freed_memory()

    import deepspeed  # lazy: deepspeed picks its accelerator at import
    from deepspeed.accelerator import get_accelerator  # lazy: deepspeed picks its accelerator at import

    acc = get_accelerator()
    skip_shm_comm_op()
    try:
        deepspeed.init_distributed(
            dist_backend=acc.communication_backend_name(),
            auto_mpi_discovery=False,
            timeout=timedelta(seconds=timeout_s),
        )
    except (RuntimeError, TimeoutError) as e:
        where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        raise RuntimeError(
            f"could not join the process group at {where} within {timeout_s:.0f} s ({e}); check that the master "
            "address is reachable from every node, the port is free, and every rank was started"
        ) from e
    # groups created later (DeepSpeed's, for every engine a live growth builds) take torch's default timeout, 30
    # minutes for gloo and 10 for NCCL, unless given one: give them this run's, so that --dist_timeout_s holds there too
    collectives.set_default_group_timeout(timeout_s)
    peers.start(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))  # who stopped answering, when one does
    atexit.unregister(close_distributed)
    atexit.register(close_distributed)  # groups closed while the interpreter is whole
    if os.environ.get(STRICT_COLLECTIVES_ENV) == "1":  # tests: every collective checked (runtime.collectives)
        collectives.set_strict(True)
    if accelerator == "cpu":
        device = torch.device("cpu")
    else:
        acc.set_device(local_rank)
        device = torch.device(acc.device_name(local_rank))
    return DistInfo(
        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]), local_rank=local_rank, device=device
    )


def start_plain_group(device: str | torch.device) -> None:
    """Start the default process group for plain PyTorch, no DeepSpeed (the benchmark's DDP baseline), from the
    launcher's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT: NCCL for a CUDA ``device``, gloo for the CPU. End it with
    ``end_plain_group``. Like ``init_distributed``, the rank watches its launcher and ends once it is gone."""
    watch_launchers(stop.launcher_gone)
    torch.distributed.init_process_group("nccl" if torch.device(device).type == "cuda" else "gloo")


def end_plain_group() -> None:
    """Destroy the group ``start_plain_group`` started (nothing when there is none)."""
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


STRICT_COLLECTIVES_ENV = "GROWLM_STRICT_COLLECTIVES"  # "1": init_distributed turns on runtime.collectives' strict mode
SHM_COMM_OP = "deepspeed_shm_comm"  # DeepSpeed's name for its CPU shared-memory all-reduce op


def skip_shm_comm_op() -> bool:
    """Keep DeepSpeed from building and loading its CPU shared-memory comm op when the process group starts.

    DeepSpeed's CPU backend JIT-compiles that C++ op (``deepspeed_shm_comm``) in every new environment, about a
    CPU-minute with g++ on a 2-core CPU, and then maps shared memory in every rank; it serves only
    ``deepspeed.comm.inference_all_reduce``, which DeepSpeed's tensor-parallel inference layers call and growlm never
    does: training reduces through the gloo (or oneCCL) process group either way. DeepSpeed skips the op when its
    table of compatible ops (``deepspeed.ops.__compatible_ops__``, probed once per process and kept in the module so
    that edits persist) marks it incompatible; this marks it so, on the CPU accelerator only. Call it before
    ``deepspeed.init_distributed`` (``init_distributed`` and ``runtime.engine.build_engine`` do).

    Returns True when it marked the op; False on another accelerator, or when this DeepSpeed has no such table (the
    op is then built as before).
    """
    import deepspeed.ops  # lazy: deepspeed picks its accelerator at import
    from deepspeed.accelerator import get_accelerator  # lazy: deepspeed picks its accelerator at import

    if get_accelerator().device_name() != "cpu":
        return False
    try:
        table = deepspeed.ops.__compatible_ops__
    except AttributeError:
        return False
    table[SHM_COMM_OP] = False
    return True


_RENDEZVOUS_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_ENV_BEFORE: dict[str, str | None] = {}  # what init_distributed found, so close_distributed can put it back


def close_distributed() -> None:
    """Undo ``init_distributed``: destroy every process group (DeepSpeed's and torch's), so that their gloo/NCCL
    worker threads and the TCP store that holds MASTER_PORT are joined and closed now, and restore the rendezvous
    variables it set. Safe to call more than once, and when ``init_distributed`` never ran or failed.

    ``init_distributed`` registers it with ``atexit``, so every process that initialised the group through growlm
    (train.py, growlm-grow, growlm-eval, the benchmarks, a user's script) closes it while the interpreter is still
    whole; a ``train.main`` called in-process (tests, notebooks, a driver) also calls it on every exit path, so the
    next run in the same process, or a child it starts, can bind the port.

    Why it matters: a process group that outlives ``destroy_process_group`` keeps its gloo worker threads until the
    interpreter is torn down; a worker that then drops the last reference to a tensor needs the GIL, is ended by
    Python's finalisation through a forced unwind, and the process aborts with "terminate called without an active
    exception" (SIGABRT) after a finished run (DESIGN.md, "DeepSpeed facts": the captured default group).
    """
    peers.leave()  # the others, if they are still waiting for this rank, learn that it ended on its own
    collectives.set_default_group_timeout(None)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        try:  # DeepSpeed's destroy also drops the groups it caches (deepspeed.utils.groups), then calls torch's
            import deepspeed.comm as ds_comm  # lazy: deepspeed picks its accelerator at import

            if ds_comm.is_initialized():
                ds_comm.destroy_process_group()
        except ImportError:
            pass
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    try:  # DeepSpeed keeps its own handle on the group; drop it so a later init_distributed starts afresh
        import deepspeed.comm.comm as ds_comm_state  # lazy: deepspeed picks its accelerator at import

        ds_comm_state.cdb = None
    except ImportError:
        pass
    gc.collect()  # groups held only by reference cycles (a released engine's) are freed now, not at exit
    for key, value in _ENV_BEFORE.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    _ENV_BEFORE.clear()
