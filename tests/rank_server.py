"""A fork server for the ranks the tests start: torch, DeepSpeed and growlm imported once, each rank forked from it.

A rank of a tiny test run spends most of its ~10 CPU seconds importing: torch (~3.5 s), then torch._dynamo (torch's
optimizers import it) and torch._inductor (DeepSpeed's ZeRO optimizer imports kernels that call torch.compile), ~6 s
on a 2-core CPU without AVX512. The server imports all of that once per pytest process and then forks one child per
rank, which starts in well under a second. Each rank is still a real, separate process (its own PID and session, the
environment, working folder, argv and log file it was given, its own gloo process group over loopback) that runs its
script as ``__main__`` and ends through the interpreter's normal exit (atexit handlers, thread joins), as
``python SCRIPT ARGS`` or ``python -m MODULE ARGS`` would; only the imports were done before it forked.

conftest.py plugs ``start_rank`` into ``growlm.runtime.launch`` for the whole suite, so every rank started through
``launch_ranks`` in a test (run_ranks, growlm-bench, growlm-gpu-check) is forked. Commands that are not a Python
script or module of this interpreter (``python -c``, launchers) start fresh, as do the tests of the launchers
themselves (deepspeed, torchrun, mpirun, growlm-run, the offline install). ``GROWLM_TEST_FORK=0`` turns it off.

What a forked rank does not share with a fresh interpreter: the modules above are already imported (import-time
warnings go to the server's log) and frozen (below), DeepSpeed's table of the ops this machine can build is the
server's probe, the hash seed and numpy's global RNG state are the server's, its peak RSS
(``ru_maxrss``) counts the pages inherited from the server, and ``/proc/PID/cmdline`` names rank_server.py. Only
ranks whose DS_ACCELERATOR is ``cpu`` are forked (the server's DeepSpeed chose the CPU accelerator at import); each
gets the client's umask at the time of the request.

Before it forks, the server moves every object it holds into the collector's permanent generation
(``gc.freeze``, as Python's ``gc`` docs advise before a fork without exec). Without it, each collection in a rank,
the last one at interpreter exit included, walks the objects of all those imports, and every page it touches is
copied from the server: measured on a 2-core AMD EPYC, a tiny 2-rank run's ranks took 3.9 CPU-s each, 2.5 s of it
after the atexit handlers, and 1.0 s with the freeze. A rank's own objects are collected as usual; the server's are
never collected in a rank and are left out of its ``gc.get_objects()``.

Forking is safe because the server only imports: it starts no thread (checked; it runs with OMP_NUM_THREADS=1, so
no OpenMP pool exists) and creates no process group. A rank gets the intra-op threads a fresh process would have
(``torch.set_num_threads``: its OMP_NUM_THREADS, else every CPU it may run on).

Protocol, one JSON object per line: the client writes ``{"id", "argv", "env", "cwd", "log", "umask"}`` to the
server's stdin; the server forks a helper, which forks the rank and exits, so that the rank is re-parented to the
client (a child subreaper, ``prctl(PR_SET_CHILD_SUBREAPER)``) and the client reaps it like any child (``os.wait4``:
exit status, peak RSS) and kills its process group. The server then answers ``{"id", "pid": RANK_PID}`` on
``--reply_fd``. The client skips answers to earlier ids: a request interrupted while it waited (KeyboardInterrupt)
leaves its answer in the pipe, and the rank that answer names runs on unsupervised (the client's child, reaped by
nobody until the client exits). The client checks what would make a fresh start fail (the log file opened for
writing, the working folder) before it asks, and raises the same OSError. When the server does not answer (it
died, or stayed silent past the timeout) that request fails with the server's log, the server is stopped, and
every later rank of the session starts fresh; a rank the silent server may still have forked is left alone, as
above.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

PR_SET_PDEATHSIG = 1  # linux/prctl.h
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    """Linux prctl(option, value); OSError when it fails."""
    if ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")


# --- the server (run as a script) ---


def _preload() -> None:
    """Import what every rank imports (the slow part of a rank's start) and let DeepSpeed probe which of its ops
    this machine can build (it runs the compiler; every process does it once, on first use)."""
    import deepspeed.ops
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401
    from deepspeed.runtime.zero.muon import muon_optimizer  # noqa: F401  (torch.compile -> torch._inductor)
    from torch.utils.tensorboard import SummaryWriter  # noqa: F401  (rank 0's logger)
    from transformers import GPT2Config, GPT2LMHeadModel  # noqa: F401  (HF export, --init_from, references)

    import growlm.growth.live.grow  # noqa: F401
    import growlm.model.gpt2.hf  # noqa: F401
    import growlm.trainer.cli  # noqa: F401

    deepspeed.ops.__compatible_ops__  # noqa: B018  (computed on first access and kept in the module)


def _become_rank(req: dict) -> None:
    """In the forked rank (already in its own session): the request's umask, environment, folder and log; stdin
    from /dev/null; default SIGINT/SIGTERM handling; the intra-op threads a fresh process would have."""
    os.umask(req["umask"])
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, to in ((null, 0), (log, 1), (log, 2)):
        os.dup2(fd, to)
    os.close(null)
    os.close(log)
    sys.stdin = open(os.devnull)  # noqa: SIM115  (the server's stdin object may hold read-ahead of its pipe)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    import torch  # the server ran with one OpenMP thread

    try:
        threads = int(os.environ.get("OMP_NUM_THREADS", "").split(",")[0])
    except ValueError:
        threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(max(1, threads))


def serve(reply_fd: int) -> dict | None:
    """Fork a rank per request until stdin closes; returns the request in a rank, None in the server at EOF."""
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid_r, pid_w = os.pipe()
        helper = os.fork()
        if helper == 0:  # the helper: fork the rank and exit (the rank is re-parented to the client)
            helper_pid = os.getpid()
            if os.fork() == 0:  # the rank: its own session first, then its PID to the server (its process group id)
                os.setsid()
                os.write(pid_w, str(os.getpid()).encode())
                for fd in (pid_r, pid_w, reply_fd):
                    os.close(fd)
                while os.getppid() == helper_pid:  # run nothing before it is the client's child
                    time.sleep(0.001)
                return req
            os._exit(0)
        os.close(pid_w)
        with os.fdopen(pid_r, "rb") as pipe:  # EOF once the helper is gone and the rank closed its end
            rank = int(pipe.read())
        os.waitpid(helper, 0)  # the helper is reaped, so the rank is the client's child now: answer
        os.write(reply_fd, (json.dumps({"id": req["id"], "pid": rank}) + "\n").encode())
    return None


def main() -> None:
    """Preload, check, serve; in a rank, run the script or module as ``__main__``."""
    reply_fd = int(sys.argv[sys.argv.index("--reply_fd") + 1])
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the server dies with its client (a fork does not inherit this)
    _preload()
    if (threads := len(os.listdir("/proc/self/task"))) != 1:
        raise SystemExit(f"rank_server: {threads} threads after the imports; forking would be unsafe")
    gc.freeze()  # the imported objects leave the collector's view, so no rank's collection touches (copies) them
    os.write(reply_fd, b'{"ready": true}\n')
    req = serve(reply_fd)
    if req is None:
        return
    _become_rank(req)
    import runpy

    argv = req["argv"]
    if argv[0] == "-m":  # python -m MODULE ARGS: sys.path[0] is the working folder
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:  # python SCRIPT ARGS: sys.path[0] is the script's folder
        sys.argv = [os.path.abspath(argv[0]), *argv[1:]]
        sys.path[0] = os.path.dirname(sys.argv[0])
        runpy.run_path(sys.argv[0], run_name="__main__")


# --- the client (imported by conftest.py) ---


class ForkedRank:
    """A rank forked by the server and re-parented to this process (``growlm.runtime.launch.RankProcess``)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def wait(self) -> int:
        """Reap the rank (this process's child: it is a child subreaper)."""
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


class RankServer:
    """The client: starts the server (``python tests/rank_server.py``) and asks it for ranks."""

    def __init__(self) -> None:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        self._lock = threading.Lock()
        read_fd, write_fd = os.pipe()
        self._replies = os.fdopen(read_fd, "rb", buffering=0)
        self.log = Path(os.environ.get("TMPDIR", "/tmp")) / f"growlm-rank-server-{os.getpid()}.log"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
        with open(self.log, "w") as log:
            self._proc = subprocess.Popen(
                [sys.executable, __file__, "--reply_fd", str(write_fd)], stdin=subprocess.PIPE, stdout=log,
                stderr=subprocess.STDOUT, pass_fds=(write_fd,), env=env, cwd=Path(__file__).parent,
            )  # fmt: skip
        os.close(write_fd)
        self._buf = b""
        self._next_id = 0
        self.broken = False  # set when the server failed to answer: later ranks start fresh
        try:
            self._reply(timeout=300)  # {"ready": true} once the imports are done
        except RuntimeError:
            self.close()
            raise

    def _reply(self, timeout: float) -> dict:
        """The server's next answer line; RuntimeError with its log when it died or stayed silent (the server is
        then stopped and marked ``broken``)."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._replies], [], [], max(0.0, left))
            chunk = self._replies.read(4096) if ready else b""
            if not chunk:
                self._give_up("died" if ready else f"stayed silent for {timeout:g} s")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def _give_up(self, why: str) -> NoReturn:
        """Mark the server ``broken``, stop it, and raise RuntimeError with ``why`` and its log."""
        self.broken = True
        self._proc.kill()
        self._proc.wait()
        raise RuntimeError(f"the tests' rank fork server {why}; later ranks start fresh; its log:\n"
                           f"{self.log.read_text()}")  # fmt: skip

    def fork(self, argv: list[str], env: dict[str, str], cwd: str | os.PathLike | None,
             log: Path) -> ForkedRank | None:  # fmt: skip
        """Fork ``argv`` (``SCRIPT ARGS`` or ``-m MODULE ARGS``) as a rank in its own session, output to ``log``;
        None when the server is ``broken`` (start it fresh instead)."""
        cwd = os.path.abspath(cwd or os.getcwd())
        open(log, "w").close()  # noqa: SIM115  (OSError here, as a fresh start's open would raise)
        if not os.path.isdir(cwd):
            raise (NotADirectoryError if os.path.exists(cwd) else FileNotFoundError)(2, "no such folder", cwd)
        umask = os.umask(0)
        os.umask(umask)
        with self._lock:
            if self.broken:
                return None
            self._next_id += 1
            req = {"id": self._next_id, "argv": argv, "env": dict(env), "cwd": cwd, "log": os.path.abspath(log),
                   "umask": umask}  # fmt: skip
            try:
                self._proc.stdin.write((json.dumps(req) + "\n").encode())
                self._proc.stdin.flush()
            except OSError:  # the server is gone (a broken pipe)
                self._give_up("died")
            while (answer := self._reply(timeout=60)).get("id") != req["id"]:
                pass  # the late answer to a request that timed out
            return ForkedRank(answer["pid"])

    def close(self) -> None:
        """Stop the server (end of its input), close its pipes and remove its log; ranks still running are not
        touched."""
        try:
            self._proc.stdin.close()  # EOF: the server returns from serve() and exits
        except OSError:  # a dead server: the pipe is broken
            pass
        if self._proc.poll() is None:
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._replies.close()
        self.log.unlink(missing_ok=True)


class _NoServer:
    """Stands for a server that failed to start: every rank starts fresh."""

    broken = True

    def close(self) -> None:
        pass


_NO_SERVER = _NoServer()
_SERVER: RankServer | _NoServer | None = None


def forkable(argv: list[str]) -> bool:
    """Whether ``argv`` is this interpreter running a ``.py`` script or ``-m MODULE`` (what the server can fork)."""
    if len(argv) < 2 or Path(argv[0]) != Path(sys.executable):
        return False
    return argv[1].endswith(".py") or (argv[1] == "-m" and len(argv) > 2)


def make_start_rank(fresh):
    """A ``growlm.runtime.launch.start_rank`` that forks what ``forkable`` accepts and calls ``fresh`` otherwise;
    the server starts on first use (~10 s) and stops at interpreter exit."""

    def start_rank(argv: list[str], env: dict[str, str], cwd: str | os.PathLike | None, log_path: Path):
        global _SERVER
        if not forkable(argv) or env.get("DS_ACCELERATOR") != "cpu":  # the server's DeepSpeed chose the CPU
            return fresh(argv, env, cwd, log_path)
        if _SERVER is None:
            try:
                _SERVER = RankServer()
            except RuntimeError as e:  # the server did not start: this session's ranks start fresh
                print(f"rank_server: {e}", file=sys.stderr)
                _SERVER = _NO_SERVER
            import atexit  # lazy: only once a server was asked for

            atexit.register(_SERVER.close)
        rank = None if _SERVER.broken else _SERVER.fork(argv[1:], env, cwd, log_path)
        return fresh(argv, env, cwd, log_path) if rank is None else rank

    return start_rank


if __name__ == "__main__":
    main()
