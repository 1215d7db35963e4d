"""The IsoFLOP experiment's arithmetic, planning, data order, one real run of each kind, and the committed report
rebuilt from the committed curves (growlm-experiment; eval/experiments/). The end-to-end --quick run, with
--report_only on its own curves, is in tests/distributed/test_experiment_quick.py."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from growlm.eval.experiments import analysis as an
from growlm.eval.experiments import cli as experiment
from growlm.eval.experiments import plan, protocol, runner
from growlm.eval.experiments.protocol import RunSpec


# ------------------------------------------------------------------------------------------------- arithmetic
def test_compute_to_reach_interpolates_log_budget_between_finished_runs_and_never_extrapolates():
    pts = [(2.0, 4.0), (0.25, 5.0), (1.0, 4.2), (0.5, 4.5)]  # any order
    # 4.35 lies between 0.5 C (4.5) and 1 C (4.2), half way: exp(log 0.5 + 0.5 log 2) = sqrt(0.5)
    assert an.compute_to_reach(pts, 4.35) == pytest.approx(math.sqrt(0.5))
    assert an.compute_to_reach(pts, 4.5) == pytest.approx(0.5)
    assert an.compute_to_reach(pts, 4.0) == pytest.approx(2.0)
    assert an.compute_to_reach(pts, 3.99) is None  # below the largest budget's loss: would extrapolate
    assert an.compute_to_reach(pts, 5.01) is None  # above the smallest budget's loss
    assert an.saving(1.0, math.sqrt(0.5)) == pytest.approx(1 - 1 / math.sqrt(0.5))  # -41%: more compute
    assert an.saving(1.0, 2.0) == pytest.approx(0.5)
    assert an.saving(1.0, None) is None


def test_envelope_is_the_best_size_per_budget():
    env = an.envelope({1.0: {"a": 4.3, "b": 4.1, "c": 4.2}, 0.5: {"a": 4.4, "b": 4.6}})
    assert env == {0.5: ("a", 4.4), 1.0: ("b", 4.1)}
    assert list(env) == [0.5, 1.0]


def test_paired_interval_is_the_t_interval():
    m, lo, hi = an.mean_ci95([1.0, 2.0, 3.0, 4.0])
    h = 3.182446305284263 * np.std([1, 2, 3, 4], ddof=1) / 2  # t_{0.975, 3}
    assert (m, lo, hi) == pytest.approx((2.5, 2.5 - h, 2.5 + h))
    assert an.mean_ci95([3.0]) == (3.0, None, None)
    with pytest.raises(ValueError):
        an.mean_ci95([])


def test_crossover_of_two_sizes_and_its_flags():
    small = {0.25: 5.0, 0.5: 4.6, 1.0: 4.4}
    big = {0.25: 5.2, 0.5: 4.7, 1.0: 4.3}  # d = 0.2, 0.1, -0.1: crosses half way between 0.5 and 1 in log budget
    assert an.crossover(small, big) == (pytest.approx(math.sqrt(0.5)), "")
    assert an.crossover(small, {b: v - 1 for b, v in small.items()}) == (0.25, "below")
    assert an.crossover(small, {b: v + 1 for b, v in small.items()}) == (1.0, "beyond")
    with pytest.raises(ValueError):
        an.crossover({1.0: 1.0}, {1.0: 2.0})


def test_stage_steps_spend_the_budget_and_growth_points_stay_in_range():
    s = protocol.PROFILES["cpu"]
    c2, c4 = s.step_flops("L2"), s.step_flops("L4")
    g, total = protocol.stage_steps(s, ("L2", "L4"), (0.5 * s.c_flops,), s.c_flops)
    assert g == round(0.5 * s.c_flops / c2)
    spent = g * c2 + (total - g) * c4
    assert abs(spent - s.c_flops) <= c4 / 2  # within half a target step of C
    assert protocol.run_steps(s, RunSpec("main", "scratch", 0, 0.25, 1e-3, size="L8")) == [
        round(0.25 * s.c_flops / s.step_flops("L8"))
    ]
    with pytest.raises(ValueError, match="must increase"):
        protocol.stage_steps(s, ("L1", "L2", "L4"), (0.5 * s.c_flops, 0.4 * s.c_flops), s.c_flops)
    with pytest.raises(ValueError, match="grow earlier"):
        protocol.stage_steps(s, ("L2", "L4"), (1.2 * s.c_flops,), s.c_flops)
    a = protocol.arm("multi-1-2-4")
    cross = {"L1->L2": {"budget": 0.9, "flag": ""}, "L2->L4": {"budget": 0.6, "flag": "beyond"}}
    pts, flags = plan.growth_points(s, a, cross)
    assert [p / s.c_flops for p in pts] == pytest.approx([0.3, 0.6])  # 0.75 cap, then before the next growth
    assert any("moved from 0.9 C to 0.75 C" in f for f in flags) and any("beyond" in f for f in flags)
    assert any("before the next" in f for f in flags)


def test_the_protocol_keeps_the_lm_head_under_10_percent_of_the_target():
    s = protocol.PROFILES["cpu"]
    assert s.head_fraction() <= 0.10
    assert set(s.sizes) >= {a for arm in protocol.ARMS for a in arm.stages}
    assert [s.config(k).n_layer for k in ("L1", "L2", "L4", "L8")] == [1, 2, 4, 8]


def test_lr_grid_widens_only_at_an_edge():
    assert protocol.lr_grid_next({1e-3: 5.0, 2e-3: 4.0, 4e-3: 4.5}, 2) is None
    assert protocol.lr_grid_next({1e-3: 5.0, 2e-3: 4.5, 4e-3: 4.0}, 2) == 8e-3
    assert protocol.lr_grid_next({1e-3: 4.0, 2e-3: 4.5, 4e-3: 5.0}, 2) == 5e-4
    assert protocol.lr_grid_next({1e-3: 4.0, 2e-3: 4.5, 4e-3: 5.0}, 0) is None


# ----------------------------------------------------------------------------------------------------- planning
def _fake_done(s, specs, loss):
    return {sp.name: {"spec": sp, "curve": {"final": {"val_loss": loss(sp)}}} for sp in specs}


def test_the_pilot_decides_in_rounds_and_the_main_runs_follow_from_it():
    s = protocol.quick(protocol.PROFILES["cpu"])
    depth = {k: s.sizes[k][0] for k in s.sizes}

    def loss(sp):  # bigger sizes win only at larger budgets; the best LR is the grid's top, so it widens once
        if sp.kind == "scratch":
            return 5.0 - 0.3 * math.log2(sp.budget + 1) * depth[sp.size] ** 0.5 + 0.1 * depth[sp.size] - sp.lr
        return 4.0 - sp.lr + (0.01 if sp.policy == "rewarm" else 0) + (0.05 if sp.tag else 0)

    done, rounds = {}, 0
    while True:
        specs, st = plan.pilot(s, done)
        todo = [sp for sp in specs if sp.name not in done]
        if not todo:
            break
        rounds += 1
        done.update(_fake_done(s, todo, loss))
    assert st.complete and rounds == 6  # sweep, widen, envelope, arm sweep, arm widen, policy + levers
    assert all(lr == max(s.lrs) * 2 for lr in st.lr.values())  # widened once (lr_widen 1), then stopped
    assert st.policy == {a.name: "continue" for a in protocol.ARMS}
    assert set(st.crossovers) == {"L2->L4", "L1->L2", "L1->L4", "L4n->L4"}
    main = plan.main_specs(s, st)
    finals = {s.target} | {a.stages[-1] for a in protocol.ARMS}  # 2 C on every seed: same-size savings
    assert finals == {"L4", "L2"}
    n_scratch = s.seeds * len(s.sizes) * 3 + s.budgets_2c_seeds * len(s.sizes) + (s.seeds - s.budgets_2c_seeds) * 2
    n_levers = s.seeds * sum(tag in plan.MAIN_LEVERS for _, tag in plan.LEVERS)  # timing levers on every seed
    assert len(main) == n_scratch + s.seeds * len(protocol.ARMS) + n_levers
    assert {sp.grow_flops for sp in main if sp.arm == "depth-x2" and not sp.tag} == {st.growth["depth-x2"]}
    assert len({sp.name for sp in main}) == len(main)


# ------------------------------------------------------------------------------------------ data and real runs
@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    from growlm.data.tokens import TokenFolderWriter

    d = tmp_path_factory.mktemp("tok") / "tokens"
    rng = np.random.default_rng(0)
    with TokenFolderWriter(d) as w:  # the one writer, so meta.json is a real one
        splits = {}
        for split, n in (("train", 40_000), ("val", 5_000)):
            sw = w.split(split)
            sw.write(rng.integers(0, 320, n))
            splits[split] = sw.record(1, [])
        w.finish(tokenizer="random ids", vocab_size=320, eot_token_id=319, splits=splits)
    return d


def test_every_run_of_a_seed_reads_the_same_batches_and_the_data_at_most_twice(tokens):
    from growlm.eval.experiments.train_run import Windows

    w = Windows(tokens, 32, 4)
    assert np.array_equal(w.batch(3, 5), Windows(tokens, 32, 4).batch(3, 5))
    assert not np.array_equal(w.batch(3, 5), w.batch(4, 5))
    seen = np.concatenate([w._order(3)[k * 4 : (k + 1) * 4] for k in range(w.n // 4)])
    assert len(set(seen.tolist())) == len(seen)  # one pass: every window once
    assert w.batch(3, 0).shape == (4, 33)
    with pytest.raises(ValueError, match="third time"):
        w.batch(3, 2 * w.n // 4 + 1)
    v = w.val(16)
    val = np.fromfile(tokens / "val.bin", dtype=np.uint16)
    assert np.array_equal(v[0].numpy(), val[:33]) and np.array_equal(v[-1].numpy(), val[-33:])  # spread over all


def test_a_growth_run_preserves_the_function_and_spends_the_budget(tokens):
    from growlm.eval.experiments.train_run import train_run

    s = replace(protocol.quick(protocol.PROFILES["cpu"]), c_flops=6e7)
    g = (0.4 * s.c_flops,)
    for name, exact in (("depth-x2", True), ("msg-depth", True), ("gstack-x4", False)):
        a = protocol.arm(name)
        c = train_run(s, RunSpec("pilot", "grow", 0, 1.0, 4e-3, arm=name, grow_flops=g[: len(a.stages) - 1] if
                                 len(a.stages) == 2 else (0.2 * s.c_flops, 0.4 * s.c_flops)), tokens)  # fmt: skip
        ev = c["growth"][0]
        if exact:
            assert ev["loss_after"] == pytest.approx(ev["loss_before"], abs=1e-5), name
        else:
            assert abs(ev["loss_after"] - ev["loss_before"]) > 1e-3, name
        assert abs(c["points"][-1]["flops"] - s.c_flops) <= s.step_flops("L4") / 2 + 1  # C, to half a target step
        n = c["steps"][-1] - max(2, round(s.warmup_frac * c["steps"][-1])) + 2  # cosine steps to LR 0
        assert c["points"][-1]["lr"] == pytest.approx(4e-3 * (1 - math.cos(math.pi / n)) / 2)  # decayed at the budget
        assert c["final"]["windows"] == s.final_windows and c["final"]["val_se"] > 0
    scratch = train_run(s, RunSpec("pilot", "scratch", 0, 1.0, 4e-3, size="L2"), tokens)
    assert scratch["steps"] == [round(s.c_flops / s.step_flops("L2"))]
    assert [p["step"] for p in scratch["points"]][-1] == scratch["steps"][0]
    assert max(p["lr"] for p in scratch["points"]) <= 4e-3


def test_curves_made_with_other_settings_are_refused(tmp_path, tokens, capsys):
    s = protocol.quick(protocol.PROFILES["cpu"])
    settings = {**s.as_dict(), "data": runner.data_fingerprint(tokens)}
    sp = RunSpec("pilot", "scratch", 100, 1.0, 2e-3, size="L1")
    path = runner.curve_path(tmp_path, sp)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"settings": {**settings, "batch": 99}, "spec": sp.as_dict(), "curve": {}}))
    with pytest.raises(runner.SettingsMismatch, match="batch differ"):
        runner.load_curves(tmp_path, settings)
    argv = ["--quick", "--data", str(tokens), "--out", str(tmp_path)]
    assert experiment.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was made with other settings (batch differ)" in err[0]
    assert experiment.main([*argv, "--report_only"]) == 2  # --report_only refuses them too
    assert "other settings" in capsys.readouterr().err
    path.write_text(json.dumps({"settings": {**settings, "seeds": 9}, "spec": sp.as_dict(), "curve": {}}))
    assert set(runner.load_curves(tmp_path, settings)) == {sp.name}  # more seeds change no run: accepted


def test_a_curve_with_the_name_of_a_needed_run_but_another_spec_is_refused(tmp_path, tokens, capsys):
    """A run's file name does not hold every field (a growth point, for one): a curve whose spec differs from the
    run the plan needs under that name is never read as that run (exit 2, one line naming the field)."""
    s = protocol.quick(protocol.PROFILES["cpu"])
    need = RunSpec("pilot", "grow", 100, 1.0, 2e-3, arm="depth-x2", grow_flops=(0.5 * s.c_flops,), tag="early")
    other = replace(need, grow_flops=(0.3 * s.c_flops,))
    assert other.name == need.name
    done = {need.name: {"spec": other, "curve": {"final": {"val_loss": 3.0}}}}
    with pytest.raises(plan.CurveMismatch, match="another grow_flops than this protocol's"):
        plan.final_loss(done, need)
    assert plan.final_loss({need.name: {"spec": need, "curve": {"final": {"val_loss": 3.0}}}}, need) == 3.0
    last_bit = replace(need, grow_flops=(need.grow_flops[0] * (1 + 1e-15),))  # exp/log on another machine
    assert plan.final_loss({need.name: {"spec": last_bit, "curve": {"final": {"val_loss": 3.0}}}}, need) == 3.0
    settings = {**s.as_dict(), "data": runner.data_fingerprint(tokens)}
    sp = RunSpec("pilot", "scratch", 100, 1.0, 2e-3, size="L1")  # the first run the pilot reads
    path = runner.curve_path(tmp_path, sp)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"settings": settings, "spec": {**sp.as_dict(), "moments": "reset"},
                                "curve": {"final": {"val_loss": 3.0}}}))  # fmt: skip
    assert experiment.main(["--quick", "--data", str(tokens), "--out", str(tmp_path), "--dry_run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "made with another moments than this protocol's" in err[0]


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--seeds", "1"], "--seeds 1: a 95% interval needs at least 2 seeds"),
        (["--seeds", "101"], "--seeds 101: the main seeds 0..100 would include the pilot's seed 100; at most 100"),
        (["--parallel", "0"], "--parallel 0: must be >= 1"),
        (["--profile", "gpu", "--device", "cuda:0"], "no CUDA device visible to torch"),
        (["--report_only"], "no curves under"),
    ],
)
def test_growlm_experiment_refuses_bad_flags_in_one_line(tmp_path, capsys, argv, message, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert experiment.main(["--quick", "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    f = tmp_path / "file"
    f.write_text("x")
    assert experiment.main(["--out", str(f)]) == 2
    assert "is a file" in capsys.readouterr().err


@pytest.mark.bad_input
def test_a_profile_whose_longest_run_would_read_the_data_a_third_time_is_refused(small_vocab_data, capsys,
                                                                                  tmp_path, monkeypatch):  # fmt: skip
    """A profile at 10x the GPU profile's budget on the built-in corpus: its longest run (L1 at 8 C) needs far more
    text than twice the training split; one line, exit 2, before any run. The profiles themselves fit."""
    have = (runner.train_tokens(small_vocab_data) - 1) // 64
    assert plan.max_train_windows(protocol.PROFILES["cpu"]) < have
    assert plan.max_train_windows(protocol.PROFILES["gpu"]) < have
    s = replace(protocol.PROFILES["gpu"], c_flops=protocol.PROFILES["gpu"].c_flops * 10)
    monkeypatch.setitem(protocol.PROFILES, "gpu", s)
    need = plan.max_train_windows(s)
    longest = max(protocol.run_steps(s, RunSpec("pilot", "scratch", 0, plan.BIG, 0.0, size=z))[0] for z in s.sizes)
    assert need == longest * s.batch > 2 * have  # L4n (width 64, the cheapest token) at 8 C
    argv = ["--profile", "gpu", "--device", "cpu", "--data", str(small_vocab_data), "--out", str(tmp_path), "--dry_run"]
    assert experiment.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"the longest run of the gpu profile reads {need:,}, more than twice over" in err[0]
    assert not (tmp_path / "curves").exists()


def test_dry_run_lists_the_first_pilot_round_and_data_vocab_is_checked(tmp_path, tokens, capsys):
    assert experiment.main(["--dry_run", "--quick", "--data", str(tokens), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    s = protocol.quick(protocol.PROFILES["cpu"])
    assert f"{len(s.sizes) * len(s.lrs)} runs, {len(s.sizes) * len(s.lrs):.2f} C of compute" in out
    assert "L8-B1-lr" in out and not (tmp_path / "o").exists()
    meta = json.loads((tokens / "meta.json").read_text())
    other = tmp_path / "v512"
    other.mkdir()
    (other / "meta.json").write_text(json.dumps({**meta, "vocab_size": 512}))
    assert experiment.main(["--quick", "--data", str(other), "--out", str(tmp_path / "o")]) == 2
    assert "512-token vocabulary; the protocol needs 320" in capsys.readouterr().err
    assert experiment.main(["--quick", "--data", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    assert "has no meta.json" in capsys.readouterr().err
