"""train.py's Llama shape flags (--n_kv_head, --head_dim, --rope_theta, --rms_norm_eps, --tie_word_embeddings,
--untie_word_embeddings): --preset chooses the family, the flags override a Llama preset's fields, and a GPT-2
model (a GPT-2 preset, the default one, or a GPT-2 checkpoint) refuses them in one line with exit status 2."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from cli_utils import train_fails as fails

from growlm import train
from growlm.eval.bench import baseline
from growlm.eval.bench import throughput as bench
from growlm.growth.errors import GrowthError
from growlm.growth.offline import cli as grow_cli
from growlm.growth.stages.plan import load_stages
from growlm.model.config import PRESETS, GPTConfig, LlamaConfig, flops_per_token
from growlm.runtime.run_state import RunState
from growlm.trainer.config import model_config_from_args, resolve
from growlm.trainer.errors import UsageError

REPO = Path(__file__).resolve().parents[2]


def _model(argv: list[str]):
    return resolve(train.parse_args([*argv, "--no_final_eval"])).model


def test_a_llama_preset_with_overrides_builds_a_llama_config():
    cfg = _model(["--preset", "llama-tiny"])
    assert isinstance(cfg, LlamaConfig) and cfg.arch == "llama"
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.n_inner) == (2, 64, 4, 2, 16, 128)
    cfg = _model(
        ["--preset", "llama-tiny", "--n_kv_head", "1", "--head_dim", "32", "--rope_theta", "500000",
         "--rms_norm_eps", "1e-6", "--tie_word_embeddings", "--n_layer", "3", "--vocab_size", "300"]
    )  # fmt: skip
    assert (cfg.n_kv_head, cfg.head_dim, cfg.rope_theta, cfg.rms_norm_eps) == (1, 32, 500000.0, 1e-6)
    assert cfg.tie_word_embeddings and (cfg.n_layer, cfg.vocab_size) == (3, 300)
    # a wider n_embd re-derives head_dim (d // H) and n_inner (8 d / 3 rounded up to 64) unless they are given
    cfg = _model(["--preset", "llama-tiny", "--n_embd", "128"])
    assert (cfg.head_dim, cfg.n_inner) == (32, 384)
    # --untie_word_embeddings on a tied preset; both flags at once are refused (test_tie_and_untie_together_...)
    assert _model(["--preset", "smollm-135m", "--seq_len", "64"]).tie_word_embeddings
    assert not _model(["--preset", "smollm-135m", "--seq_len", "64", "--untie_word_embeddings"]).tie_word_embeddings
    # no flag: GPT-2's default preset
    assert isinstance(_model([]), GPTConfig)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "argv, needles",
    [
        (
            ["--preset", "tiny", "--n_kv_head", "2"],
            ["--n_kv_head: flag(s) of Llama-shaped models only (Llama, Qwen 2)", "preset 'tiny' is a GPT-2 model"],
        ),
        (["--head_dim", "16"], ["--head_dim: flag(s) of Llama-shaped", "preset 'cpu-small'", "llama-tiny"]),
        (["--preset", "gpt2", "--rope_theta", "1e4", "--rms_norm_eps", "1e-6"], ["--rope_theta, --rms_norm_eps"]),
        (["--preset", "tiny", "--tie_word_embeddings"], ["--tie_word_embeddings: flag(s) of Llama-shaped"]),
        (["--preset", "tiny", "--untie_word_embeddings"], ["--untie_word_embeddings: flag(s) of Llama-shaped"]),
    ],
)
def test_llama_flags_are_refused_for_a_gpt2_model(capsys, argv, needles):
    fails(capsys, argv, *needles)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "argv, dropped",
    [
        (["--n_kv_head", "2"], "--n_kv_head"),  # no preset named: the default (GPT-2) preset is not blamed
        (["--preset", "tiny", "--rope_theta", "5e5"], "--preset, --rope_theta"),
        (["--preset", "llama-tiny", "--n_kv_head", "3"], "--preset, --n_kv_head"),  # not "n_head=4 ... n_kv_head=3"
        (["--untie_word_embeddings"], "--untie_word_embeddings"),  # the flag given, not --tie_word_embeddings
    ],
)
def test_a_growth_plan_refuses_shape_flags_before_the_family_check(capsys, argv, dropped):
    line = fails(capsys, ["--growth_plan", str(REPO / "growth/plans/llama_cpu_small.yaml"), *argv])
    assert line.endswith(f"--growth_plan sets the starting shape (its 'start'); drop {dropped}"), line
    assert "Llama-shaped" not in line and "GPT-2" not in line


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--n_kv_head", "3"], "n_head=4 is not a multiple of n_kv_head=3"),
        (["--n_kv_head", "0"], "--n_kv_head 0 must be >= 1"),
        (["--head_dim", "15"], "head_dim=15 must be even"),
        (["--head_dim", "0"], "--head_dim 0 must be >= 2"),
        (["--rope_theta", "0"], "--rope_theta 0.0 must be a positive number"),
        (["--rms_norm_eps", "nan"], "--rms_norm_eps nan must be a positive number"),
    ],
)
def test_bad_llama_shapes_are_refused(capsys, argv, needle):
    fails(capsys, ["--preset", "llama-tiny", *argv], needle)


@pytest.mark.bad_input
def test_llama_flags_are_refused_on_a_gpt2_checkpoint_and_kept_on_a_llama_one():
    def state(cfg):
        return RunState(model_config=cfg, global_step=4, consumed_samples=32, seq_len=16, world_size=2,
                        zero_stage=1, seed=1234)  # fmt: skip

    args = train.parse_args(["--n_kv_head", "2"])
    with pytest.raises(
        UsageError,
        match="--n_kv_head: flag\\(s\\) of Llama-shaped models only \\(Llama, Qwen 2\\), but the checkpoint.s model is "
        "a GPT-2",
    ):
        model_config_from_args(args, state(GPTConfig(n_layer=2, n_embd=64, n_head=4)))
    llama = LlamaConfig(n_layer=2, n_embd=64, n_head=4, n_kv_head=2, n_inner=128, n_positions=32, vocab_size=99)
    assert model_config_from_args(args, state(llama)) == llama  # equal values: the checkpoint's shape
    assert model_config_from_args(train.parse_args([]), state(llama)) == llama


@pytest.mark.bad_input
def test_growlm_grow_takes_n_kv_head_for_a_llama_checkpoint_only():
    llama = LlamaConfig(n_layer=2, n_embd=64, n_head=4, n_kv_head=2, n_inner=128, n_positions=32, vocab_size=99)
    argv = ["ck", "out", "--family", "masked", "--n_head", "8", "--n_kv_head", "4"]
    stage = grow_cli.stage_from_flags(grow_cli.parse_args(argv), llama, step=3)
    assert (stage.target.n_head, stage.target.n_kv_head, stage.target.head_dim) == (8, 4, 16)
    gpt = GPTConfig(n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=99)
    with pytest.raises(
        GrowthError,
        match="^--n_kv_head sets a Llama-shaped model's key/value heads, and the checkpoint's model is a GPT-2",
    ):
        grow_cli.stage_from_flags(grow_cli.parse_args(argv), gpt, step=3)


def test_the_llama_main_job_plan_loads_and_fits_the_demo_run():
    """make demo ARCH=llama: growth/plans/llama_cpu_small.yaml starts at llama-cpu-small on the built-in corpus's
    vocabulary and grows it once; train.py accepts it with the demo's flags (validation only, nothing launched)."""
    plan = load_stages(REPO / "growth" / "plans" / "llama_cpu_small.yaml")
    assert plan.start == replace(PRESETS["llama-cpu-small"], vocab_size=50257)
    (stage,) = plan.stages
    assert stage.target == replace(plan.start, n_layer=6) and stage.family == "masked"
    argv = ["--growth_plan", str(REPO / "growth" / "plans" / "llama_cpu_small.yaml"), "--seq_len", "128"]
    argv += ["--max_steps", "80", "--ds_config", str(REPO / "ds_configs" / "zero2_fp32.json"), "--no_final_eval"]
    run = resolve(train.parse_args(argv))
    assert run.model == plan.start and run.growth.stages[0].when.value == 40


