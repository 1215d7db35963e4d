"""Time and peak memory of growing a training state (fp32 weights + Adam moments) into a GPT2_base-sized one (124M
parameters), per operator, on CPU in a single process.

    python -m growlm.eval.bench.growth_ops --out bench.json [--only NAME]

Each operator runs in its own subprocess so that its peak RSS (``resource.getrusage``) is its own. The old state is
random (values do not change the cost); ``grow_state(..., release=True)`` frees old tensors as they are consumed.
Reported: seconds of ``grow_state``, process peak RSS, RSS before growing (old state built), and the old / new state
sizes (3 fp32 tensors per parameter). Units: s, MiB.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

from growlm.growth.ops import make_rules
from growlm.growth.ops.rules import param_shapes
from growlm.growth.ops.single_process import TrainingState, grow_state
from growlm.growth.ops.stores import ParamState
from growlm.model.config import from_preset
from growlm.runtime.commands import HelpFormatter, add_version
from growlm.runtime.process_memory import peak_rss_bytes, rss_bytes

# name: (old preset, target preset or overrides, family, options)
SCENARIOS = {
    "dup-width-x2-block": ("GPT2_base_div2_width", "GPT2_base", "duplicate", {}),
    "dup-width-x2-split": ("GPT2_base_div2_width", "GPT2_base", "duplicate", {"pattern": "split"}),
    "dup-depth-x2-exact": ("GPT2_base_div2_depth", "GPT2_base", "duplicate", {}),
    "dup-width+depth-x2": ("GPT2_base_div2_width_div2_depth", "GPT2_base", "duplicate", {}),
    "dup-ffn-net2net-2304-3072": (("GPT2_base", {"n_inner": 2304}), "GPT2_base", "duplicate", {}),
    "msg-width-384-768": ("GPT2_base_div2_width", "GPT2_base", "masked", {}),
    "msg-depth-6-12": ("GPT2_base_div2_depth", "GPT2_base", "masked", {}),
    "msg-all-dims": ("GPT2_base_div2_width_div2_depth", "GPT2_base", "masked", {}),
}


def _cfg(spec):
    return from_preset(spec[0], **spec[1]) if isinstance(spec, tuple) else from_preset(spec)


def _rss_mib() -> float:
    return peak_rss_bytes() / 2**20


def _current_rss_mib() -> float:
    return rss_bytes() / 2**20


def run_one(name: str) -> dict[str, float | str]:
    """Grow a random GPT2_base-sized training state (fp32 weights and both moments) by operator ``name`` in this
    process; seconds and peak RSS bytes."""
    old_spec, new_spec, family, opts = SCENARIOS[name]
    old, new = _cfg(old_spec), _cfg(new_spec)
    torch.manual_seed(0)
    params = {}
    for pname, shape in param_shapes(old).items():
        params[pname] = ParamState(torch.randn(shape) * 0.02, torch.randn(shape) * 1e-4, torch.rand(shape) * 1e-8)
    state = TrainingState(config=old, params=params, adam_step=1000)
    n_old = sum(p.weight.numel() for p in params.values())
    before = _current_rss_mib()
    t0 = time.perf_counter()
    plan = make_rules(old, new, family, **opts)
    grown = grow_state(state, plan, release=True)
    seconds = time.perf_counter() - t0
    n_new = sum(p.weight.numel() for p in grown.params.values())
    return {
        "op": name,
        "from": old.shape_str(),
        "to": new.shape_str(),
        "seconds": round(seconds, 2),
        "peak_rss_mib": round(_rss_mib()),
        "rss_before_mib": round(before),
        "old_state_mib": round(3 * 4 * n_old / 2**20),
        "new_state_mib": round(3 * 4 * n_new / 2**20),
        "new_params_m": round(n_new / 1e6, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.prog = "python -m growlm.eval.bench.growth_ops"
    ap.formatter_class = HelpFormatter  # every flag's default in --help
    add_version(ap)
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--only", help="run one operator in this process (used by the driver)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.only:
        print(json.dumps(run_one(args.only)))
        return
    rows = []
    for name in SCENARIOS:
        out = subprocess.run(
            [sys.executable, "-m", "growlm.eval.bench.growth_ops", "--only", name, "--threads", str(args.threads)],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(
            f"{r['op']:28s} {r['from']:34s} -> {r['new_params_m']:6.1f}M  {r['seconds']:6.2f} s  "
            f"peak {r['peak_rss_mib']:6d} MiB (before {r['rss_before_mib']}, old {r['old_state_mib']}, "
            f"new {r['new_state_mib']})",
            flush=True,
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
