"""The crossover map's planning and arithmetic (eval/experiments/crossmap.py) on fabricated curves: the rounds (LR
sweeps at the tuned budgets, every budget at the nearest tuned LR, the crossing pairs on a second seed), the
crossovers with their brackets and intervals, epochs, the progress line, the versioned settings, and the data
refusal of the command."""

from __future__ import annotations

import pytest
from isoflop_helpers import fake_loss, finish, run_map

from growlm.eval.experiments import crossmap
from growlm.eval.experiments import protocol as P
from growlm.eval.experiments.protocol import RunSpec

S, M = P.PROFILES["cpu"], crossmap.MAP


def test_the_map_tunes_lr_at_each_tuned_budget_then_measures_every_budget_then_the_crossing_pairs_again():
    done, st, rounds = run_map()
    assert st.complete and rounds >= 4
    # 8 C: grid (2e-3, 4e-3, 8e-3) widened once to 1e-3 -> best 2e-3; 64 C: grid centred on it -> 1e-3
    assert all(st.lr[z] == {8.0: 2e-3, 64.0: 1e-3} for z in M.sizes())
    for z in M.sizes():
        for b in M.budgets:
            lr = 2e-3 if b <= 16 else 1e-3  # 16 C is nearer 8 C than 64 C in log FLOPs, 32 C nearer 64 C
            assert RunSpec("map", "scratch", S.pilot_seed, b, lr, size=z).name in done
    second = {sp.size for sp in (r["spec"] for r in done.values()) if sp.seed == M.second_seed}
    assert second == {"L1", "L2", "L4"}  # the sizes of the pairs that cross; L8 never overtakes L4
    c = st.crossovers
    assert c["L1->L2"]["budget"] == pytest.approx(6.0, rel=1e-6) and c["L1->L2"]["bracket"] == [4.0, 8.0]
    assert c["L2->L4"]["budget"] == pytest.approx(24.0, rel=1e-6) and c["L2->L4"]["bracket"] == [16.0, 32.0]
    assert c["L4->L8"]["flag"] == "beyond" and c["L4->L8"]["bracket"] == [64.0, None]
    assert c["L4n->L4"]["flag"] == "below" and c["L4n->L4"]["bracket"] == [None, 1.0]
    assert set(c["L1->L2"]["seeds"]) == {S.pilot_seed, M.second_seed}
    lo, hi = c["L1->L2"]["interval"]
    assert lo <= c["L1->L2"]["budget"] <= hi and list(c["L4->L8"]["seeds"]) == [S.pilot_seed]


def test_summary_and_markdown_state_losses_epochs_and_where_each_pair_crosses():
    done, _, _ = run_map()
    r = crossmap.summarize(S, M, done, crossmap.train_windows_of(done))
    assert r["protocol"] == crossmap.MAP_PROTOCOL and r["train_windows"] == 400_000
    l1 = r["sizes"]["L1"]["points"]
    steps64 = P.run_steps(S, RunSpec("map", "scratch", 0, 64.0, 0.0, size="L1"))[-1]
    assert l1["64"]["epochs"] == pytest.approx(steps64 * S.batch / 400_000, rel=1e-3)
    assert l1["64"]["loss_second_seed"] is not None and r["sizes"]["L8"]["points"]["64"]["loss_second_seed"] is None
    assert r["envelope"]["1"]["size"] == "L1" and r["envelope"]["64"]["size"] == "L4"
    md = crossmap.markdown(r)
    assert "| `L1->L2` | 6 C (4-8 C measured; seeds" in md and "| `L4->L8` | beyond 64 C |" in md
    assert "| `L4n->L4` | below 1 C |" in md


