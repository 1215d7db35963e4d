"""growlm-experiment end to end: --quick through the pilot and the main runs in 2 worker processes, resumed from
--phase pilot, rerun without training, and --report_only from a copy of the curves alone (the report,
results.json and the plots rebuilt number for number); and the GPU profile's pilot on this CPU at toy size."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from pathlib import Path

import pytest

from growlm.eval.experiments import cli as experiment

ARM_FIELDS = {
    "arm",
    "n_seeds",
    "delta_vs_envelope_mean",
    "delta_vs_envelope_ci95_low",
    "delta_vs_envelope_ci95_high",
    "saving_vs_envelope_mean",
    "saving_vs_same_size_mean",
    "saving_vs_same_size_ci95_low",
    "wall_s_mean",
}


def _mtimes(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (out / "curves").glob("*/*.json")}


def test_quick_experiment_pilot_then_main_then_nothing_to_rerun(tmp_path, small_vocab_data, capsys):
    out = tmp_path / "q"
    argv = ["--quick", "--out", str(out), "--data", str(small_vocab_data), "--parallel", "2"]
    assert experiment.main([*argv, "--phase", "pilot"]) == 0
    assert "pilot complete" in capsys.readouterr().out
    assert not (out / "curves" / "main").exists() and not (out / "results.json").exists()
    pilot = _mtimes(out)
    assert experiment.main(argv) == 0  # resumes: the pilot's curves are kept, the main runs added
    after = _mtimes(out)
    assert {k: after[k] for k in pilot} == pilot and len(after) > len(pilot)
    res = json.loads((out / "results.json").read_text())
    arms = {"depth-x2": "L4", "multi-1-2-4": "L4", "gstack-x4": "L4", "width-x2": "L4", "msg-depth": "L4",
            "depth-1-2": "L2"}  # fmt: skip
    assert {a["arm"]: a["final_size"] for a in res["arms"]} == arms
    for a in res["arms"]:
        assert ARM_FIELDS <= set(a) and a["n_seeds"] == 2
        assert a["delta_vs_envelope_ci95_low"] <= a["delta_vs_envelope_mean"] <= a["delta_vs_envelope_ci95_high"]
        assert a["beats_envelope"] == (a["delta_vs_envelope_ci95_high"] < 0)
        assert a["wall_s_mean"] > 0
    assert set(res["envelope"]) == {"0.25", "0.5", "1.0", "2.0"}
    assert all(e["loss"] == min(e["losses"].values()) for e in res["envelope"].values())
    assert set(res["lr_sweep"]) == {*res["settings"]["sizes"], *(a["arm"] for a in res["arms"])}
    assert all(len(sw) >= 3 for sw in res["lr_sweep"].values())
    for png in ("loss_vs_flops.png", "lr_sweep.png", "deltas.png"):
        assert (out / png).stat().st_size > 10_000
    assert "**Verdict.**" in (out / "report.md").read_text()
    capsys.readouterr()
    assert experiment.main([*argv, "--dry_run"]) == 0
    assert "0 runs" in capsys.readouterr().out  # nothing left to run
    assert experiment.main(argv) == 0  # a rerun trains nothing and writes the same numbers
    assert _mtimes(out) == after and json.loads((out / "results.json").read_text()) == res
    # --report_only from the curves alone (no token folder): the same results.json and report.md, number for number
    shutil.copytree(out / "curves", tmp_path / "copy" / "curves")
    assert experiment.main(["--quick", "--report_only", "--out", str(tmp_path / "copy")]) == 0
    assert json.loads((tmp_path / "copy" / "results.json").read_text()) == res
    assert (tmp_path / "copy" / "report.md").read_text() == (out / "report.md").read_text()
    for png in ("loss_vs_flops.png", "lr_sweep.png", "deltas.png"):
        assert (tmp_path / "copy" / png).stat().st_size > 10_000


def test_the_gpu_profile_pipeline_runs_its_pilot_on_a_cpu_at_toy_size(tmp_path, small_vocab_data, capsys):
    """--profile gpu --quick --device cpu: the GPU profile's code path (its settings, 8-run default overridden) on
    this CPU; every curve records the profile, the device it ran on and the machine that timed it."""
    out = tmp_path / "g"
    argv = ["--profile", "gpu", "--quick", "--device", "cpu", "--parallel", "2", "--out", str(out), "--data",
            str(small_vocab_data), "--phase", "pilot"]  # fmt: skip
    assert experiment.main(argv) == 0
    assert "pilot complete" in capsys.readouterr().out
    recs = [json.loads(p.read_text()) for p in (out / "curves" / "pilot").glob("*.json")]
    assert len(recs) > 30 and not (out / "curves" / "main").exists()
    assert {(r["settings"]["profile"], r["settings"]["device"]) for r in recs} == {("gpu-quick", "cpu")}
    assert len({r["curve"]["machine"] for r in recs}) == 1 and "cores" in recs[0]["curve"]["machine"]
    assert experiment.main([*argv[:-2], "--dry_run"]) == 0  # the main runs come next, at 2 seeds
    assert capsys.readouterr().out.splitlines()[0].startswith("main ")


@pytest.fixture(scope="module")
def quick_map(tmp_path_factory, small_vocab_data) -> tuple[Path, list[str], str]:
    """The quick crossover map, run once for the module (the optimal phase reads only its map.json): (its --out,
    its arguments, what it printed)."""
    out = tmp_path_factory.mktemp("quick_map") / "map"
    argv = ["--quick", "--phase", "map", "--out", str(out), "--data", str(small_vocab_data), "--parallel", "2"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert experiment.main(argv) == 0
    return out, argv, printed.getvalue()


def test_quick_crossover_map_runs_its_rounds_resumes_and_rebuilds_from_its_curves(tmp_path, quick_map, capsys):
    out, argv, printed = quick_map
    assert "map round 1: 0 runs done, 15 to run" in printed  # five sizes, three LRs each at the tuned budget
    assert re.search(r"map round 2: .* about \d+(\.\d)? (s|min|h) left\)", printed)  # estimated from finished runs
    r = json.loads((out / "map.json").read_text())
    assert r["protocol"] == "isoflop-map-v1" and r["budgets"] == [0.5, 1.0, 2.0]
    assert set(r["crossovers"]) == {"L1->L2", "L2->L4", "L4->L8", "L4n->L4"}
    for c in r["crossovers"].values():
        assert c["flag"] in ("", "below", "beyond")
        assert all(b is None or b in r["budgets"] for b in c["bracket"])
    for z in r["sizes"].values():
        assert set(z["points"]) == {"0.5", "1", "2"}
        assert all(0 < p["epochs"] < 2 and p["wall_s"] > 0 for p in z["points"].values())
        assert r["envelope"]["1"]["loss"] <= z["points"]["1"]["loss"]
    assert (out / "map.png").stat().st_size > 10_000 and "## Crossovers" in (out / "map.md").read_text()
    runs = _mtimes(out)
    assert len(runs) == r["runs"] >= 25
    assert experiment.main(argv) == 0 and _mtimes(out) == runs  # nothing left to run
    shutil.copytree(out / "curves", tmp_path / "copy" / "curves")
    assert experiment.main(["--quick", "--phase", "map", "--report_only", "--out", str(tmp_path / "copy")]) == 0
    assert json.loads((tmp_path / "copy" / "map.json").read_text()) == r
    assert (tmp_path / "copy" / "map.md").read_text() == (out / "map.md").read_text()
    # the envelope experiment refuses the map's curves: another protocol, never mixed in
    capsys.readouterr()
    assert experiment.main(["--quick", "--report_only", "--out", str(tmp_path / "copy")]) == 2
    assert "other settings" in capsys.readouterr().err


def test_quick_optimal_phase_runs_pilot_main_and_levers_from_a_map_and_rebuilds_from_its_curves(
    tmp_path, small_vocab_data, quick_map, capsys
):
    """--phase optimal --quick on a quick map, the target and B given by flags (the toy map has no growth target):
    the rounds run in 2 workers, results.json has every field of the claim, a rerun trains nothing, --dry_run lists
    nothing, and --report_only on a copy of the curves rebuilds results.json and report.md number for number."""
    data = ["--data", str(small_vocab_data), "--parallel", "2"]
    out = tmp_path / "opt"
    argv = ["--quick", "--phase", "optimal", "--map", str(quick_map[0]), "--target", "L2", "--budget", "1",
            "--out", str(out), *data]  # fmt: skip
    assert experiment.main(argv) == 0
    printed = capsys.readouterr().out
    assert "optimal round 1: 0 runs done" in printed and "report in" in printed
    r = json.loads((out / "results.json").read_text())
    assert (r["protocol"], r["target"], r["budget_C"]) == ("isoflop-optimal-v1", "L2", 1.0)
    assert r["chosen_by"].startswith("flags") and r["primary_arm"] in {a["arm"] for a in r["arms"]}
    assert r["budget_flops"] == r["C_flops"] and r["n_seeds"] == 2 and set(r["envelope"]) == {"0.25", "0.5", "1"}
    stages = {"depth-x2": ["L1", "L2"], "gstack-x2": ["L1", "L2"], "width-x2": ["L2n", "L2"], "msg-depth": ["L1", "L2"]}
    assert {a["arm"]: a["stages"] for a in r["arms"]} == stages
    for a in r["arms"]:
        assert ARM_FIELDS <= set(a) and a["n_seeds"] == 2
        assert a["delta_vs_envelope_ci95_low"] <= a["delta_vs_envelope_mean"] <= a["delta_vs_envelope_ci95_high"]
        assert len(a["delta_vs_envelope_per_seed"]) == 2
    # the LR lever joins when the primary arm's best LR sits at an end of its widened grid
    assert len(r["levers"]) == 6 + (r["primary_arm"] in r["lr_at_edge"]) and all(lv["loss"] > 0 for lv in r["levers"])
    curves = _mtimes(out)
    assert set(r["epochs"]) == {Path(n).stem for n in curves} and all(0 < e < 2 for e in r["epochs"].values())
    # the sizes between the ladder's (none where the comparator is L1: its midpoint with L2 rounds onto L1)
    rf, refined = r["refine"], _mtimes(out / "refine")
    assert rf["complete"] and bool(rf["sizes"]) == bool(refined) and rf["runs_not_run"] == []
    # the grown width arm's first stage is the half-width size, run only inside that arm
    assert r["settings"]["sizes"]["L2n"] == [2, 8, 1]
    assert experiment.main(argv) == 0 and _mtimes(out) == curves and _mtimes(out / "refine") == refined
    assert experiment.main([*argv, "--dry_run"]) == 0
    printed = capsys.readouterr().out.splitlines()
    i = next(k for k, x in enumerate(printed) if x.startswith(f"{len(curves)} runs done, 0 to run"))
    assert "then the refine runs" in printed[i + 1]
    assert printed[i + 2].startswith(f"{len(refined)} runs done, 0 to run")
    shutil.copytree(out / "curves", tmp_path / "copy" / "curves")
    if refined:
        shutil.copytree(out / "refine" / "curves", tmp_path / "copy" / "refine" / "curves")
    rebuilt = ["--quick", "--phase", "optimal", "--map", str(quick_map[0]), "--target", "L2", "--budget", "1",
               "--report_only", "--out", str(tmp_path / "copy")]  # fmt: skip
    assert experiment.main(rebuilt) == 0
    assert json.loads((tmp_path / "copy" / "results.json").read_text()) == r
    assert (tmp_path / "copy" / "report.md").read_text() == (out / "report.md").read_text()
    # another design (B) refuses these curves: never mixed in
    capsys.readouterr()
    assert experiment.main([*rebuilt[:8], "2", *rebuilt[9:]]) == 2
    assert "other settings" in capsys.readouterr().err
    # target L4 (envelope L2, L4, L8): a midpoint depth (3 or 6) is new, so the refine runs train, after the levers,
    # in their own folder: the pilot seed's sweep, then both seeds; a rerun trains nothing
    out4 = tmp_path / "opt4"
    argv4 = ["--quick", "--phase", "optimal", "--map", str(quick_map[0]), "--target", "L4", "--budget", "1",
             "--out", str(out4), *data]  # fmt: skip
    assert experiment.main(argv4) == 0 and "refine round 2:" in capsys.readouterr().out
    r4, refined = json.loads((out4 / "results.json").read_text()), _mtimes(out4 / "refine")
    rf = r4["refine"]
    assert rf["complete"] and rf["sizes"] and set(rf["sizes"]) <= {"L3", "L6"} and set(rf["arms"]) == {
        a["arm"] for a in r4["arms"]
    }  # fmt: skip
    assert set(rf["epochs"]) == {Path(n).stem for n in refined} and isinstance(
        r4["primary_arm_beats_refined_envelope"], bool
    )  # fmt: skip
    for z, v in rf["sizes"].items():
        assert sum(n.startswith(f"{z}-") and n.endswith(("-s0.json", "-s1.json")) for n in refined) == 2
        assert len(v["lr_sweep"]) >= 2 and v["loss_at_B_mean"] > 0 and v["shape"][0] in (3, 6)
    assert "## The envelope refined at B" in (out4 / "report.md").read_text()
    assert experiment.main(argv4) == 0 and _mtimes(out4 / "refine") == refined
    for sub in ("curves", "refine/curves"):  # --report_only reads the refine curves too
        shutil.copytree(out4 / sub, tmp_path / "copy4" / sub)
    assert experiment.main([*argv4[:9], "--report_only", "--out", str(tmp_path / "copy4")]) == 0
    assert json.loads((tmp_path / "copy4" / "results.json").read_text()) == r4


# ------------------------------------------------------------------------------------------- spec-file experiments
SPECS = Path(__file__).resolve().parents[2] / "eval" / "experiments" / "specs"


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_spec_runs_every_step_resumes_without_training_and_rebuilds_its_report(
    tmp_path, small_vocab_data, capsys, family
):
    """The toy spec of each family through every planner step in 2 worker processes (real training, real growth),
    then a rerun that trains nothing, then --report_only from a copy of the spec, its pre-registration and curves:
    results.json and report.md byte for byte."""
    out = tmp_path / "e"
    spec = SPECS / f"quick-{family}.yaml"
    argv = ["--spec", str(spec), "--out", str(out), "--data", str(small_vocab_data), "--parallel", "2"]
    assert experiment.main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["family"] == family and res["complete"] and res["optimum"] in res["best_shapes"]
    curves = sorted((out / "curves").glob("*/*.json"))
    recs = [json.loads(f.read_text()) for f in curves]
    grown = [r for r in recs if r["spec"]["arm"]]
    assert grown and all(len(r["curve"]["growth"]) == 1 for r in grown)
    assert all(r["settings"]["model"]["family"] == family for r in recs)
    p = res["primary"]
    assert p["arm"] == res["primary_arm"] and p["n_seeds"] == 2
    lo, hi = p["delta_vs_target"]["ci95"]
    assert lo <= p["delta_vs_target"]["mean"] <= hi
    assert all(abs(r["delta"] - (r["arm_loss"] - r["target_loss"])) <= 2e-5 for r in p["per_seed"])
    pre = json.loads((out / "preregistration.json").read_text())
    assert [f["what"] for f in pre["fixed"]] == ["optimum", "primary_arm"]
    assert pre["fixed"][0]["value"] == res["optimum"] and pre["fixed"][1]["value"]["arm"] == res["primary_arm"]
    before = {f.name: f.stat().st_mtime_ns for f in curves}
    capsys.readouterr()
    assert experiment.main(argv) == 0  # resumed: every run finished, none trains again
    assert "round" not in capsys.readouterr().out
    assert {f.name: f.stat().st_mtime_ns for f in sorted((out / "curves").glob("*/*.json"))} == before
    copy = tmp_path / "copy"
    shutil.copytree(out / "curves", copy / "curves")
    shutil.copy(out / "preregistration.json", copy)
    shutil.copy(spec, copy / "experiment.yaml")
    assert experiment.main(["--spec", str(copy / "experiment.yaml"), "--report_only"]) == 0
    for f in ("results.json", "report.md"):
        want = (out / f).read_text().replace(spec.name, "experiment.yaml")
        assert (copy / f).read_text() == want
    if family != "gpt2":
        return
    # another experiment importing these curves finds every run by what it trains: nothing left to train
    other = tmp_path / "other"
    other.mkdir()
    text = spec.read_text().replace("name: quick-gpt2", "name: quick-again") + f"imports: [{out / 'curves'}]\n"
    (other / "experiment.yaml").write_text(text)
    capsys.readouterr()
    assert (
        experiment.main(["--spec", str(other / "experiment.yaml"), "--data", str(small_vocab_data), "--dry_run"]) == 0
    )
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("0 runs done, 0 to run")
    assert experiment.main(["--spec", str(other / "experiment.yaml"), "--report_only"]) == 0
    again = json.loads((other / "results.json").read_text())
    assert again["optimum"] == res["optimum"] and again["primary"]["per_seed"] == p["per_seed"]
    assert again["runs"]["trained_here"] == 0 and again["runs"]["read"] == res["runs"]["read"]
    # the spec's own curves are refused once the spec says otherwise; so is a lost pre-registration
    (copy / "experiment.yaml").write_text(spec.read_text().replace("batch: 4", "batch: 8"))
    (copy / "preregistration.json").unlink()
    assert experiment.main(["--spec", str(copy / "experiment.yaml"), "--report_only"]) == 2
    assert "was trained with other settings than the spec's now" in capsys.readouterr().err
    shutil.copy(spec, copy / "experiment.yaml")
    argv = ["--spec", str(copy / "experiment.yaml"), "--data", str(small_vocab_data)]
    assert experiment.main(argv) == 2
    assert "preregistration.json is missing while" in capsys.readouterr().err
    (copy / "experiment.yaml").write_text(text.replace(f"imports: [{out / 'curves'}]", "imports: []"))
    empty = tmp_path / "empty"
    assert experiment.main(["--spec", str(copy / "experiment.yaml"), "--out", str(empty), "--report_only"]) == 2
    assert "no finished run of this spec" in capsys.readouterr().err
