"""Stress check (not part of the suite): do finished 2-rank processes ever abort at exit?

    python tests/stress_exit.py [--runs 30] [--what probe train] [--out FILE.json]

Repeats two real 2-rank jobs on loopback (gloo, CPU, one thread per rank) and counts the runs in which a rank ended
with a signal (exit status < 0, e.g. -6 for SIGABRT) or printed "terminate called": the abort a joinable C++
thread caused at interpreter teardown before process groups were freed at close (DESIGN.md, "DeepSpeed facts").

* ``probe``: tests/growth_memory_probe.py at ZeRO-2 fp32, four live growths (the job that aborted in CI);
* ``train``: train.py, tiny preset, 4 steps at ZeRO-3 fp32 with a final checkpoint.

Prints one line per run and the totals (``aborts: 0`` is the pass); ``--out`` also writes them as JSON. Takes
about 15-25 s per run on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dist_utils import REPO, run_ranks  # noqa: E402


def job(what: str, work: Path) -> list[str]:
    """(script, arguments) of one run of ``what`` writing into ``work``."""
    if what == "probe":
        return ["tests/growth_memory_probe.py", "ds_configs/zero2_fp32.json", "grow", str(work / "memory.json")]
    return ["train.py", "--preset", "tiny", "--seq_len", "32", "--max_steps", "4", "--no_final_eval",
            "--ds_config", "ds_configs/zero3_fp32.json", "--out_dir", str(work / "run")]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=30, help="runs of each job")
    p.add_argument("--what", nargs="+", choices=["probe", "train"], default=["probe", "train"], help="jobs to run")
    p.add_argument("--out", default=None, help="also write the per-run results here (JSON)")
    args = p.parse_args(argv)
    results = []
    for what in args.what:
        for i in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="growlm-stress-") as tmp:
                script, *rest = job(what, Path(tmp))
                t0 = time.perf_counter()
                r = run_ranks(rest, script=script, timeout=600)
                seconds = time.perf_counter() - t0
            aborted = r.returncode < 0 or "terminate called" in r.stdout
            failed = r.returncode != 0
            results.append({"job": what, "run": i, "returncode": r.returncode, "aborted": aborted, "seconds": seconds})
            tail = r.stdout[-600:].replace("\n", " | ") if failed or aborted else ""
            print(
                f"{what} {i + 1}/{args.runs}: exit {r.returncode}, {seconds:.1f} s{' ABORT' if aborted else ''} {tail}"
            )
            sys.stdout.flush()
    summary = {
        what: {
            "runs": sum(r["job"] == what for r in results),
            "aborts": sum(r["aborted"] for r in results if r["job"] == what),
            "failures": sum(r["returncode"] != 0 for r in results if r["job"] == what),
        }
        for what in args.what
    }
    total = sum(s["aborts"] for s in summary.values())
    for what, s in summary.items():
        print(f"{what}: {s['runs']} runs, {s['aborts']} aborts, {s['failures']} non-zero exits")
    print(f"aborts: {total}")
    if args.out:
        Path(args.out).write_text(json.dumps({"repo": REPO.name, "summary": summary, "runs": results}, indent=1))
    return 1 if total or any(s["failures"] for s in summary.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
