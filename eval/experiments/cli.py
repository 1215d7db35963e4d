"""growlm-experiment: the command line of the experiments. ``--protocol`` picks the experiment, whose own parser
reads the other flags: ``equal_compute`` (the default; eval/experiments/equal_compute.py, report by
equal_compute_report.py) or ``equal_steps`` (eval/experiments/staged.py, the older protocol in which every arm stops at
the same step). ``growlm-experiment --help`` shows both parsers.
"""

from __future__ import annotations

import argparse
import json
import sys

from growlm.data.small_vocab import prepare_small_vocab
from growlm.eval.experiments import equal_compute as ec
from growlm.eval.experiments import equal_compute_report as report
from growlm.eval.experiments import staged
from growlm.runtime.commands import add_version

PROTOCOLS = ("equal_compute", "equal_steps")


def build_protocol_parser() -> argparse.ArgumentParser:
    """growlm-experiment's first parser: only --protocol, which picks the experiment whose parser reads the rest."""
    pre = argparse.ArgumentParser(
        prog="growlm-experiment",
        add_help=False,
        description="Growth experiments at equal compute or equal steps; --protocol picks one, its own flags follow.",
    )
    pre.add_argument(
        "--protocol", choices=PROTOCOLS, default="equal_compute", help="the experiment (default: %(default)s)"
    )
    pre.add_argument("-h", "--help", action="store_true", help="show this help and every protocol's flags, then exit")
    return add_version(pre)


def run_equal_compute(argv: list[str] | None = None) -> int:
    """growlm-experiment --protocol equal_compute: run the unfinished runs and write the report; exit 1 when a run
    failed, 2 on a flag out of range."""
    args = ec.parse_args(argv)
    problem = ec.check_flags(args)
    if problem:
        print(f"growlm-experiment: error: {problem}", file=sys.stderr)
        return 2
    if args.dry_run:
        meta_file = args.data / "meta.json"
        vocab = json.loads(meta_file.read_text())["vocab_size"] if meta_file.is_file() else args.vocab_size
        for j in ec.plan_jobs(args, vocab):
            steps = j.max_steps or "set when it starts (slope trigger)"
            print(f"{j.key:36s} steps {steps}  growth at {j.grow_steps or '-'}  eval every {j.eval_interval}")
        return 0
    if not (args.data / "meta.json").is_file():
        print(f"growlm-experiment: training a {args.vocab_size}-token BPE and tokenizing into {args.data}", flush=True)
        prepare_small_vocab(args.data, args.vocab_size)
    meta = json.loads((args.data / "meta.json").read_text())
    jobs = ec.plan_jobs(args, meta["vocab_size"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ds_config.json").write_text(json.dumps(ec.ds_config(args), indent=2))
    failed = [] if args.report_only else ec.run_all(args, jobs, meta["vocab_size"])

    rc = report.write_report(args, jobs, meta)
    return 1 if failed else rc


def main(argv: list[str] | None = None) -> int:
    """growlm-experiment: dispatch on ``--protocol`` (``--help`` and ``--version`` describe every protocol)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    pre = build_protocol_parser()
    known, rest = pre.parse_known_args(argv)
    if known.help:
        print(pre.format_help())
        for name, build in (("equal_compute", ec.build_parser), ("equal_steps", staged.build_parser)):
            print(f"\n--protocol {name}:\n")
            print(build().format_help())
        return 0
    if known.protocol == "equal_compute":
        return run_equal_compute(rest)
    return staged.run_equal_steps(rest)


if __name__ == "__main__":
    sys.exit(main())
