"""Every flag a console command shows in --help is used by some test.

The parsers are the commands' own (each module's ``build_parser``); setup.py's console scripts must all be listed
here. A flag counts as used when its exact option string (``--keep_runs``, not a prefix of a longer one) appears in
a test file under tests/ other than this one. ``SET_ELSEWHERE`` names the test file of a flag that a test builds
from a variable (f"--{name}"); each entry must still name the flag's bare name there, and an entry that the text
search already finds is stale and fails.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


def _parsers() -> dict[str, list[Callable[[], argparse.ArgumentParser]]]:
    from growlm import train
    from growlm.data import build_corpus, prepare
    from growlm.eval.bench import gpu_check, throughput
    from growlm.eval.experiments import cli as experiment
    from growlm.eval.metrics import cli as eval_cli
    from growlm.growth.offline import cli as grow_checkpoint
    from growlm.trainer.driver import cli as driver_cli

    return {
        "growlm-train": [train.build_parser],
        "growlm-prepare": [prepare.build_parser],
        "growlm-build-corpus": [build_corpus.build_parser],
        "growlm-grow": [grow_checkpoint.build_parser],
        "growlm-run": [driver_cli.build_parser],
        "growlm-eval": [eval_cli.build_parser],
        "growlm-experiment": [experiment.build_parser],
        "growlm-bench": [throughput.build_parser],
        "growlm-gpu-check": [gpu_check.build_parser],
    }


# (command, option string) -> the test file (relative to tests/) that sets it through a variable
SET_ELSEWHERE: dict[tuple[str, str], str] = {}


def _flags() -> list[tuple[str, str]]:
    """(command, option string) of every flag --help shows (argparse's own -h/--help and hidden flags left out)."""
    out = []
    for command, builders in _parsers().items():
        for build in builders:
            for action in build()._actions:
                if (
                    isinstance(action, argparse._HelpAction)
                    or action.dest == "help"
                    or action.help == argparse.SUPPRESS
                ):
                    continue
                out += [(command, o) for o in action.option_strings]
    return sorted(set(out))


def _test_sources() -> dict[Path, str]:
    me = Path(__file__).resolve()
    return {p: p.read_text(encoding="utf-8") for p in sorted(TESTS.rglob("*.py")) if p.resolve() != me}


def _used(option: str, sources: dict[Path, str]) -> list[Path]:
    pattern = re.compile(r"(?<![\w-])" + re.escape(option) + r"(?![\w-])")
    return [p for p, text in sources.items() if pattern.search(text)]


def test_every_console_script_has_its_parser_here():
    setup = (REPO / "setup.py").read_text()
    scripts = set(re.findall(r'"(growlm-[\w-]+) = [\w.]+:main"', setup))
    assert scripts == set(_parsers()), "add the new command's build_parser to _parsers()"


def test_the_option_search_matches_whole_flags_only():
    sources = {Path("a.py"): 'main(["--out_dir", "x", "--seeds", "2"])', Path("b.py"): "f'--out {d}'"}
    assert _used("--out", sources) == [Path("b.py")]  # not --out_dir
    assert _used("--seed", sources) == []  # not --seeds
    assert _used("--seeds", sources) == [Path("a.py")]


def test_flag_list_is_the_help_of_each_command():
    flags = _flags()
    assert ("growlm-bench", "--keep_runs") in flags and ("growlm-grow", "--export_hf") in flags
    assert ("growlm-experiment", "--phase") in flags and ("growlm-experiment", "--report_only") in flags
    assert ("growlm-train", "--local_rank") not in flags  # hidden from --help (set by the deepspeed launcher)
    assert not [f for f in flags if f[1] in ("-h", "--help")]
    assert len({c for c, _ in flags}) == len(_parsers())  # every command has flags


def test_every_help_flag_is_used_by_a_test():
    sources = _test_sources()
    missing = [f"{c} {o}" for c, o in _flags() if not _used(o, sources) and (c, o) not in SET_ELSEWHERE]
    assert not missing, "flags no test uses (add a test that sets each and asserts its effect): " + ", ".join(missing)


def test_set_elsewhere_entries_are_needed_and_true():
    flags, sources = _flags(), _test_sources()
    for (command, option), test_file in SET_ELSEWHERE.items():
        assert (command, option) in flags, f"{command} has no flag {option}"
        assert not _used(option, sources), f"{option} is found by the text search: remove its SET_ELSEWHERE entry"
        text = (TESTS / test_file).read_text(encoding="utf-8")
        assert option.lstrip("-") in text, f"{test_file} does not name {option.lstrip('-')}"
