"""Live growth of a ZeRO-sharded run with 2 real ranks (gloo, CPU).

The probe (tests/live_growth_probe.py) grows a live engine and gathers what the new engine holds; train.py tests
run a growth plan end to end: loss preserved, training continues, a checkpoint mid-ramp resumes exactly, bad plans
are refused on every rank without a hang.
"""

from __future__ import annotations

import json

import pytest
from dist_utils import SMALL_VOCAB, fp16_supported, read_metrics, run_ranks, tiny_ds_config

SCENARIOS = [
    ("zero0_fp32", "masked"),
    ("zero1_fp32", "duplicate"),
    ("zero2_fp32", "masked"),
    ("zero2_fp32", "duplicate"),
    ("zero3_fp32", "masked"),
    ("zero3_fp32", "duplicate"),
    ("zero3_fp32", "depth"),  # every rule applied locally, no collective (growth.live.transfer.local_maps)
    ("zero0_bf16", "duplicate"),
    ("zero1_bf16", "masked"),
    ("zero2_bf16", "duplicate"),
    ("zero3_bf16", "masked"),
    # the GPU variants' settings (DeepSpeed's buckets; at ZeRO-3 small parameters persist whole on every rank)
    ("gpu/zero2_fp32", "duplicate"),
    ("gpu/zero3_fp32", "masked"),
    # the Llama family: one exact growth of every dimension at once per ZeRO stage (width x2, more query heads per
    # key/value head, FFN, depth, symmetry noise; tied embeddings at ZeRO-1 and 3), and the masked family likewise
    # at every ZeRO stage
    ("zero1_fp32", "llama-duplicate-tied"),
    ("zero2_fp32", "llama-duplicate"),
    ("zero3_fp32", "llama-duplicate"),
    ("zero3_fp32", "llama-duplicate-tied"),
    ("zero1_fp32", "llama-masked"),
    ("zero2_fp32", "llama-masked"),
    ("zero3_fp32", "llama-masked"),
    ("zero0_bf16", "llama-masked"),  # the Llama in bf16, at ZeRO-0 and ZeRO-3
    ("zero3_bf16", "llama-duplicate"),
    # Qwen 2 (the Llama shape with q/k/v biases) at every ZeRO stage, both operator families
    ("zero1_fp32", "qwen2-duplicate-tied"),
    ("zero2_fp32", "qwen2-masked"),
    ("zero3_fp32", "qwen2-duplicate"),
]


