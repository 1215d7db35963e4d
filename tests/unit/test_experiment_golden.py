"""Golden tests: every committed experiment under eval/results/isoflop*/ is rebuilt from its committed curves alone
(``growlm-experiment --report_only`` on a copy holding only the inputs: curves, pre-registrations, a spec file and
the curves it imports), and what it writes equals the committed files byte for byte; the pre-registration files are
left untouched. These tests keep every committed figure reproducible while the experiment code changes under it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from dist_utils import REPO

from growlm.eval.experiments import cli as experiment

RESULTS = REPO / "eval" / "results"

# experiment folder -> (the input files and folders a rebuild reads, the files it must rebuild byte for byte)
GOLDEN = {
    "isoflop": (["curves"], ["results.json", "report.md"]),
    "isoflop_map": (["curves"], ["map.json", "map.md"]),
    "isoflop_optimal": (["curves", "refine/curves"], ["results.json", "report.md"]),
    # the wide envelope, re-expressed as a spec: its pre-registration (an earlier protocol's) is read, never written
    "isoflop_optimal/wide": (["experiment.yaml", "preregistration.json", "curves", "../curves", "../refine/curves"],
                             ["results.json", "report.md"]),
    # a spec-file experiment: its spec, pre-registration and curves, and the earlier experiments' curves it imports
    "isoflop_optimum": (["experiment.yaml", "preregistration.json", "curves", "../isoflop_optimal/curves",
                         "../isoflop_optimal/refine/curves", "../isoflop_optimal/wide/curves"],
                        ["results.json", "report.md"]),
}  # fmt: skip
PLOTS = {"isoflop": ["loss_vs_flops.png", "lr_sweep.png", "deltas.png"], "isoflop_map": ["map.png"]}


def _argv(name: str, out: Path) -> list[str]:
    """The command line that rebuilds the experiment ``name`` into ``out``."""
    if name == "isoflop_map":
        return ["--phase", "map", "--report_only", "--out", str(out)]
    if (out / "experiment.yaml").is_file():
        return ["--spec", str(out / "experiment.yaml"), "--report_only"]
    if name == "isoflop_optimal":
        return ["--phase", "optimal", "--map", str(RESULTS / "isoflop_map"), "--report_only", "--out", str(out)]
    return ["--report_only", "--out", str(out)]


def _copy_inputs(name: str, out: Path) -> None:
    for rel in GOLDEN[name][0]:
        src, dst = RESULTS / name / rel, out / rel
        if not src.exists() and rel == "curves":  # a spec-file experiment before its first run finished
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_a_committed_experiment_is_rebuilt_byte_for_byte_from_its_curves(name, tmp_path):
    out = tmp_path / name
    _copy_inputs(name, out)
    inputs = {rel: (out / rel).read_bytes() for rel in GOLDEN[name][0] if (out / rel).is_file()}
    for rel in GOLDEN[name][1]:
        assert not (out / rel).exists()  # nothing of the report is copied: the rebuild writes it
    assert experiment.main(_argv(name, out)) == 0
    for rel in GOLDEN[name][1]:
        got, want = (out / rel).read_bytes(), (RESULTS / name / rel).read_bytes()
        assert got == want, f"{name}/{rel} rebuilt differs from the committed file"
    for rel, data in inputs.items():  # the pre-registration is read, never rewritten
        assert (out / rel).read_bytes() == data
    for rel in PLOTS.get(name, []):  # redrawn (not compared byte for byte: matplotlib's output may change)
        assert (out / rel).stat().st_size > 10_000


def test_every_committed_experiment_has_a_golden_test():
    folders = {p.name for p in RESULTS.glob("isoflop*") if p.is_dir()}
    folders |= {str(p.parent.relative_to(RESULTS)) for p in RESULTS.glob("isoflop*/**/experiment.yaml")}
    assert folders == set(GOLDEN)
