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


def test_a_llama_width_growth_scales_what_follows_the_width_unless_given():
    """A Llama target names what changes; n_inner follows the width, n_kv_head keeps the query heads per key/value
    head, and head_dim stays when more heads are asked for (wider heads when only n_embd is), as GPT-2's n_inner
    follows its width. Given fields are taken as they are. Both the plan and growlm-grow's flags read it so."""
    from growlm.growth.offline.cli import parse_args, stage_from_flags
    from growlm.growth.ops import make_rules
    from growlm.model.config import from_preset, grown_shape

    tiny = from_preset("llama-tiny")  # d 64, 4 heads of 16, 2 kv heads, F 128
    shape = lambda c: (c.n_embd, c.n_head, c.n_kv_head, c.head_dim, c.n_inner)  # noqa: E731
    assert shape(grown_shape(tiny, {"n_embd": 128, "n_head": 8})) == (128, 8, 4, 16, 256)
    assert shape(grown_shape(tiny, {"n_embd": 128})) == (128, 4, 2, 32, 256)
    assert shape(grown_shape(tiny, {"n_head": 8})) == (64, 8, 4, 16, 128)  # more heads: the attention widens
    given = {"n_embd": 128, "n_head": 8, "n_kv_head": 2, "n_inner": 200}
    assert shape(grown_shape(tiny, given)) == (128, 8, 2, 16, 200)
    assert grown_shape(tiny, {"n_layer": 4}) == from_preset("llama-tiny", n_layer=4)
    gpt = from_preset("tiny")
    assert grown_shape(gpt, {"n_embd": 128}).ffn_dim == 512  # GPT-2: 4 x n_embd, as before

    wider = {"name": "wider", "target": {"n_embd": 128, "n_head": 8}, "family": "masked", "when": {"step": 3}}
    plan = parse_stages({"start": {"preset": "llama-tiny"}, "stages": [wider]})
    target = plan.stages[0].target
    assert shape(target) == (128, 8, 4, 16, 256)
    make_rules(tiny, target, "masked")  # the operators take it (it used to need n_kv_head, then n_inner, given)
    args = parse_args(["ck", "out", "--n_embd", "128", "--n_head", "8"])
    assert stage_from_flags(args, tiny, 10).target == target
