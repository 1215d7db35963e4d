"""The equal-compute experiment's arithmetic: budgets and step counts, the 95% t-interval against a known case, the
scratch reference curve and its inversion, the derived slope threshold, the count baselines, and every arm's plan
(default, --quick and GPU profiles) validated as a stage list. No process is started."""

import math

import numpy as np
import pytest

from growlm.eval.experiments import cli as experiment
from growlm.eval.experiments import compute_protocol as cp
from growlm.eval.experiments import equal_compute as ec
from growlm.eval.experiments.ngram import ngram_losses
from growlm.growth.stages.plan import parse_stages
from growlm.growth.stages.trigger import equal_rate_threshold, first_trigger_index, loglog_slope


def test_arm_steps_spends_the_scratch_budget():
    assert cp.arm_steps([0.5, 1.0], [100], 1000.0) == 1050  # 100 cheap steps cost 50 target steps
    assert cp.arm_steps([0.25, 0.5, 1.0], [100, 200], 400.0) == 525  # 25 + 50 spent, 325 target steps left
    assert cp.equal_steps_cap([0.25, 0.5, 1.0], [100, 200], 400) == pytest.approx((100 * 0.75 + 100 * 0.5) / 400)
    with pytest.raises(ValueError, match="grow earlier"):
        cp.arm_steps([0.5, 1.0], [3000], 1000.0)
    with pytest.raises(ValueError, match="increasing"):
        cp.arm_steps([0.25, 0.5, 1.0], [200, 100], 1000.0)
    with pytest.raises(ValueError, match="growth steps"):
        cp.arm_steps([0.5, 1.0], [], 1000.0)


def test_budget_steps_use_the_model_flops_formula():
    args = ec.parse_args([])
    arm = next(a for a in ec.ARMS if a.name == "depth-g25")
    c_s, c_t = ec.cost(args, "half_depth", 4096), ec.cost(args, "target", 4096)
    assert c_t == 8692224 * 16 * 128  # model.config.flops_per_token of 4 x 128, V 4096, T 128
    g = args.steps // 4
    steps = ec.budget_steps(args, arm, 4096, [g])
    assert abs((g * c_s + (steps - g) * c_t) - args.steps * c_t) <= c_t / 2  # the same FLOPs, to half a step
    assert ec.budget_steps(args, ec.ARMS[0], 4096, []) == args.steps


def test_t_interval_known_case():
    m, lo, hi = cp.mean_ci95([1.0, 2.0, 3.0, 4.0, 5.0])  # s = sqrt(2.5), t_{0.975,4} = 2.7764451
    half = 2.7764451 * math.sqrt(2.5) / math.sqrt(5)
    assert (m, lo, hi) == pytest.approx((3.0, 3.0 - half, 3.0 + half))
    assert cp.t975(1) == pytest.approx(12.706, abs=5e-4) and cp.t975(30) == pytest.approx(2.042, abs=5e-4)
    assert cp.t975(60) == pytest.approx(2.000, abs=5e-4)  # not the normal 1.96: a t quantile at every dof
    assert cp.mean_ci95([0.3]) == (0.3, None, None)
    with pytest.raises(ValueError):
        cp.mean_ci95([])


def test_reference_curve_fits_passes_through_anchors_and_inverts():
    c = np.logspace(12, 14, 30)
    law_true = 3.0 + 2.0 * (c / 1e14) ** -0.3
    law = cp.fit_power_law(c, law_true)
    assert (law.a, law.b, law.c, law.rmse) == pytest.approx((2.0, 0.3, 3.0, 0.0), abs=0.01)
    anchors = [(3e13, float(law.loss(3e13)) - 0.05), (1e14, float(law.loss(1e14)) - 0.02)]
    ref = cp.ReferenceCurve(law, anchors)
    for ca, la in anchors:
        assert ref.loss(ca) == pytest.approx(la, abs=1e-3)
        assert ref.flops_at(la)[0] == pytest.approx(ca, rel=0.01)
    assert np.all(np.diff(ref.curve) <= 0)  # monotone
    assert ref.flops_at(anchors[0][1])[1] is False and ref.flops_at(anchors[1][1] - 0.05)[1] is True  # extrapolated
    assert ref.flops_at(1.0) == (None, True)  # below the asymptote: never
    half = cp.paired_saving(ref, anchors[0][1], anchors[0][0] / 2)  # the anchor's loss with half its compute
    assert half["saving"] == pytest.approx(0.5, abs=0.01) and not half["bound"]
    assert cp.paired_saving(ref, 1.0, 1e13)["bound"]


