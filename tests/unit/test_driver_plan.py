"""growlm-run without processes: stage resources parsed and checked at load (trainer/driver/resources.py), the plan cut
into
jobs with their DeepSpeed configs and launcher commands (trainer/driver/segments.py), the model-state memory per
rank (runtime/memory.py, ZeRO paper Fig. 1) and the metrics trimming of a restarted driver."""

from __future__ import annotations

import json

import pytest

from growlm.growth.errors import GrowthError
from growlm.growth.stages.plan import parse_stages
from growlm.runtime.memory import model_state_bytes
from growlm.trainer.driver.phases import trim_metrics
from growlm.trainer.driver.resources import Resources, stage_resources
from growlm.trainer.driver.segments import (
    DriverError,
    check_hostfile,
    config_defaults,
    job_args,
    launcher_commands,
    make_segments,
    segment_ds_config,
)

START = {"ranks_per_node": 1, "zero_stage": 2, "micro_batch": 4, "grad_accum": 2}
DS = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 1}}


def plan(start_res=None, deeper_res=None, wider_res=None):
    start = {"preset": "tiny", "vocab_size": 97} | ({"resources": start_res} if start_res is not None else {})
    deeper = {"name": "deeper", "target": {"n_layer": 3}, "family": "masked", "when": {"step": 10}, "ramp_steps": 2}
    wider = {"name": "wider", "target": {"n_embd": 96, "n_head": 6}, "family": "masked", "when": {"step": 20}}
    for st, res in ((deeper, deeper_res), (wider, wider_res)):
        if res is not None:
            st["resources"] = res
    return parse_stages({"start": start, "stages": [deeper, wider]})


def test_resources_inherit_field_by_field_and_split_the_plan_into_jobs():
    p = plan(START, None, {"ranks_per_node": 2, "grad_accum": 1})
    start, (deeper, wider) = stage_resources(p)
    assert start == Resources(ranks_per_node=1, zero_stage=2, micro_batch=4, grad_accum=2)
    assert deeper == start  # no resources: where the previous stage ran (live growth)
    assert (wider.world_size, wider.zero_stage, wider.micro_batch, wider.grad_accum, wider.global_batch) == (
        2,
        2,
        4,
        1,
        8,
    )
    segs = make_segments(p, DS)
    assert [(s.index, s.first_stage, s.stop_stage, s.stages) for s in segs] == [
        (0, None, "wider", ("deeper",)),
        (1, 1, None, ()),
    ]
    cfg = segment_ds_config({**DS, "train_batch_size": 2}, segs[1].resources)
    assert cfg["zero_optimization"]["stage"] == 2 and cfg["gradient_accumulation_steps"] == 1
    assert cfg["train_micro_batch_size_per_gpu"] == 4 and "train_batch_size" not in cfg
    assert len(make_segments(plan(), DS)) == 1  # no resources anywhere: one job, every growth live


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("start", "wider", "match"),
    [
        (START, {"ranks_per_node": 2}, "global batch changes from 8 to 16"),
        (START, {"ranks_per_node": 2, "grad_accum": 1, "global_batch": 16}, "global_batch=16 is not"),
        (START, {"zero_stage": 3}, "crosses between stages 1/2 and 3"),
        (START | {"zero_stage": 0}, {"ranks_per_node": 2, "grad_accum": 1}, "no universal checkpoint at stage 0"),
        ({"ranks_per_node": 1}, {"ranks_per_node": 2}, "state micro_batch and grad_accum"),
        (START, {"gpus": 2}, "unknown resources keys"),
        (START, {"ranks_per_node": 0}, "positive integer"),
        (START, {"hosts": ["a", "b"], "nodes": 3}, "one host per node"),
        (START, {"hosts": ["a"], "hostfile": "hf"}, "not both"),
        (START, {"no_ssh": "yes"}, "true or false"),
        (START, {"zero_stage": 2.0}, "must be 0, 1, 2 or 3"),
        (START, {"nodes": 2, "ranks_per_node": 1, "grad_accum": 1}, "no machines named"),  # would write node0, node1
    ],
)
def test_bad_resources_are_refused_before_any_job(start, wider, match):
    with pytest.raises(GrowthError, match=match) as e:
        stage_resources(plan(start, None, wider))
    assert "stage 'wider'" in str(e.value)


@pytest.mark.bad_input
@pytest.mark.parametrize("name", ["deeper", "a/b", "..", ""])
def test_stage_names_must_be_unique_and_safe_as_folder_names(name):
    doc = {"start": {"preset": "tiny"}, "stages": [
        {"name": "deeper", "target": {"n_layer": 3}, "family": "masked", "when": {"step": 2}},
        {"name": name, "target": {"n_layer": 4}, "family": "masked", "when": {"step": 9}},
    ]}  # fmt: skip
    with pytest.raises(GrowthError, match="names must be unique non-empty strings without '/' or '..'"):
        parse_stages(doc)


