"""Growth plan files: the examples load, and bad chains fail with the stage named."""

from pathlib import Path

import pytest

from growlm.growth.errors import GrowthError
from growlm.growth.stages.plan import load_stages, parse_stages

PLANS = Path(__file__).resolve().parents[2] / "growth" / "plans"


@pytest.mark.parametrize("name", ["tiny_msg.yaml", "tiny_staged.yaml"])
def test_example_plans_load(name):
    plan = load_stages(PLANS / name)
    assert plan.stages[-1].target.n_layer == 4 and plan.stages[-1].target.n_embd == 128


def doc(*stages):
    return {"start": {"preset": "tiny", "vocab_size": 97}, "stages": list(stages)}


def stage(**kw):
    return {"target": {"n_layer": 3}, "family": "masked", "when": {"step": 10}} | kw


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("d", "match"),
    [
        (doc(stage(target={"n_layer": 1})), "shrink"),
        (doc(stage(target={"n_head": 5})), "not divisible"),
        (doc(stage(target={"n_embd": 96, "n_head": 4}, family="duplicate")), "integer factor"),
        (doc(stage(), stage(target={"n_layer": 4}, when={"step": 5})), "not after the previous"),
        (doc(stage(ramp_steps=50), stage(target={"n_layer": 4}, when={"step": 30})), "ramp runs until step 60"),
        (doc(stage(when={"epoch": 3})), "must be one of"),
        (doc(stage(when={"step": 3, "reference": "r/metrics.jsonl"})), "'reference' goes with {slope: auto} only"),
        (doc(stage(when={"slope": -0.05, "reference": "r/metrics.jsonl"})), "goes with {slope: auto} only"),
        (doc(stage(optimizer={"moments": "keep"})), "unknown moments policy"),
        ({"stages": []}, "needs 'start'"),
    ],
)
def test_bad_plans(d, match):
    with pytest.raises(GrowthError, match=match):
        parse_stages(d)


def test_chained_stages_grow_from_the_previous_shape():
    p = parse_stages(doc(stage(ramp_steps=5), stage(target={"n_embd": 128, "n_head": 8}, when={"step": 15})))
    assert p.stages[1].target.n_layer == 3 and p.stages[1].target.n_embd == 128


def test_slope_auto_takes_gpt2_constants_or_a_reference_run():
    gpt2 = parse_stages(doc(stage(when={"slope": "auto"}))).stages[0].when
    assert (gpt2.kind, gpt2.value, gpt2.reference) == ("slope", -0.0575, None)  # depth grows: Shen et al.'s depth
    ref = parse_stages(doc(stage(when={"slope": "auto", "reference": "runs/t/metrics.jsonl"}))).stages[0].when
    assert ref.kind == "slope" and ref.reference == "runs/t/metrics.jsonl" and ref.value != ref.value  # NaN
    assert ref.describe() == "slope auto (equal rate with runs/t/metrics.jsonl)" and gpt2.describe() == "slope -0.0575"