def test_growlm_bench_measures_a_llama_and_its_baseline_trains_one(monkeypatch, tmp_path):
    monkeypatch.setattr(bench, "available_precisions", lambda: ("cpu", ["fp32"]))
    args = bench.parse_args(
        ["--preset", "llama-tiny", "--vocab_size", "320", "--n_kv_head", "1", "--precision", "fp32"]
    )
    _, _, _, cfg, fpt = bench._resolve(args)
    assert isinstance(cfg, LlamaConfig) and (cfg.vocab_size, cfg.n_kv_head) == (320, 1)
    assert fpt == flops_per_token(cfg, 128)
    seen = {}
    monkeypatch.setattr(bench, "_launch", lambda cmd, *a, **kw: seen.setdefault("cmd", cmd) and [0])
    monkeypatch.setattr(bench, "read_records", lambda run_dir: [])
    summary = {"model_flops_per_s_per_rank": 1.0, "cuda_max_allocated_bytes_rank0": None}
    monkeypatch.setattr(bench, "summarize_train", lambda *a, **kw: summary)
    peak = type("Peak", (), {"flops_per_s": 2.0, "source": "test", "mfu": lambda self, x: x / 2.0})()
    base = {"device_type": "cpu", "peaks": {("fp32", 1): peak}, "common": {}}
    args.world_size, args.threads_per_rank, args.train_extra = 2, 1, []
    bench.bench_deepspeed(args, 2, "fp32", tmp_path, base)
    assert ["--preset", "llama-tiny"] == seen["cmd"][2:4] and {"--vocab_size=320", "--n_kv_head=1"} <= set(seen["cmd"])
    # the PyTorch baseline builds the same family from the record's config (one process, 2 steps)
    out = baseline.step_times(cfg, batch=2, seq_len=16, precision="fp32", steps=2)
    assert len(out["step_times_s"]) == 2 and all(0 < loss < 10 for loss in out["losses"])


@pytest.mark.bad_input
@pytest.mark.parametrize("order", [("--tie_word_embeddings", "--untie_word_embeddings"),
                                   ("--untie_word_embeddings", "--tie_word_embeddings")])  # fmt: skip
def test_tie_and_untie_together_are_refused(capsys, order):
    """Both head flags at once: argparse's usage error (exit status 2) naming the two, never the last one winning."""
    with pytest.raises(SystemExit) as e:
        train.parse_args(["--preset", "llama-tiny", *order])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.strip().splitlines()[-1] == (
        f"growlm-train: error: argument {order[1]}: not allowed with argument {order[0]}"
    )