def probe(tmp_path, template: str, family: str, *extra: str) -> dict:
    out = tmp_path / "probe.json"
    r = run_ranks([f"ds_configs/{template}.json", family, str(out), *extra], script="tests/live_growth_probe.py")
    assert r.returncode == 0, r.stdout[-4000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("template, family", SCENARIOS)
def test_live_growth_carries_the_whole_training_state(tmp_path, template, family):
    d = probe(tmp_path, template, family)
    fp32 = template.endswith("fp32")
    # the function is preserved: same loss on a fixed batch, eval mode (exact operators)
    assert abs(d["loss_after"] - d["loss_before"]) <= (1e-5 if fp32 else 1e-2), (d["loss_before"], d["loss_after"])
    # every parameter and both Adam moments, gathered from the new engine, equal the plan's rule applied to the
    # gathered old state, element by element
    worst = {name: max(v) for name, v in d["diffs"].items()}
    assert max(worst.values()) == 0.0, {k: v for k, v in worst.items() if v}
    # Adam step and global step carried; LR of the first post-growth step placed by the rule (target, /2, re-warm)
    assert d["adam_step_after"] == d["adam_step_before"] >= 3  # stage 0 bf16's optimizer takes one extra step at init
    assert d["global_steps_after"] == d["step"] == 3
    assert d["first_lr"] == pytest.approx(d["expected_first_lr"], rel=1e-12)
    assert d["first_lr"] > 0
    # the old engine is gone: no hook left on its module (DESIGN.md, "Checkpoint failure kinds: stale ZeRO-3 hooks")
    assert d["hooks_left_on_old_module"] == 0
    # after steps on the grown engine, the fp32 master and the working copy agree (DESIGN.md, "Checkpoint failure
    # kinds: stale fp32 master") ...
    assert max(d["master_vs_working"].values()) == 0.0, d["master_vs_working"]
    # ... every parameter, new ones included, is in the optimizer and moves (DESIGN.md, "Checkpoint failure kinds:
    # parameters added mid-training")
    assert min(d["moved"].values()) > 0, [k for k, v in d["moved"].items() if v == 0]
    assert all(loss == loss and loss < 10 for loss in d["losses_after_growth"])
    # few collectives (growth.live.transfer): the tiny model is one bucket, gathered by one all_gather (ZeRO-3) or
    # one broadcast per rank owning part of it (ZeRO-1/2); depth growth at ZeRO-3 moves nothing
    if family == "depth":
        assert d["collectives"] == 0 and d["bytes_moved"] == 0
    elif not template.startswith("zero0"):
        assert 1 <= d["collectives"] <= 2, d["collectives"]
    assert set(d["build_seconds"]) == {"module", "zero3_partition", "optimizer", "engine_other", "adam_state"}


@pytest.mark.parametrize("family", ["duplicate", "llama-duplicate"])
def test_fp16_loss_scaler_is_carried(tmp_path, family):
    # On a CPU with AVX512-FP16 / AMX-FP16 this is real fp16. On one without, DeepSpeed refuses fp16 at
    # initialize; the probe then lifts only that device check, so ZeRO-2's fp16 path (dynamic loss scaler) still
    # runs on the same kernels PyTorch has for fp16 on every x86 CPU.
    d = probe(tmp_path, "zero2_fp16", family, *([] if fp16_supported() else ["--force-cpu-fp16"]))
    assert d["fp16_supported_natively"] == fp16_supported()
    assert d["scaler_before"]["cur_scale"] is not None
    assert d["scaler_after"] == d["scaler_before"]
    assert abs(d["loss_after"] - d["loss_before"]) <= 1e-2


TINY = ["--seq_len", "32", "--log_interval", "1", "--no_final_eval"]
PLAN_MASKED = """
seed: 0
start: {preset: tiny, n_layer: 1, n_embd: 32, n_head: 2}
stages:
  - name: all-dims
    target: {n_layer: 2, n_embd: 64, n_head: 4}
    family: masked
    when: {step: 3}
    ramp_steps: 4
    optimizer: {moments: carry, fresh_exp_avg_sq: mean}
    schedule: {kind: continue}
"""
PLAN_DUP = """
seed: 0
start: {preset: tiny, n_layer: 1, n_embd: 32, n_head: 2}
stages:
  - name: width
    target: {n_embd: 64, n_head: 4}
    family: duplicate
    options: {pattern: split, alpha: 0.7}
    when: {step: 3}
    schedule: {kind: target, constant_op: 1.8, rewarm_steps: 4}
  - name: depth
    target: {n_layer: 2}
    family: duplicate
    when: {tokens: 1500}
    schedule: {kind: continue}
"""


PLAN_LLAMA = f"""
seed: 0
start: {{preset: llama-tiny, n_layer: 1, n_embd: 32, n_head: 2, n_kv_head: 1, n_inner: 64, vocab_size: {SMALL_VOCAB}}}
stages:
  - name: wider
    target: {{n_embd: 64, n_head: 4, n_kv_head: 2, n_inner: 128}}
    family: duplicate
    when: {{step: 2}}
    schedule: {{kind: target, constant_op: 1.8, rewarm_steps: 4}}
  - name: deeper
    target: {{n_layer: 2}}
    family: masked
    when: {{step: 4}}
    ramp_steps: 4
    optimizer: {{moments: carry, fresh_exp_avg_sq: mean}}
    schedule: {{kind: continue}}
"""


@pytest.mark.parametrize(
    "plan_text, template", [(PLAN_MASKED, "zero2_fp32"), (PLAN_DUP, "zero3_fp32"), (PLAN_LLAMA, "zero1_fp32")]
)
def test_train_py_grows_and_a_checkpoint_in_the_ramp_resumes_exactly(tmp_path, plan_text, template, request):
    plan = tmp_path / "plan.yaml"
    plan.write_text(plan_text)
    ds = tiny_ds_config(tmp_path, template)
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    data = []  # the Llama plan trains on the small vocabulary (its tokenizer does not matter here)
    if "llama" in plan_text:
        data = ["--data", str(request.getfixturevalue("small_vocab_data"))]
    r = run_ranks(
        [
            *TINY,
            *data,
            "--ds_config",
            str(ds),
            "--max_steps",
            "10",
            "--save_interval",
            "5",
            "--growth_plan",
            str(plan),
            "--out_dir",
            str(full),
        ]
    )
    assert r.returncode == 0, r.stdout[-4000:]
    # a clean console: growlm's own warnings fixed at their cause, the known third-party ones filtered (runtime.quiet)
    for noise in ("FutureWarning", "is deprecated", "Attempting to get learning rate", "Traceback"):
        assert noise not in r.stdout, (noise, r.stdout[-4000:])
    growths, steps = read_metrics(full, "growth"), read_metrics(full)
    assert len(growths) == plan_text.count("- name:")
    for g in growths:
        assert abs(g["loss_after"] - g["loss_before"]) <= 1e-5, g  # exact operators, fp32
        assert g["params_to"] > g["params_from"] and g["seconds"] > 0 and g["build_optimizer_s"] >= 0
        if template == "zero3_fp32" and g["stage"] == "depth":  # every rule elementwise: each rank maps its own shard
            assert g["bytes_moved"] == 0 and g["collectives"] == 0, g
        else:
            assert g["bytes_moved"] > 0 and g["collectives"] >= 1, g
    assert steps[-1]["loss"] < steps[0]["loss"] - 0.1  # training continued and learned
    state = json.loads((full / "checkpoints" / "global_step5" / "growlm_state.json").read_text())
    assert state["growth_stage"] >= 1 and state["model_config"]["n_embd"] == 64
    assert len(state["growth"]) == state["growth_stage"] and all(g["live"] for g in state["growth"])  # history
    assert state["growth"][-1]["to"] == state["model_config"]
    # step 5 is inside the mask ramp (masked) or the LR re-warm (duplicate): both must survive the resume
    assert state["growth_masks"] is not None or state["schedule"]["rewarm_steps"] == 4

    r = run_ranks(
        [
            *TINY,
            *data,
            "--ds_config",
            str(ds),
            "--max_steps",
            "10",
            "--growth_plan",
            str(plan),
            "--resume",
            str(full / "checkpoints" / "global_step5"),
            "--out_dir",
            str(resumed),
            "--activation_checkpointing",  # the resumed job recomputes activations: the same losses all the same
        ]
    )
    assert r.returncode == 0, r.stdout[-4000:]
    assert not any(g["activation_checkpointing"] for g in growths)
    assert all(g["activation_checkpointing"] for g in read_metrics(resumed, "growth"))  # grown blocks get it too
    a, b = {m["step"]: m for m in steps}, read_metrics(resumed)
    assert [m["step"] for m in b] == list(range(6, 11))
    for m in b:
        assert abs(m["loss"] - a[m["step"]]["loss"]) <= 1e-6, (m, a[m["step"]])
        assert m["lr"] == pytest.approx(a[m["step"]]["lr"], rel=1e-12)
    assert [g["step"] for g in read_metrics(resumed, "growth")] == [g["step"] for g in growths if g["step"] > 5]


@pytest.mark.bad_input
def test_ranks_with_different_plans_fail_on_every_rank_without_a_hang(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(PLAN_MASKED)
    b.write_text(PLAN_MASKED.replace("step: 3", "step: 4"))
    ds = tiny_ds_config(tmp_path)
    common = [*TINY, "--ds_config", str(ds), "--max_steps", "6", "--out_dir", str(tmp_path / "o")]
    r = run_ranks([[*common, "--growth_plan", str(a)], [*common, "--growth_plan", str(b)]], timeout=300)
    assert r.returncode == 2
    assert r.stdout.count("the ranks read different --growth_plan files") == 2  # each rank says it
    assert not (tmp_path / "o" / "checkpoints").exists()


def refused(tmp_path, plan_text: str, ds_cfg: dict) -> str:
    """Run train.py (1 rank) with a plan and config that must be refused; its output."""
    plan, ds = tmp_path / "plan.yaml", tmp_path / "ds.json"
    plan.write_text(plan_text)
    ds.write_text(json.dumps(ds_cfg))
    args = ["--ds_config", str(ds), "--max_steps", "6", "--growth_plan", str(plan), "--out_dir", str(tmp_path / "o")]
    r = run_ranks([*TINY, *args], nproc=1)
    assert r.returncode == 2, r.stdout[-2000:]
    return r.stdout


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "edit, template, message",
    [
        (("step: 3", "step: 0"), "zero2_fp32", "no Adam state before the first optimizer step"),
        (("step: 3", "slope: auto"), "zero2_fp32", "set --eval_interval"),
        (("n_embd: 64", "n_embd: 66"), "zero2_fp32", "not divisible"),
        (("n_embd: 64", "n_embd: 60"), "zero2_fp32", "head dim would shrink"),
        (("n_layer: 2,", "n_layer: 0,"), "zero2_fp32", "all-dims"),
        (None, "zero0_fp16", "fp16 at ZeRO stage 1-3"),
    ],
)
def test_bad_plans_are_refused_before_training(tmp_path, edit, template, message):
    cfg = json.loads(tiny_ds_config(tmp_path, template.replace("fp16", "fp32")).read_text())
    if "fp16" in template:
        cfg["fp16"] = {"enabled": True}
    out = refused(tmp_path, PLAN_MASKED.replace(*edit) if edit else PLAN_MASKED, cfg)
    assert message in out, out[-2000:]


@pytest.mark.bad_input
def test_plan_that_the_zero3_config_cannot_hold_is_refused(tmp_path):
    cfg = json.loads(tiny_ds_config(tmp_path, "zero3_fp32").read_text())
    cfg["zero_optimization"]["stage3_max_live_parameters"] = 1_000_000  # wte grows to 50257 x 64 = 3.2M
    out = refused(tmp_path, PLAN_MASKED, cfg)
    assert "stage3_max_live_parameters=1,000,000" in out, out[-2000:]