@pytest.mark.bad_input
def test_start_global_batch_needs_micro_batch_and_grad_accum():
    with pytest.raises(GrowthError, match="global_batch=8 needs micro_batch and grad_accum"):
        stage_resources(plan({"ranks_per_node": 1, "global_batch": 8}))


def test_train_batch_size_fills_the_missing_micro_batch_or_accumulation():
    one = Resources()
    assert config_defaults({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4}, one) == (0, 4, 4)
    assert config_defaults({"train_batch_size": 16, "gradient_accumulation_steps": 2}, Resources(ranks_per_node=2)) == (
        0, 4, 2,
    )  # fmt: skip
    assert config_defaults({"train_batch_size": 8, "zero_optimization": {"stage": 2}}, one) == (2, 8, 1)
    assert config_defaults({"train_batch_size": 8}, Resources(micro_batch=2)) == (0, 2, 4)  # the start's micro batch
    segs = make_segments(plan({"ranks_per_node": 1}), {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4})
    assert segs[0].resources.global_batch == 16  # not 4: the config's train_batch_size is kept
    cfg = segment_ds_config({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4}, segs[0].resources)
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (4, 4)
    for bad, match in (({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4}, "not divisible by 4 x 1"),
                       ({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2},
                        "is not micro batch 4 x accumulation 2 x 1")):  # fmt: skip
        with pytest.raises(DriverError, match=match):
            config_defaults(bad, one)


def test_a_stated_global_batch_change_is_allowed():
    p = plan(START, None, {"ranks_per_node": 2, "grad_accum": 2, "global_batch": 16})
    assert stage_resources(p)[1][1].global_batch == 16
    segs = make_segments(p, {"train_micro_batch_size_per_gpu": 4})  # the driver's cut, not only the parser's
    assert [s.resources.global_batch for s in segs] == [8, 16]
    with pytest.raises(GrowthError, match=r"the global batch changes from 8 to 16 .* state global_batch: 16"):
        make_segments(plan(START, None, {"ranks_per_node": 2, "grad_accum": 2}), {"train_micro_batch_size_per_gpu": 4})


def test_config_values_fill_the_gaps_and_are_checked_too():
    p = plan({}, None, {"zero_stage": 2})  # start's ZeRO stage is the config's: unknown at load
    segs = make_segments(p, DS)  # the config says 1: 1 -> 2, a change the driver makes offline
    assert [s.resources.zero_stage for s in segs] == [1, 2] and segs[1].resources.micro_batch == 2
    with pytest.raises(DriverError, match="crosses between stages 1/2 and 3"):
        make_segments(p, {**DS, "zero_optimization": {"stage": 3}})


def test_launcher_commands_single_node_hostfile_and_no_ssh(tmp_path):
    one = launcher_commands(Resources(ranks_per_node=2), "deepspeed", 1234, "train.py", ["--x"], None)
    assert one == [["deepspeed", "--num_gpus", "2", "--master_addr", "127.0.0.1", "--master_port", "1234",
                    "train.py", "--x"]]  # fmt: skip
    hf = tmp_path / "hf"
    ssh = launcher_commands(Resources(nodes=2, ranks_per_node=8, hosts=("n0", "n1")), "ds", 1, "t.py", [], hf)
    assert ssh == [["ds", "--hostfile", str(hf), "--master_addr", "n0", "--master_port", "1", "t.py"]]
    no_ssh = launcher_commands(Resources(nodes=2, no_ssh=True), "ds", 1, "t.py", [], hf)
    assert [c[-2] for c in no_ssh] == ["--node_rank=0", "--node_rank=1"] and no_ssh[0][4] == "127.0.0.1"
    hf.write_text("# cluster\ngpu-a slots=8\ngpu-b slots=8\n")  # a user's hostfile: rank 0 on its first host
    own = launcher_commands(Resources(nodes=2, ranks_per_node=8, hostfile=str(hf)), "ds", 1, "t.py", [], hf)
    assert own[0][3:5] == ["--master_addr", "gpu-a"]


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("text", "match"),
    [
        (None, "No such file"),
        ("gpu-a slots=8\ngpu-b 8\n", r"hf:2: 'gpu-b 8' is not 'name slots=N'"),
        ("gpu-a slots=8\ngpu-b slots=4\n", r"lists \[\('gpu-a', 8\), \('gpu-b', 4\)\], but .* 2 node\(s\) x 8"),
    ],
)
def test_bad_hostfiles_are_refused(tmp_path, text, match):
    hf = tmp_path / "hf"
    if text is not None:
        hf.write_text(text)
    with pytest.raises(DriverError, match=match):
        check_hostfile(Resources(nodes=2, ranks_per_node=8, hostfile=str(hf)))