def test_the_target_is_the_largest_size_the_envelope_picks_and_b_its_widest_confirmed_lead():
    done, _, _ = run_map()
    r = crossmap.summarize(S, M, done, crossmap.train_windows_of(done))
    ch = r["choice"]
    # L4 is best at 32 and 64 C (L2 -> L4 crosses at 24 C, L8 never overtakes it); its lead over L2 and L8 is widest
    # at 64 C; it grows from L2 (depth ladder) and L4n (width ladder)
    lead = {b: min(fake_loss(RunSpec("map", "scratch", 100, b, 1e-3, size=z)) for z in ("L2", "L8"))
            - fake_loss(RunSpec("map", "scratch", 100, b, 1e-3, size="L4")) for b in (32.0, 64.0)}  # fmt: skip
    assert lead[64.0] > lead[32.0] > 0
    assert (ch["target"], ch["budget"], ch["grow_from"], ch["confirmed"]) == ("L4", 64.0, ["L2", "L4n"], True)
    assert ch["budget_flops"] == 64.0 * S.c_flops and ch["margin"] == pytest.approx(lead[64.0], abs=1e-4)
    assert ch["runner_up"] in ("L2", "L8")
    assert "B = 64 C" in crossmap.markdown(r) and "target `L4`, grown from `L2`, `L4n`" in crossmap.markdown(r)
    # a map whose smallest size is best everywhere has no target
    flat = {**r, "envelope": {b: {"size": "L1", "loss": 0.0} for b in r["envelope"]}}
    none = crossmap.choose_target(flat)
    assert none["target"] is None and "no size with a smaller neighbour" in none["why"]
    # a lead the second seed contradicts is not confirmed: the other budget wins although its lead is narrower
    shaky = {**r, "sizes": {z: {**v, "points": {b: dict(p) for b, p in v["points"].items()}}
                            for z, v in r["sizes"].items()}}  # fmt: skip
    shaky["sizes"]["L4"]["points"]["64"]["loss_second_seed"] = 9.0
    shaky["sizes"]["L2"]["points"]["64"]["loss_second_seed"] = 1.0
    assert crossmap.choose_target(shaky)["budget"] == 32.0
    # contradicted at both budgets, L4 gives way to the smaller size the second seed confirms: L2, best at 8 and 16 C
    shaky["sizes"]["L4"]["points"]["32"]["loss_second_seed"] = 9.0
    ch = crossmap.choose_target(shaky)
    assert (ch["target"], ch["confirmed"], ch["grow_from"]) == ("L2", True, ["L1"]) and ch["budget"] in (8.0, 16.0)
    # with no second seed at all nothing is confirmed: the largest best size, marked so
    bare = {**r, "sizes": {z: {**v, "points": {b: {**p, "loss_second_seed": None} for b, p in v["points"].items()}}
                           for z, v in r["sizes"].items()}}  # fmt: skip
    ch = crossmap.choose_target(bare)
    assert (ch["target"], ch["budget"], ch["confirmed"]) == ("L4", 64.0, False) and "read with care" in ch["why"]


def test_an_incomplete_map_has_no_report_and_the_progress_line_estimates_from_finished_runs():
    done: dict[str, dict] = {}
    specs, st = crossmap.map_plan(S, M, done)
    assert not st.complete and len(specs) == 3 * len(M.sizes())  # round 1: the 8 C sweeps
    assert crossmap.eta_line(S, done, specs, 2).endswith("about ? left)")
    with pytest.raises(ValueError, match="the map is incomplete"):
        crossmap.summarize(S, M, done, 400_000)
    finish(specs[:2], done)
    left = 8 * (len(specs) - 2)  # C of budget; the finished runs took 8 s per C, and 2 workers share the rest
    line = crossmap.eta_line(S, done, specs[2:], 2)
    assert (
        line == f"2 runs done, {len(specs) - 2} to run ({left:g} C of budget, about {8 * left / 2 / 60:.0f} min left)"
    )


def test_map_settings_are_versioned_and_checked():
    d = crossmap.settings_dict(S, M)
    assert d["protocol"] == crossmap.MAP_PROTOCOL != S.as_dict()["protocol"]
    assert d["map"]["budgets"] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
    with pytest.raises(ValueError, match=r"sizes \['L16'\]"):
        crossmap.MapSettings(ladders={"depth": ("L8", "L16")}).check(S)
    with pytest.raises(ValueError, match="lr_budgets"):
        crossmap.MapSettings(lr_budgets=(3.0,)).check(S)
    assert crossmap.nearest_tuned(M, 16.0) == 8.0 and crossmap.nearest_tuned(M, 32.0) == 64.0


@pytest.mark.bad_input
def test_a_token_folder_too_small_for_the_map_is_refused_in_one_line(small_vocab_data, tmp_path, capsys):
    from growlm.eval.experiments import cli

    rc = cli.main(["--phase", "map", "--data", str(small_vocab_data), "--out", str(tmp_path / "m"), "--dry_run"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "the map's longest run reads" in err and "more than twice over" in err


def test_a_size_whose_sweeps_are_done_runs_its_budgets_while_another_size_still_sweeps():
    done, _, _ = run_map()
    late = [n for n, r in done.items() if (r["spec"].size, r["spec"].budget, r["spec"].seed) == ("L4n", 64.0, 100)]
    del done[late[-1]]  # L4n's 64 C sweep not finished
    for n in [n for n, r in done.items() if r["spec"].budget not in M.lr_budgets]:
        del done[n]
    specs, st = crossmap.map_plan(S, M, done)
    todo = {(sp.size, sp.budget) for sp in specs if sp.name not in done}
    assert not st.complete and ("L4n", 1.0) not in todo
    assert {(z, b) for z in ("L1", "L2", "L4", "L8") for b in (1.0, 2.0, 4.0, 16.0, 32.0)} <= todo
