"""Spec-file experiments (eval/experiments/spec.py, planner.py, runs.py, results.py, render.py): the spec's checks,
the planner's steps over a fabricated loss surface (no training), runs found among an earlier experiment's committed
curves by what they train, the results' arithmetic and the pre-registration. The end-to-end runs of the toy GPT-2
and Llama specs are in tests/distributed/test_experiment_quick.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from dist_utils import REPO

from growlm.eval.experiments import analysis as an
from growlm.eval.experiments import cli as experiment
from growlm.eval.experiments import planner, render, results, runner
from growlm.eval.experiments import protocol as P
from growlm.eval.experiments import spec as sp
from growlm.eval.experiments.runner import Store
from growlm.eval.experiments.runs import Run, job_key, parse_shape, shape_name

SPECS = REPO / "eval" / "experiments" / "specs"
OPTIMUM = REPO / "eval" / "results" / "isoflop_optimum" / "experiment.yaml"


def _write(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "e.yaml"
    f.write_text(text)
    return f


BASE = (SPECS / "quick-gpt2.yaml").read_text()


# ------------------------------------------------------------------------------------------------- the spec file
@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda t: t.replace("head_size: 8", "head_size: 8\n  colour: red"), "model.colour: Extra inputs are not"),
        (lambda t: t.replace("family: gpt2", "family: olmo"), "model.family 'olmo': growlm builds"),
        (lambda t: t.replace("shape: [4, 16]", "shape: [4, 12]"), "n_embd must be a multiple of model.head_size 8"),
        (lambda t: t.replace("pilot: 100", "pilot: 1"), "seeds.pilot 1 is one of the main seeds 0..1"),
        (lambda t: t.replace("budget_flops: 1.2e+9", "budget_flops: lots"), "budget_flops: Input should be a valid"),
        (lambda t: t.replace("growth_at: [0.5, 0.25]", "growth_at: [1.5]"), "each growth point must lie strictly"),
        (lambda t: t.replace("{family: duplicate, layer_order", "{family: grow, layer_order"), "op needs family"),
        (lambda t: t.replace("W32: {shape: [2, 32]}", "W32: {shape: [2, 16]}"), "L2 and W32 are both [2, 16]"),
        (lambda t: t.replace("screen: [0, 1]", "screen: []"), "seeds.screen: Tuple should have at least 1 item"),
        (lambda t: t.replace("below: [0.75, 0.5]", "below: [0.5, 0.75]"), "nearest to B first"),
        (lambda t: t.replace("lr_rules: [keep, mup]", "lr_rules: []"), "width.lr_rules: Tuple should have at least"),
        (lambda t: "- just\n- a list\n", "is not a mapping of spec fields"),
        (lambda t: "name: [unclosed\n", "cannot be read as YAML"),
    ],
)  # fmt: skip
def test_a_bad_spec_is_one_line_naming_the_field(tmp_path, capsys, edit, expected):
    f = _write(tmp_path, edit(BASE))
    assert experiment.main(["--spec", str(f), "--dry_run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0] and str(f) in err[0], err


def test_a_missing_spec_and_flags_that_the_spec_decides_are_refused(tmp_path, capsys):
    assert experiment.main(["--spec", str(tmp_path / "none.yaml")]) == 2
    assert "no such spec file" in capsys.readouterr().err
    f = _write(tmp_path, BASE)
    for flags in (["--phase", "map"], ["--quick"], ["--seeds", "3"], ["--profile", "gpu"]):
        assert experiment.main(["--spec", str(f), *flags]) == 2
        assert "the spec file says what runs" in capsys.readouterr().err
    bad = _write(tmp_path, BASE + "imports: [../nowhere]\n")
    assert experiment.main(["--spec", str(bad), "--dry_run"]) == 2
    assert "is not a folder of curves" in capsys.readouterr().err


def test_shape_config_follows_the_head_rule_for_each_family():
    g = sp.load(SPECS / "quick-gpt2.yaml")
    cfg = sp.shape_config(g, (4, 16))
    assert (cfg.arch, cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_positions, cfg.vocab_size) == ("gpt2", 4, 16, 2,
                                                                                                32, 320)  # fmt: skip
    ll = sp.load(SPECS / "quick-llama.yaml").model_copy()
    cfg = sp.shape_config(ll, (2, 32))
    assert (cfg.arch, cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.tie_word_embeddings) == ("llama", 4, 4, 8, True)
    gqa = ll.model_copy(update={"model": ll.model.model_copy(update={"kv_ratio": 2})})
    assert sp.shape_config(gqa, (2, 32)).n_kv_head == 2
    with pytest.raises(ValueError, match="2 heads is not a multiple of kv_ratio 4"):
        sp.shape_config(ll.model_copy(update={"model": ll.model.model_copy(update={"kv_ratio": 4})}), (2, 16))


def test_shape_names_round_trip():
    assert shape_name((3, 112)) == "D3W112" and parse_shape("D3W112") == (3, 112)
    with pytest.raises(ValueError, match="not a shape name"):
        parse_shape("L2")


# ------------------------------------------------------------------------------------------------ planner steps
def _sweep_with(best: float, widen: int, centre: float = 1e-3):
    def loss(r: Run) -> float:
        return 3.0 + abs(math.log2(r.lr / best))

    grid = [centre / 2, centre, centre * 2]
    return planner.sweep(loss, lambda lr: Run("pilot", 100, 1.0, lr, ("D1W16",)), grid, 2.0, widen)


def test_sweep_widens_past_an_edge_until_the_best_is_inside_or_the_widening_is_spent():
    runs, lr, edge = _sweep_with(best=1e-3, widen=2)
    assert sorted(r.lr for r in runs) == [5e-4, 1e-3, 2e-3] and lr == 1e-3 and edge is None
    runs, lr, edge = _sweep_with(best=4e-3, widen=2)
    assert sorted(r.lr for r in runs) == [5e-4, 1e-3, 2e-3, 4e-3, 8e-3] and lr == 4e-3 and edge is None
    runs, lr, edge = _sweep_with(best=1.6e-2, widen=2)
    assert max(r.lr for r in runs) == 8e-3 and lr == 8e-3 and edge == "highest"
    runs, lr, edge = _sweep_with(best=1e-4, widen=1)
    assert sorted(r.lr for r in runs) == [2.5e-4, 5e-4, 1e-3, 2e-3] and edge == "lowest"
    runs, lr, _ = planner.sweep(lambda r: None, lambda x: Run("pilot", 100, 1.0, x, ("D1W16",)), [5e-4, 1e-3, 2e-3],
                                2.0, 2)  # fmt: skip
    assert lr is None and len(runs) == 3  # nothing finished: the first grid only


def test_mup_centre_scales_the_nearest_tuned_shape_by_width():
    tuned = {(2, 96): 0.0048, (2, 64): 0.002, (4, 64): 0.004}
    assert planner.mup_centre((2, 128), tuned) == pytest.approx(0.0048 * 96 / 128)
    assert planner.mup_centre((4, 80), tuned) == pytest.approx(0.004 * 64 / 80)
    assert planner.mup_centre((3, 96), tuned) == pytest.approx(0.0048)  # depth 2 and 4 tie: the smaller, width 96
    with pytest.raises(ValueError, match="no shape has a tuned LR"):
        planner.mup_centre((2, 64), {})


def test_next_budget_walks_away_from_B_towards_the_arm():
    env = {1.0: 2.50, 0.75: 2.52, 0.5: 2.56, 1.25: 2.48}
    at = env.get
    assert planner.next_budget(2.53, at, (0.75, 0.5), (1.25, 1.5)) is None  # 0.5 B brackets it
    assert planner.next_budget(2.51, at, (0.75, 0.5), (1.25, 1.5)) is None  # 0.75 B already does
    assert planner.next_budget(2.47, at, (0.75, 0.5), (1.25, 1.5)) == 1.5  # past B: 1.25 B does not yet
    assert planner.next_budget(2.60, at, (0.75, 0.5), (1.25, 1.5)) is None  # the budgets run out below


# A fabricated experiment: scratch loss is lowest for D2W32 at LR 4e-3 and falls with the budget; a grown run's
# loss depends on its growth point, policy and LR rule, the width arm's best variant being the lowest of all
OPT = {"D2W16": 2.60, "D4W16": 2.58, "D2W32": 2.55}


def fake(r: Run) -> float:
    if not r.arm:
        base = OPT[r.stages[0]] + 0.02 * (r.seed % 3)
        return base + 0.1 * abs(math.log2(r.lr / 4e-3)) - 0.12 * math.log2(r.budget)
    base = {"depth": 2.56, "width": 2.54, "larger": 2.57}[r.arm] + 0.02 * (r.seed % 3)
    base += 0.1 * abs(math.log2(r.lr / 2e-3)) + 0.01 * abs(r.grow_at[0] - 0.25) * 4
    return base - (0.003 if r.policy == "rewarm" else 0) - (0.002 if r.lr_rule == "mup" else 0)


def _walk(ctx: planner.Context, loss=fake):
    done: dict[str, float] = {}
    rounds = 0
    while True:
        need, st = planner.plan(ctx, lambda r: done.get(r.name))
        todo = [r for r in dict.fromkeys(need) if r.name not in done]
        if not todo:
            return done, st, rounds
        rounds += 1
        for r in todo:
            done[r.name] = loss(r)


def _ctx(arms: str = "") -> planner.Context:
    text = BASE.replace("L4: {shape: [4, 16]}", "L4: {shape: [4, 16]}").replace("main: 2", "main: 3")
    raw = sp.yaml.safe_load(text)
    raw["arms"]["larger"] = {"start": "optimum", "target": "optimum*depth", "op": raw["arms"]["depth"]["op"],
                             "what": "larger"}  # fmt: skip
    return planner.Context(sp.Spec.model_validate(raw))


def test_the_planner_walks_every_step_and_decides_what_the_losses_say():
    ctx = _ctx()
    done, st, rounds = _walk(ctx)
    assert st.complete and rounds >= 8
    assert st.lr["D2W16"] == 4e-3 and st.lr["D4W16"] == 4e-3 and st.lr["D2W32"] == 4e-3
    assert st.best == ["D2W32", "D4W16"] and st.optimum == "D2W32"
    w = st.arms["width"]
    assert (w.start, w.target) == ("D2W16", "D2W32")
    assert st.arms["depth"].start == "D1W32" and st.arms["larger"].target == "D4W32"
    c = w.chosen  # the LR (grid 0.5..2 x the target's 4e-3), its one growth point, then rewarm, then mup
    assert (c.lr, c.grow_at, c.policy, c.lr_rule) == (2e-3, (0.5,), "rewarm", "mup")
    c = st.arms["depth"].chosen  # its second growth point, 0.25 B, is better
    assert (c.lr, c.grow_at, c.policy, c.lr_rule) == (2e-3, (0.25,), "rewarm", "keep")
    assert "mup" not in "".join(st.arms["depth"].tried)  # the LR rule is tried after a width growth only
    assert st.primary == "width"
    # main: the chosen variant on every seed; the arm is below the envelope at B, so the best shapes and S* run
    # past B until one budget's loss is at or below the arm's
    for k in range(3):
        arm = Run("main", k, 1.0, 2e-3, ("D2W16", "D2W32"), (0.5,), "width", "rewarm", "mup")
        assert arm.name in done
        la = fake(arm)
        for z in ("D2W32", "D4W16"):
            ran = [b for b in (1.5, 2.0) if Run("bracket", k, b, 4e-3, (z,)).name in done]
            assert ran == [1.5], (k, z, la)  # 1.5 B brackets it on every seed: 2 B never runs
    store = _FakeStore(done, ctx)
    res = results.summarize(ctx, store, st, {}, "e.yaml")
    p = res["primary"]
    assert p["n_seeds"] == 3 and p["n_negative"] == 3
    k0 = p["per_seed"][0]
    la = k0["arm_loss"]
    pts = [(1.0, min(fake(Run("main", 0, 1.0, 4e-3, (z,))) for z in st.best)),
           (1.5, min(fake(Run("bracket", 0, 1.5, 4e-3, (z,))) for z in st.best))]  # fmt: skip
    assert k0["envelope"]["saving"] == pytest.approx(1 - 1 / an.compute_to_reach(pts, la), abs=1e-4)
    assert (
        p["saving_vs_envelope"]["n"] == 3 and p["saving_vs_envelope"]["mean"] > 0
    )  # below the envelope at B: a saving


class _FakeStore:
    """The part of runs.Store that results.summarize reads, over fabricated losses by run name."""

    def __init__(self, done: dict[str, float], ctx: planner.Context) -> None:
        self.done, self.own, self.imported, self.read, self.own_earlier = done, {}, 0, {}, []

    def loss(self, r: Run, mark: bool = True) -> float | None:
        return self.done.get(r.name)

    def get(self, r: Run, mark: bool = True) -> dict:
        return {"curve": {"machine": "test"}}


def test_an_arm_that_this_optimum_cannot_build_is_skipped_with_its_reason():
    text = BASE.replace("W32: {shape: [2, 32]}", "W24: {shape: [2, 24], lr: 4.0e-3}")
    ctx = planner.Context(sp.Spec.model_validate(sp.yaml.safe_load(text)))

    def loss(r: Run) -> float:
        return fake(Run.from_dict(r.as_dict() | {"stages": ["D2W32" if z == "D2W24" else z for z in r.stages]}))

    _, st, _ = _walk(ctx, loss)
    assert st.optimum == "D2W24" and "width" in st.skipped and "head size 8" in st.skipped["width"]
    assert "depth" in st.arms and st.complete


# ----------------------------------------------------------------------------------- runs found by what they train
def test_a_run_is_found_among_an_earlier_experiments_committed_curves():
    spec = sp.load(OPTIMUM)
    ctx = planner.Context(spec)
    folder = REPO / "eval" / "results" / "isoflop_optimal"
    store = Store(ctx, Path("/nonexistent"), [folder / "curves", folder / "wide" / "curves"], None)
    lr = spec.envelope.shapes["D2W96"].lr
    f = folder / "wide" / "curves" / "wide" / "D2W96-B1-lr5.33e-03-s3.json"
    committed = json.loads(f.read_text())["curve"]["final"]["val_loss"]
    assert store.loss(Run("main", 3, 1.0, lr, ("D2W96",))) == committed
    assert store.loss(Run("main", 3, 1.0, lr * 2, ("D2W96",))) is None  # another LR: another run
    assert store.loss(Run("main", 3, 0.5, lr, ("D2W96",))) is not None  # the wide envelope's bracketing run
    # the old protocol's run and the spec's run train by the same Job
    rec = runner.read_curve(f)
    assert job_key(rec["spec"].job(P.settings_from_dict(rec["settings"]))) == job_key(
        Run("main", 3, 1.0, lr, ("D2W96",)).job(ctx)
    )


# ------------------------------------------------------------------------------------------ the pre-registration
def test_the_preregistration_is_appended_to_never_rewritten(tmp_path):
    f = _write(tmp_path, BASE)
    spec = sp.load(f)
    where = tmp_path / render.PREREG
    pre = render.prereg_new(spec, f)
    pre = render.prereg_fix(where, pre, "optimum", "D2W32", "any arm run")
    assert json.loads(where.read_text())["fixed"][0]["value"] == "D2W32"
    assert render.prereg_fix(where, pre, "optimum", "D2W32", "any arm run") == pre  # the same decision: unchanged
    with pytest.raises(render.PreregError, match="fixes optimum = 'D2W32', the curves now give 'D4W16'"):
        render.prereg_fix(where, pre, "optimum", "D4W16", "any arm run")
    render.prereg_check(pre, f, False)
    f.write_text(BASE + "# a change\n")
    with pytest.raises(render.PreregError, match="changed after its pre-registration"):
        render.prereg_check(pre, f, False)
    amended = {**pre, "amendments": [{"date": "2026-12-07", "why": "test", "spec_sha256": render.spec_sha(f)}]}
    render.prereg_check(amended, f, False)


def test_the_committed_preregistration_fixes_the_committed_spec():
    pre = json.loads((OPTIMUM.parent / render.PREREG).read_text())
    render.prereg_check(pre, OPTIMUM, False)
    assert pre["experiment"] == sp.load(OPTIMUM).name and pre["goal"] == 0.10


def test_the_spec_in_the_docs_is_a_valid_spec(tmp_path):
    text = (REPO / "docs" / "evaluation.md").read_text()
    block = text.split("### Writing an experiment")[1].split("```yaml\n")[1].split("```")[0]
    spec = sp.load(_write(tmp_path, block))
    assert spec.model.family == "llama" and sp.shape_config(spec, (2, 96)).n_kv_head == 3
    assert spec.arms["depth"].lr_rules == ("keep", "mup") and spec.imports == ("../isoflop_optimal/wide/curves",)


def test_a_malformed_token_folder_is_one_line(tmp_path, capsys):
    data = tmp_path / "tok"
    data.mkdir()
    (data / "meta.json").write_text(json.dumps({"format": "growlm-tokens-v2", "splits": {}}))
    f = _write(tmp_path, BASE)
    assert experiment.main(["--spec", str(f), "--data", str(data), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--data {data}: " in err[0] and "meta.json" in err[0]
    assert not (tmp_path / "o" / "curves").exists()