def test_job_args_replace_the_given_ds_config_in_every_form(tmp_path):
    cfg = tmp_path / "seg.json"
    for given in (["--ds_config", "a.json"], ["--ds_config=a.json"], ["--ds_conf", "a.json"]):
        got = job_args(["--seq_len", "32", *given, "--max_steps", "7"], "p.yaml", cfg, "g/stage1", "wider")
        assert got == ["--seq_len", "32", "--max_steps", "7", "--growth_plan", "p.yaml", "--ds_config", str(cfg),
                       "--resume", "g/stage1", "--stop_before_stage", "wider"]  # fmt: skip


@pytest.mark.parametrize(
    ("zero", "precision", "world", "per_param"),
    [
        (0, "fp32", 4, 16),  # 4 weights + 4 gradients + 8 Adam (exp_avg, exp_avg_sq)
        (1, "fp32", 4, 8 + 12 / 4),  # DeepSpeed's ZeRO optimizers keep their own fp32 partition in fp32 too: K = 12
        (2, "fp32", 4, 4 + 16 / 4),
        (3, "fp32", 4, 20 / 4),
        (0, "bf16", 8, 16),  # ZeRO paper: 2 + 2 + K, K = 12 (fp32 master, exp_avg, exp_avg_sq)
        (1, "bf16", 8, 4 + 12 / 8),
        (2, "bf16", 8, 2 + 14 / 8),
        (3, "fp16", 8, 16 / 8),
    ],
)
def test_model_state_memory_per_rank_follows_the_zero_paper(zero, precision, world, per_param):
    assert model_state_bytes(1_000_000, zero, precision, world) == pytest.approx(1_000_000 * per_param)


def test_model_state_memory_of_7_5b_parameters_on_64_ranks_matches_zero_figure_1():
    # ZeRO paper Fig. 1 (Psi = 7.5B, N_d = 64, K = 12): 120 GB, 31.4 GB, 16.6 GB, 1.9 GB
    got = [model_state_bytes(7.5e9, z, "bf16", 64) / 1e9 for z in range(4)]
    assert got == pytest.approx([120, 31.4, 16.6, 1.875], abs=0.06)


def test_trim_metrics_drops_what_a_resume_writes_again(tmp_path):
    recs = [
        {"event": "train", "step": 1}, {"event": "train", "step": 2}, {"event": "val", "step": 2},
        {"event": "growth", "step": 2, "stage": "deeper"}, {"event": "train", "step": 3},
        {"event": "stop", "step": 4, "stage": "wider"},
        {"event": "growth", "step": 4, "stage": "wider", "driver": True},
        {"event": "perplexity_before"},
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"event": "tra')
    assert trim_metrics(tmp_path, 2) == 5  # lines: 4 records and the half-written one
    kept = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert kept == [recs[0], recs[1], recs[2], recs[7]]  # the half-written last line is gone as well
    (tmp_path / "metrics.jsonl").write_text('{"event": "tra')  # only a fragment: removed, or the next record glues
    assert trim_metrics(tmp_path, 2) == 1 and (tmp_path / "metrics.jsonl").read_text() == ""
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    trim_metrics(tmp_path, 4, keep_driver_stage="wider", stop_stage="other")  # resuming the grown step-4 checkpoint
    assert [r["event"] for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())] == [
        "train", "train", "val", "growth", "train", "stop", "growth", "perplexity_before"
    ]  # fmt: skip


@pytest.mark.bad_input
def test_stop_before_stage_must_name_a_stage_still_ahead():
    from growlm.trainer.errors import UsageError
    from growlm.trainer.plan_checks import check_stop_stage

    p = plan(START, None, {"ranks_per_node": 2, "grad_accum": 1})
    assert check_stop_stage("wider", p, 1) == "wider" and check_stop_stage(None, None, 0) is None
    for name, done in (("deeper", 1), ("nope", 0)):
        with pytest.raises(UsageError, match=r"--stop_before_stage .*no such stage ahead"):
            check_stop_stage(name, p, done)
    with pytest.raises(UsageError, match="give --growth_plan"):
        check_stop_stage("wider", None, 0)


@pytest.mark.bad_input
def test_driver_refuses_flags_it_sets_itself(tmp_path, capsys):
    from growlm.trainer.driver.cli import main

    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text("start: {preset: tiny}\nstages: [{target: {n_layer: 3}, family: masked, when: {step: 2}}]\n")
    assert main([str(plan_file), "--", "--resume", "x", "--out_dir", str(tmp_path / "o")]) == 2
    assert "--resume after '--': growlm-run sets these itself" in capsys.readouterr().err
    assert main([str(plan_file), "--", "--max_steps", "4"]) == 2
    assert "give --out_dir" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