def test_equal_rate_threshold_fires_the_live_trigger_at_the_equal_rate_point():
    n = np.arange(1, 81) * 10.0
    target_c, small_c = n * 1e12, n * 0.5e12  # the small model costs half per step
    target_l = 2.0 + 10 * n**-0.5
    small_l = 2.2 + 6 * (n / 2) ** -0.5  # ahead per FLOP at first; its higher floor then slows it below the target
    thr, i = equal_rate_threshold(small_c, small_l, target_c, target_l, window=10, beta=0.0)
    assert 20 < i < 40  # neither the first possible point nor never (i = 30 for these curves)
    assert thr == pytest.approx(loglog_slope(small_c[: i + 1], small_l[: i + 1], 10, 0.0))
    assert first_trigger_index(small_c, small_l, thr, window=10, beta=0.0) == i  # slopes flatten monotonically


def test_ngram_losses_known_case():
    train = np.array([0, 1] * 500)
    res = ngram_losses(train, np.array([0, 1, 0, 1, 0]), vocab=4)
    assert res["unigram"] == pytest.approx(-math.log(501 / 1004), abs=1e-6)  # add-one counts
    assert res["bigram"] < 0.2 < res["unigram"]  # the pairs are deterministic


@pytest.mark.parametrize("argv", [[], ["--quick"], ["--device", "cuda"]])
def test_every_arm_plan_is_a_valid_stage_list_and_dry_run_lists_the_runs(argv, capsys):
    args = ec.parse_args(argv)
    jobs = ec.plan_jobs(args, 4096)
    assert {j.arm.name for j in jobs} == {a.name for a in ec.ARMS}
    assert len([j for j in jobs if j.arm.name == "scratch"]) == args.seeds
    for job in jobs:
        if ec.SLOPE in job.arm.grow:
            job.slope_threshold, job.grow_steps = -0.05, []
        stages = parse_stages(ec.plan_doc(args, job, 4096))
        assert stages.start.n_layer == ec.SIZES["quick" if args.quick else "default"][job.arm.shapes[0]][0]
        if job.arm.staged:
            assert len(stages.stages) == len(job.arm.grow)
            n_layer, n_embd, _ = ec.SIZES["quick" if args.quick else "default"]["target"]
            assert (stages.stages[-1].target.n_layer, stages.stages[-1].target.n_embd) == (n_layer, n_embd)
    assert experiment.main([*argv, "--dry_run", "--data", "no/such/folder"]) == 0  # a dry run needs no data
    assert "depth-slope/seed" in capsys.readouterr().out


def test_limits_name_a_smaller_scratch_model_that_wins_and_a_slope_arm_that_fired_at_once():
    from growlm.eval.experiments.equal_compute_report import limits

    def arm(name, cap, mean, lo, hi, grew):
        return {"arm": name, "equal_steps_cap": cap, "saving_mean": mean, "saving_ci95_low": lo,
                "saving_ci95_high": hi, "saving_std": 0.01, "seeds_positive": 5, "n_seeds": 5,
                "per_seed": [{"grow_steps": g} for g in grew]}  # fmt: skip

    arms = [arm("scratch-2x128", None, 0.3, 0.2, 0.4, [[], []]), arm("depth-g25", 0.08, 0.1, 0.08, 0.12, [[120]] * 5),
            arm("depth-slope", 0.08, 0.1, 0.08, 0.12, [[120]] * 5)]  # fmt: skip
    out = limits(arms, [5.2], {"bigram_all_train": 4.9}, {"depth-g25": [0.68]}, {"depth-slope": 120})
    assert any(s.startswith("scratch-2x128 (no growth) saves +30.0%") and "compute-optimal" in s for s in out)
    assert any(s.startswith("depth-slope: the derived threshold fired at step 120 in 5/5 seeds") and s.endswith(
        "it grew exactly as depth-g25.") for s in out)  # fmt: skip
    late = limits(arms, [5.2], {"bigram_all_train": 4.9}, {}, {"depth-slope": 96})  # grew later than it could
    assert not any("derived threshold fired" in s for s in late)
    arms[0]["saving_ci95_low"] = -0.1  # a smaller model that may not win: no claim
    assert not any("no growth" in s for s in limits(arms, [5.2], {"bigram_all_train": 4.9}, {}, None))
