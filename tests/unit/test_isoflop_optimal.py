"""The IsoFLOP experiment at the map's budget (eval/experiments/optimal.py) on a fabricated crossover map and
fabricated runs: the design read off the map (B, target, envelope, arms, growth points at the map's crossovers, the
map's LRs), the rounds (pilot, main, levers), the report's fields and its refusals."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from isoflop_helpers import M, S, fake_loss, run_map

from growlm.eval.experiments import crossmap, optimal, optimal_report, plan
from growlm.eval.experiments.protocol import RunSpec

OFFSET = {"depth-x2": -0.02, "multi-1-2-4": 0.01, "gstack-x4": 0.08, "width-x2": 0.05, "msg-depth": 0.0}
BEST_LR: dict[str, float] = {}  # an arm's best LR where it is not 1e-3
MAIN_OFFSET: dict[str, float] = {}  # a size's loss change on the main seeds
REFINE_OFFSET: dict[str, float] = {}  # a size between the ladder's: its loss against the target's at B


@pytest.fixture(scope="module")
def mapped() -> dict:
    done, _, _ = run_map()
    return crossmap.summarize(S, M, done, crossmap.train_windows_of(done))


def fake_run(s, sp: RunSpec) -> float:
    """Scratch runs: the map's surface at B x budget; arms: the target's at B plus the arm's offset; an LR away
    from 1e-3 costs 0.05 nats per factor 2, the re-warm 0.01, a lever 0.005; seeds differ by a few millinats."""
    b = s.design["budget_C"]
    seed = 0.003 * ((sp.seed * 7) % 3)
    if sp.phase == optimal.REFINE:
        near = fake_loss(RunSpec("map", "scratch", 100, b, sp.lr, size=s.target))
        return near + REFINE_OFFSET.get(sp.size, 0.01) + seed
    if sp.kind == "scratch":
        main = MAIN_OFFSET.get(sp.size, 0.0) if sp.phase == "main" else 0.0
        return fake_loss(replace(sp, phase="map", budget=sp.budget * b, seed=100)) + seed + main
    base = fake_loss(RunSpec("map", "scratch", 100, b, 1e-3, size=s.target)) + OFFSET.get(sp.arm, 0.03)
    base += 0.05 * abs(math.log2(sp.lr / BEST_LR.get(sp.arm, 1e-3)))
    return base + seed + (0.01 if sp.policy == "rewarm" else 0.0) + (0.005 if sp.tag else 0.0)


def run_all(s) -> tuple[dict[str, dict], optimal.State, int]:
    done: dict[str, dict] = {}
    rounds = 0
    while True:
        specs, st = optimal.experiment_plan(s, done)
        todo = [sp for sp in dict.fromkeys(specs) if sp.name not in done]
        if not todo:
            return done, st, rounds
        rounds += 1
        for sp in todo:
            done[sp.name] = record(sp, fake_run(s, sp))


def record(sp: RunSpec, loss: float) -> dict:
    growth = [{"loss_before": loss, "loss_after": loss}] * (len(sp.grow_flops))
    curve = {"final": {"val_loss": loss, "val_se": 0.01}, "wall_s": 8.0 * sp.budget, "growth": growth}
    return {"spec": sp, "settings": {"data": {"train_windows": 400_000}}, "curve": curve}


def run_refine(s, st) -> tuple[dict[str, dict], int]:
    done: dict[str, dict] = {}
    rounds = 0
    while True:
        todo = [sp for sp in dict.fromkeys(optimal.refine_plan(s, st, done)[0]) if sp.name not in done]
        if not todo:
            return done, rounds
        rounds += 1
        for sp in todo:
            done[sp.name] = record(sp, fake_run(s, sp))


def test_the_design_follows_the_map_choice(mapped):
    s = optimal.design(S, mapped)
    d = s.design
    # the map chose L4 at 64 C (tests/unit/test_isoflop_map.py); its envelope is L2, L4, L8 and it is their best
    assert (s.target, d["budget_C"], s.c_flops) == ("L4", 64.0, 64.0 * S.c_flops)
    assert d["envelope"] == ["L2", "L4", "L8"] and d["comparator"] == "L4"
    assert optimal.choice_note(s, mapped)["chosen_by"].startswith("the map's rule")
    # the same target and B given by flags are the same design: the curves stay valid
    assert optimal.design(S, mapped, "L4", 64.0).as_dict() == s.as_dict()
    assert s.protocol == optimal.OPTIMAL_PROTOCOL and s.as_dict()["protocol"] == optimal.OPTIMAL_PROTOCOL
    assert "arms" in s.as_dict() and "arms" not in S.as_dict() and "design" not in S.as_dict()
    arms = {a.name: a.stages for a in s.arm_list()}
    # the multi-stage path runs through every size the map found best at some budget up to B: L1 (1-4 C), L2, L4
    assert arms == {"depth-x2": ("L2", "L4"), "multi-1-2-4": ("L1", "L2", "L4"), "gstack-x4": ("L1", "L4"),
                    "width-x2": ("L4n", "L4"), "msg-depth": ("L2", "L4")}  # fmt: skip
    growth, flags = optimal.growth_of(s)
    # each growth at the map's crossover in units of B: L1 -> L2 at 6 C, L2 -> L4 at 24 C; L4n -> L4 crosses below
    # the map's budgets and is kept at the earliest growth point, flagged
    assert [g / s.c_flops for g in growth["multi-1-2-4"]] == pytest.approx([6 / 64, 24 / 64], rel=1e-6)
    assert growth["depth-x2"][0] / s.c_flops == pytest.approx(24 / 64, rel=1e-6)
    assert growth["width-x2"][0] / s.c_flops == plan.GROW_MIN and any("below" in f for f in flags["width-x2"])
    # the envelope's LRs are the map's, tuned at 64 C; the arms' grid is centred on the target's
    assert d["lr_from_map"] == {"L2": 1e-3, "L4": 1e-3, "L8": 1e-3} and s.lrs == (5e-4, 1e-3, 2e-3)
    # the target also past B, where it reads the data at most twice (400,000 windows)
    assert d["same_size_budget"] == 2.0 and s.budgets == (0.25, 0.5, 1.0, 2.0)
    assert optimal.max_train_windows(s) <= 2 * 400_000


def test_a_target_given_by_flags_adds_its_half_width_size_with_a_stand_in_crossover(mapped):
    s = optimal.design(S, mapped, target="L2", budget=16.0)
    assert optimal.choice_note(s, mapped)["chosen_by"].startswith("flags") and s.design["envelope"] == [
        "L1",
        "L2",
        "L4",
    ]
    assert s.sizes["L2n"] == (2, 32, 2) and {a.name: a.stages for a in s.arm_list()}["width-x2"] == ("L2n", "L2")
    assert "gstack-x2" in {a.name for a in s.arm_list()} and not any(a.name.startswith("multi") for a in s.arm_list())
    growth, flags = optimal.growth_of(s)
    assert growth["width-x2"] == growth["depth-x2"]  # where L1 -> L2 crosses: 6 C of 16 C
    assert growth["depth-x2"][0] / s.c_flops == pytest.approx(6 / 16, rel=1e-6)
    assert flags["width-x2"][0] == "L2n->L2: not measured by the map; grown where L1->L2 crosses"
    # 16 C is no tuned budget of the map: the envelope sizes' LRs are swept at B around the nearest tuned one
    assert s.design["lr_from_map"] == {}
    specs, _ = optimal.experiment_plan(s, {})
    swept = {sp.size: [] for sp in specs if sp.kind == "scratch"}
    for sp in specs:
        if sp.kind == "scratch":
            swept[sp.size].append(sp.lr)
    assert swept == {z: [1e-3, 2e-3, 4e-3] for z in ("L1", "L2", "L4")}  # the 8 C LR 2e-3 in the middle


@pytest.mark.parametrize(
    "target, budget, message",
    [("L1", 8.0, "needs a smaller size on the map's depth ladder"), ("L4", 3.0, "--budget 3: the map measured")],
)
def test_a_design_the_map_cannot_support_is_refused(mapped, target, budget, message):
    with pytest.raises(optimal.DesignError, match=message):
        optimal.design(S, mapped, target=target, budget=budget)
    other = {**mapped, "sizes": {**mapped["sizes"], "L2": {**mapped["sizes"]["L2"], "shape": [2, 128, 4]}}}
    with pytest.raises(optimal.DesignError, match=r"another profile \(sizes \['L2'\] differ"):
        optimal.design(S, other)
    flat = {**mapped, "choice": {**mapped["choice"], "target": None, "budget": None, "why": "none best"}}
    with pytest.raises(optimal.DesignError, match="chose no target"):
        optimal.design(S, flat)


def test_pilot_then_main_then_levers_and_the_report(mapped):
    s = optimal.design(S, mapped)
    done, st, rounds = run_all(s)
    assert st.complete and rounds == 4  # the arms' LR sweeps, the re-warm runs, main, levers
    assert st.lr["depth-x2"] == 1e-3 and st.policy == {a.name: "continue" for a in s.arm_list()}
    assert st.primary == "depth-x2"
    main = [r["spec"] for r in done.values() if r["spec"].phase == "main"]
    assert len(main) == s.seeds * (3 * 3 + 1 + len(s.arm_list()))  # 3 sizes x 3 budgets, the target past B, arms
    r = optimal_report.summarize(s, done)
    assert (r["budget_flops"], r["target"], r["comparator"], r["n_seeds"]) == (64 * S.c_flops, "L4", "L4", s.seeds)
    assert r["envelope"]["1"]["best_size"] == "L4" and set(r["envelope"]) == {"0.25", "0.5", "1"}
    arm = {a["arm"]: a for a in r["arms"]}
    d = arm["depth-x2"]
    assert d["delta_vs_envelope_mean"] == pytest.approx(-0.02, abs=1e-9) and d["beats_envelope"]
    assert d["delta_vs_envelope_ci95_low"] == d["delta_vs_envelope_ci95_high"] == pytest.approx(-0.02, abs=1e-9)
    assert arm["gstack-x4"]["delta_vs_envelope_mean"] == pytest.approx(0.08, abs=1e-9)
    assert not arm["gstack-x4"]["beats_envelope"] and r["best_arm"] == r["primary_arm"] == "depth-x2"
    assert r["primary_arm_beats_envelope"] and r["levers_skipped"] == [] and r["lr_at_edge"] == {}
    assert r["levers_not_run"] == [] and "Levers not run yet" not in optimal_report.markdown(s, r)
    assert d["delta_vs_best_size_at_B_mean"] == d["delta_vs_envelope_mean"]  # the best size is the comparator
    assert d["saving_vs_same_size_mean"] > 0 and d["saving_vs_same_size_n"] == s.seeds  # read off L4 at 1 and 2 B
    assert {lv["lever"] for lv in r["levers"]} == {"early", "late", "reset", "nosym", "noise0.25", "noise4"}
    assert all(lv["effect"] == pytest.approx(0.005) for lv in r["levers"])
    noise = next(lv for lv in r["levers"] if lv["lever"] == "noise4")
    assert noise["what"] == "width-x2 with symmetry-breaking noise s.d. 4 (default 1)"
    # epochs of every run: steps x batch / the map's training windows
    l2 = RunSpec("main", "scratch", 0, 1.0, 1e-3, size="L2")
    assert r["epochs"][l2.name] == pytest.approx(optimal.epochs(s, l2), rel=1e-3)
    assert max(r["epochs"].values()) <= 2.0
    md = optimal_report.markdown(s, r)
    assert "**Verdict.** At B = 64 C the primary arm, `depth-x2` (the lowest pilot loss" in md
    assert "-0.0200 [-0.0200, -0.0200] nats), beats the envelope" in md and "not the target" not in md
    assert "| `width-x2` (L4n -> L4) | 0.05 |" in md


def test_at_an_untuned_budget_the_arms_sweep_around_the_target_lr_swept_here(mapped):
    s = optimal.design(S, mapped, target="L2", budget=16.0)
    done, st, _ = run_all(s)
    assert st.lr["L2"] == 2e-3  # swept at B around the map's 8 C LR
    arm_lrs = sorted(
        {r["spec"].lr for r in done.values() if r["spec"].arm == "depth-x2" and r["spec"].phase == "pilot"}
    )
    assert arm_lrs[:3] == [5e-4, 1e-3, 2e-3] and 4e-3 in arm_lrs  # centred on 2e-3, widened at the low edge


def test_a_best_size_on_the_main_seeds_other_than_the_comparator_gets_its_own_deltas(mapped, monkeypatch):
    monkeypatch.setitem(MAIN_OFFSET, "L8", -0.5)  # L8 best on the main seeds; the comparator stays the map's L4
    s = optimal.design(S, mapped)
    done, _, _ = run_all(s)
    r = optimal_report.summarize(s, done)
    assert r["comparator"] == "L4" and r["envelope_at_B"]["size"] == "L8"
    gap = r["envelope"]["1"]["losses"]["L8"] - r["envelope"]["1"]["losses"]["L4"]
    for a in r["arms"]:
        assert a["delta_vs_best_size_at_B_mean"] == pytest.approx(a["delta_vs_envelope_mean"] - gap, abs=2e-6)
        assert a["delta_vs_best_size_at_B_ci95_high"] > 0  # no arm beats L8
    md = optimal_report.markdown(s, r)
    assert "Over the main seeds the best size at B is `L8`" in md
    assert "Against that size (chosen after the fact on the same seeds, which favours the envelope)" in md
    dx = next(a for a in r["arms"] if a["arm"] == "depth-x2")
    assert f"`depth-x2` {dx['delta_vs_best_size_at_B_mean']:+.4f} [{dx['delta_vs_best_size_at_B_ci95_low']:+.4f}" in md


def test_a_best_lr_at_an_end_of_the_widened_grid_is_reported(mapped, monkeypatch):
    monkeypatch.setitem(BEST_LR, "msg-depth", 1.6e-2)  # past the grid 5e-4 .. 2e-3 widened twice, to 8e-3
    s = optimal.design(S, mapped)
    done, st, _ = run_all(s)
    r = optimal_report.summarize(s, done)
    assert list(r["lr_sweep"]["msg-depth"]) == ["5.00e-04", "1.00e-03", "2.00e-03", "4.00e-03", "8.00e-03"]
    assert st.lr["msg-depth"] == 8e-3 and r["lr_at_edge"] == {"msg-depth": "highest"}
    md = optimal_report.markdown(s, r)
    assert "tuned only up to the grid (the sweep widens 2 times at most): `msg-depth` (8.0e-03, the highest" in md


def test_a_target_that_is_not_the_best_size_at_b_is_said_so(mapped):
    s = optimal.design(S, mapped, target="L4", budget=8.0)  # L2 is the map's best at 8 C
    assert s.design["comparator"] == "L2"
    done, _, _ = run_all(s)
    md = optimal_report.markdown(s, optimal_report.summarize(s, done, optimal.choice_note(s, mapped)))
    assert "The comparator `L2` is not the target" in md and "chosen by flags" in md


def test_the_report_needs_a_complete_pilot_and_two_seeds(mapped):
    s = optimal.design(S, mapped)
    with pytest.raises(ValueError, match="the pilot is incomplete"):
        optimal_report.summarize(s, {})
    done, st, _ = run_all(replace(s, seeds=2))
    main = [n for n, r in done.items() if r["spec"].phase == "main" and r["spec"].seed == 1]
    for n in main:
        del done[n]
    with pytest.raises(ValueError, match="1 seeds have every main run"):
        optimal_report.summarize(replace(s, seeds=2), done)
    done, _, _ = run_all(replace(s, seeds=2))
    for n in [n for n, r in done.items() if r["spec"].tag]:
        del done[n]
    r = optimal_report.summarize(replace(s, seeds=2), done)
    assert r["levers"] == [] and r["levers_not_run"] == ["early", "late", "reset", "nosym", "noise0.25", "noise4"]
    assert "Levers not run yet (they follow the main seeds; `--phase optimal` resumes them): early, late," in (
        optimal_report.markdown(replace(s, seeds=2), r)
    )


def test_the_main_runs_train_seed_by_seed_so_a_stopped_phase_leaves_whole_seeds(mapped, tmp_path, monkeypatch):
    from growlm.eval.experiments import runner

    s = optimal.design(S, mapped)
    done, st, _ = run_all(s)
    main = optimal.main_specs(s, st)
    trained: list[RunSpec] = []
    monkeypatch.setattr(runner, "_work", lambda s, sp, data, path, settings: trained.append(sp))
    assert runner.run_all(s, reversed(main), tmp_path, tmp_path, {}, runner.Workers(1), "main") == []
    assert sorted(trained, key=lambda sp: sp.name) == sorted(main, key=lambda sp: sp.name)
    order = [(sp.seed, -sp.budget) for sp in trained]
    assert order == sorted(order) and trained[0].budget == 2.0  # seed 0's run past B first, the 0.25 B runs last
    assert [sp.seed for sp in trained[: len(main) // s.seeds]] == [0] * (len(main) // s.seeds)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--phase", "optimal", "--target", "L2"], "--target and --budget go together"),
        (["--target", "L2", "--budget", "8"], "--map, --target and --budget belong to --phase optimal"),
        (["--phase", "optimal", "--map", "{tmp}/none"], "has no map.json; run growlm-experiment --phase map"),
        (["--phase", "optimal", "--map", "{tmp}/bad"], "map.json cannot be read"),
        (
            ["--phase", "optimal", "--map", "{tmp}/map/map.json"],
            "map.json is a file; give the folder that holds map.json (--map {tmp}/map)",
        ),  # fmt: skip
        (["--phase", "optimal", "--map", "{tmp}/map", "--target", "L1", "--budget", "8"], "needs a smaller size"),
        (["--phase", "optimal", "--map", "{tmp}/map", "--target", "L4", "--budget", "3"], "the map measured budgets"),
        (["--phase", "optimal", "--map", "{tmp}/map", "--data", "{tmp}/none"], "has no meta.json"),
        (["--phase", "optimal", "--map", "{tmp}/map", "--data", "{data}"], "training windows; the map ran on 400,000"),
        (["--phase", "optimal", "--map", "{tmp}/map", "--report_only"], "no curves under"),
    ],
)
def test_growlm_experiment_phase_optimal_refuses_bad_input_in_one_line(mapped, tmp_path, small_vocab_data, capsys,
                                                                      argv, message):  # fmt: skip
    import json

    from growlm.eval.experiments import cli

    (tmp_path / "map").mkdir()
    (tmp_path / "map" / "map.json").write_text(json.dumps(mapped))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "map.json").write_text("{")
    argv = [a.format(tmp=tmp_path, data=small_vocab_data) for a in argv]
    message = message.format(tmp=tmp_path)
    assert cli.main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "o" / "curves").exists()


def test_the_noise_lever_reaches_the_width_operator_and_keeps_the_function(small_vocab_data, monkeypatch):
    """symmetry 'noise:<s.d.>' sets the width operator's noise s.d.; the grown model's loss equals the small one's
    (zero-sum noise), and the three runs train on differently."""
    from growlm.eval.experiments import protocol, train_run

    seen = []
    real = train_run.make_rules
    monkeypatch.setattr(train_run, "make_rules", lambda *a, **k: seen.append(k) or real(*a, **k))
    s = replace(protocol.quick(protocol.PROFILES["cpu"]), c_flops=3e7)
    spread = {}
    for sym in ("noise:0.25", "noise:4", "none"):
        sp = RunSpec("pilot", "grow", 0, 1.0, 4e-3, arm="width-x2", grow_flops=(0.5 * s.c_flops,), symmetry=sym)
        c = train_run.train_run(s, sp, small_vocab_data)
        g = c["growth"][0]
        assert g["loss_after"] == pytest.approx(g["loss_before"], abs=1e-5)
        spread[sym] = c["final"]["val_loss"]
    assert [(k["symmetry"], k["noise_std"]) for k in seen] == [("noise", 0.25), ("noise", 4.0), ("none", 1.0)]
    assert len(set(spread.values())) == 3  # three different runs


@pytest.mark.parametrize(
    "best, edge, tuned, tag, other",
    [(1.6e-2, "highest", 8e-3, "lr-x2", "lr-half"), (3.125e-5, "lowest", 1.25e-4, "lr-half", "lr-x2")],
)
def test_a_primary_arm_tuned_only_up_to_its_grid_gets_an_lr_lever_one_step_past_it(
    mapped, monkeypatch, best, edge, tuned, tag, other
):
    for arm in OFFSET:  # every arm best past the grid 5e-4 .. 2e-3 widened twice: depth-x2 stays the primary
        monkeypatch.setitem(BEST_LR, arm, best)
    s = optimal.design(S, mapped)
    done, st, _ = run_all(s)
    assert st.primary == "depth-x2" and st.lr_edge["depth-x2"] == edge and st.lr["depth-x2"] == tuned
    r = optimal_report.summarize(s, done)
    lever = next(lv for lv in r["levers"] if lv["lever"] == tag)
    # the fabricated loss: 0.05 nats per factor 2 from the best LR, a lever 0.005: one step on gains 0.045
    assert lever["arm"] == "depth-x2" and lever["effect"] == pytest.approx(-0.045, abs=1e-9)
    step = tuned * (2 if tag == "lr-x2" else 0.5)
    assert lever["what"] == f"depth-x2 at peak LR {step:.1e}, one grid step past its best ({tag[3:]}; the sweep's end)"
    assert done[lever["base"]]["spec"].lr == tuned and other not in {lv["lever"] for lv in r["levers"]}
    assert "One grid step past the end, `depth-x2`'s pilot loss changes by -0.0450 nats" in optimal_report.markdown(
        s, r
    )


def test_the_sizes_between_the_ladders_are_the_midpoint_depths_around_the_comparator(mapped):
    s = optimal.design(S, mapped)  # L4 at 64 C, envelope L2, L4, L8: depths 2.83 and 5.66 round to 3 and 6
    w, h = s.sizes["L4"][1:]
    assert optimal.between_sizes(s) == {"L3": (3, w, h), "L6": (6, w, h)}
    r_s = optimal.refine_settings(s)
    assert r_s.sizes["L3"] == (3, w, h) and r_s.design["refine"] == ["L3", "L6"]
    assert s.design.get("refine") is None  # the experiment's own settings (and so its curves) are unchanged
    # L2 at 16 C (comparator L2, neighbours L1 and L4): 1.41 rounds onto L1, 2.83 to 3
    assert list(optimal.between_sizes(optimal.design(S, mapped, target="L2", budget=16.0))) == ["L3"]


def test_the_refined_envelope_can_take_a_win_back_and_the_report_says_so(mapped, monkeypatch):
    monkeypatch.setitem(REFINE_OFFSET, "L3", -0.03)  # L3 0.03 below the target L4 at B; depth-x2 only 0.02
    s = optimal.design(S, mapped)
    done, st, _ = run_all(s)
    refined, rounds = run_refine(s, st)
    assert rounds == 2  # the two sweeps (both neighbours' LRs are 1e-3: 5e-4, 1e-3, 2e-3), then every main seed
    _, lrs = optimal.refine_plan(s, st, refined)
    assert lrs == {"L3": 1e-3, "L6": 1e-3}
    assert sorted(sp.seed for sp in (r["spec"] for r in refined.values()) if sp.size == "L3") == [
        *range(s.seeds), 100, 100, 100,
    ]  # fmt: skip
    r = optimal_report.summarize(s, done, refined=refined)
    rf = r["refine"]
    assert rf["complete"] and rf["runs_not_run"] == [] and rf["best_size_at_B"] == "L3"
    assert list(rf["sizes"]["L3"]["lr_sweep"]) == ["5.00e-04", "1.00e-03", "2.00e-03"]
    dx = rf["arms"]["depth-x2"]  # -0.02 against L4, so +0.01 against L3 on every seed (paired: no spread)
    assert dx["delta_mean"] == dx["delta_ci95_low"] == dx["delta_ci95_high"] == pytest.approx(0.01, abs=1e-9)
    assert not dx["beats"]
    assert r["primary_arm_beats_envelope"] and r["primary_arm_beats_refined_envelope"] is False
    assert set(rf["epochs"]) == set(refined) and all(0 < e <= 2 for e in rf["epochs"].values())
    md = optimal_report.markdown(s, r)
    assert "## The envelope refined at B: sizes between the ladder's" in md
    assert "the primary arm `depth-x2` (+0.0100 [+0.0100, +0.0100] nats) does not beat it: its interval's" in md
    # a refine curve from another token folder is refused, never compared with these runs
    moved = {**refined, "L3-x": {**refined[next(iter(refined))], "settings": {"data": {"train_windows": 9}}}}
    with pytest.raises(ValueError, match="the refine curve L3-x comes from another token folder"):
        optimal_report.summarize(s, done, refined=moved)
    # without the between sizes winning, the refined best is the ladder's and the primary arm keeps its win
    monkeypatch.setitem(REFINE_OFFSET, "L3", 0.02)
    r = optimal_report.summarize(s, done, refined=run_refine(s, st)[0])
    assert r["refine"]["best_size_at_B"] == "L4" and r["primary_arm_beats_refined_envelope"] is True


def test_refine_runs_not_yet_run_are_listed_and_the_report_without_them_leaves_refine_out(mapped):
    s = optimal.design(S, mapped)
    done, _, _ = run_all(s)
    r = optimal_report.summarize(s, done, refined={})
    assert not r["refine"]["complete"] and len(r["refine"]["runs_not_run"]) == 6  # the two pilot sweeps
    assert r["refine"]["runs_left"] == 6 + 2 * s.seeds and r["primary_arm_beats_refined_envelope"] is None
    left = f"Refine runs not run yet ({6 + 2 * s.seeds}; `--phase optimal` runs them after the levers)."
    assert left in optimal_report.markdown(s, r) and "refine" not in optimal_report.summarize(s, done)
    # L1 the comparator (4 C, below the map's L1 -> L2 crossover at 6 C): sqrt(1 x 2) rounds onto L1, no refine run
    s = optimal.design(S, mapped, target="L2", budget=4.0)
    assert s.design["comparator"] == "L1" and optimal.between_sizes(s) == {}
    done, st, _ = run_all(s)
    assert optimal.refine_plan(s, st, {}) == ([], {})
    r = optimal_report.summarize(s, done, refined={})
    assert r["refine"]["complete"] and r["refine"]["best_size_at_B"] == r["envelope_at_B"]["size"]
    assert "the refined envelope is the envelope" in optimal_report.markdown(s, r)


@pytest.mark.parametrize(
    "a, b, grid",
    [
        (2e-3, 4e-3, (2e-3, 2e-3 * 2**0.5, 4e-3)),
        (1e-3, 1e-3, (5e-4, 1e-3, 2e-3)),
        (8e-3, 1e-3, (1e-3, 2e-3, 4e-3, 8e-3)),
    ],
)
def test_a_between_size_sweeps_the_lrs_from_one_neighbour_to_the_other(a, b, grid):
    assert optimal.between_lrs(a, b) == pytest.approx(grid, rel=1e-12)
