"""Benchmark: the memory one grown parameter takes while its rule runs, in bytes per grown element.

A live growth expands one parameter at a time (growth.live.transfer); the memory checks count that parameter's
working memory as ``runtime.memory.GROWN_PARAM_BYTES`` per element of its grown numel. This measures it: for each
operator (width x2 plain, with symmetry noise and split; FFN x2; depth x2; masked width x2) the two largest grown
parameters of a GPT (2 x 512, 16,384-token vocabulary; millions of elements each) are grown with
``growth.ops.apply.grow_param`` (fp32 weight, exp_avg, exp_avg_sq), and the process's resident high-water mark above
its resident memory just before (VmHWM, reset by writing 5 to ``/proc/self/clear_refs``) is divided by the grown
numel. Each case runs in a fresh process, one thread. Prints a table and writes a JSON list. Linux only (the
high-water reset).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import subprocess
import sys
from pathlib import Path

import torch

from growlm.growth.ops import make_rules
from growlm.growth.ops.apply import OptimizerPolicy, grow_param
from growlm.growth.ops.rules import param_shapes
from growlm.growth.ops.stores import ParamState
from growlm.model.config import GPTConfig
from growlm.runtime.commands import HelpFormatter, add_version
from growlm.runtime.memory import GROWN_PARAM_BYTES
from growlm.runtime.process_memory import peak_rss_bytes, reset_peak_rss, rss_bytes

OLD = dict(n_layer=2, n_embd=512, n_head=8, vocab_size=16384, n_positions=64)
CASES = {  # name: (target overrides, make_rules options)
    "width x2": ({"n_embd": 1024, "n_head": 16}, {}),
    "width x2, noise": ({"n_embd": 1024, "n_head": 16}, {"symmetry": "noise"}),
    "width x2, split": ({"n_embd": 1024, "n_head": 16}, {"pattern": "split", "alpha": 0.75}),
    "ffn x2": ({"n_inner": 4096}, {}),
    "depth x2": ({"n_layer": 4}, {}),
    "masked width x2": ({"n_embd": 1024, "n_head": 16}, {"family": "masked"}),
}


def measure(case: str) -> dict:
    """Grow every parameter of the case's plan whose grown form is the largest, in this process; bytes per grown
    element at the peak."""
    torch.set_num_threads(1)
    over, opts = CASES[case]
    opts = dict(opts)
    family = opts.pop("family", "duplicate")
    old, new = GPTConfig(**OLD), GPTConfig(**{**OLD, **over})
    plan = make_rules(old, new, family, **opts)
    old_shapes, new_shapes = param_shapes(old), param_shapes(new)
    rows = []
    for name in sorted(plan.rules, key=lambda n: -math.prod(new_shapes[n]))[:2]:
        rule = plan.rules[name]
        src = old_shapes[rule.source or name]
        st = ParamState(torch.randn(src), torch.randn(src), torch.rand(src))
        gc.collect()
        base = rss_bytes()
        if not reset_peak_rss():
            raise OSError("/proc/self/clear_refs refused the peak reset; this benchmark needs Linux")
        grown = grow_param(rule, st, OptimizerPolicy())
        peak = peak_rss_bytes() - base
        n = grown.weight.numel()
        rows.append({"case": case, "param": name, "grown_numel": n, "peak_bytes_per_element": round(peak / n, 2)})
        del grown, st
    return {"case": case, "params": rows, "max_bytes_per_element": max(r["peak_bytes_per_element"] for r in rows)}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m growlm.eval.bench.grow_param_peak",
        description=__doc__.split("\n\n")[0],
        formatter_class=HelpFormatter,
    )
    add_version(p)
    p.add_argument("--out", default=str(Path("runs") / "bench" / "grow_param_peak.json"), help="JSON file of the rows")
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES), help="operators to measure")
    p.add_argument("--case", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.case:
        print(json.dumps(measure(args.case)))
        return 0
    rows = []
    for case in args.cases:
        cmd = [sys.executable, "-m", "growlm.eval.bench.grow_param_peak", "--case", case]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{case:18s} {r['max_bytes_per_element']:6.1f} bytes per grown element at the peak "
              f"(counted: {GROWN_PARAM_BYTES}); " + ", ".join(f"{p['param']} {p['peak_bytes_per_element']:.1f}"
                                                      for p in r["params"]), flush=True)  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
