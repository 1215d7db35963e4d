"""DeepSpeed configs checked for meaning, by DeepSpeed's own rules, before any rank starts
(runtime.ds_config.check_ds_config_meaning, through runtime.ds_config.check_ds_config): a top-level key DeepSpeed would
ignore, an optimizer DeepSpeed cannot build or a parameter its class does not take, numbers of the wrong kind or
range, offload at a ZeRO stage that has none. Each is one ``growlm-train: error:`` line, exit status 2, no
traceback, the config file and the run folder untouched; growlm-run's --dry_run refuses the same."""

from __future__ import annotations

import json
from pathlib import Path

import deepspeed
import pytest
from cli_utils import one_error_line

from growlm import train
from growlm.runtime import ds_config
from growlm.runtime.ds_config import DSConfigError, check_ds_config_meaning, deepspeed_config_keys
from growlm.trainer.driver import cli as run_cli

TINY = ["--preset", "tiny", "--seq_len", "32", "--no_final_eval", "--max_steps", "2"]
FP32 = json.loads(Path("ds_configs/zero2_fp32.json").read_text())
PLAN = """start: {preset: tiny, n_layer: 1}
stages:
  - {name: deeper, target: {n_layer: 2}, family: masked, when: {step: 2}}
"""


@pytest.fixture(autouse=True)
def one_rank(monkeypatch):
    """A plain ``python train.py`` environment: no launcher variables."""
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)


def edited(edit) -> dict:
    """zero2_fp32.json after ``edit(cfg)``."""
    cfg = json.loads(json.dumps(FP32))
    edit(cfg)
    return cfg


def refused(capsys, tmp_path: Path, cfg: dict) -> str:
    """train.main on ``cfg`` (written to tmp_path/ds.json): exit status 2, one error line, nothing written and the
    file unchanged; returns the line without ``growlm-train: error: --ds_config FILE: ``."""
    path = tmp_path / "ds.json"
    text = json.dumps(cfg, indent=2)
    path.write_text(text)
    out = tmp_path / "run"
    assert train.main([*TINY, "--ds_config", str(path), "--out_dir", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err, "growlm-train")
    assert path.read_text() == text and not out.exists()
    prefix = f"--ds_config {path}: "
    assert line.startswith(prefix), line
    return line.removeprefix(prefix)


def rename(cfg: dict, old: str, new: str) -> None:
    cfg[new] = cfg.pop(old)


def params(**changes):
    return lambda cfg: cfg["optimizer"]["params"].update(changes)


def zero(**changes):
    return lambda cfg: cfg["zero_optimization"].update(changes)


V = deepspeed.__version__
CASES = {
    "top-level typo": (
        lambda c: rename(c, "zero_optimization", "zero_optimizaton"),
        f"unknown top-level key 'zero_optimizaton': DeepSpeed {V} reads no such key and would train as if it were "
        "absent; did you mean 'zero_optimization'? rename it",
    ),
    "top-level key unlike any": (
        lambda c: c.update(my_notes="lr sweep 3"),
        f"unknown top-level key 'my_notes': DeepSpeed {V} reads no such key and would train as if it were absent; "
        "remove it",
    ),
    "optimizer type typo": (
        lambda c: c["optimizer"].update(type="AdamWW"),
        "optimizer.type 'AdamWW' is not an optimizer DeepSpeed can build; did you mean 'AdamW'?",
    ),
    "optimizer param typo": (
        lambda c: rename(c["optimizer"]["params"], "betas", "betaz"),
        "optimizer.params.betaz is not a parameter of torch.optim.AdamW (torch_adam: true); did you mean 'betas'?",
    ),
    "param of torch's AdamW given to FusedAdam": (
        lambda c: c["optimizer"]["params"].update(torch_adam=False, fused=True),
        "optimizer.params.fused is not a parameter of DeepSpeed's FusedAdam; its parameters are lr, "
        "bias_correction, betas, eps, adam_w_mode, weight_decay, amsgrad, set_grad_none, fp32_optimizer_states, "
        "torch_adam",
    ),
    "lr a string": (
        params(lr="1e-3"),
        'optimizer.params.lr "1e-3" must be a number >= 0, e.g. 0.001 (no quotes; 0 leaves the weights)',
    ),
    "lr negative": (
        params(lr=-0.001),
        "optimizer.params.lr -0.001 must be a number >= 0, e.g. 0.001 (no quotes; 0 leaves the weights)",
    ),
    "lr true": (
        params(lr=True),
        "optimizer.params.lr true must be a number >= 0, e.g. 0.001 (no quotes; 0 leaves the weights)",
    ),
    "beta of 1": (
        params(betas=[0.9, 1.0]),
        "optimizer.params.betas [0.9, 1.0] must be two numbers in [0, 1), e.g. [0.9, 0.95]",
    ),  # fmt: skip
    "eps 0": (params(eps=0), "optimizer.params.eps 0 must be a positive number, e.g. 1e-08"),
    "weight decay negative": (
        params(weight_decay=-0.1),
        "optimizer.params.weight_decay -0.1 must be a number >= 0, e.g. 0.1 (0: no decay)",
    ),
    "max_grad_norm": (
        params(max_grad_norm=1.0),
        "optimizer.params.max_grad_norm 1.0: DeepSpeed refuses it there; set the top-level gradient_clipping instead",
    ),
    "negative clipping": (
        lambda c: c.update(gradient_clipping=-1),
        "gradient_clipping -1 must be a number >= 0 (0: no clipping)",
    ),
    "optimizer offload at stage 0": (
        zero(stage=0, offload_optimizer={"device": "cpu"}),
        "zero_optimization.offload_optimizer.device 'cpu' at ZeRO stage 0: DeepSpeed offloads it from stage 1 on "
        "(stage 0 has no ZeRO optimizer to offload); set zero_optimization.stage to 1, 2 or 3, or remove "
        "offload_optimizer",
    ),
    "NVMe offload at stage 0": (
        zero(stage=0, offload_optimizer={"device": "nvme", "nvme_path": "/local_nvme"}),
        "zero_optimization.offload_optimizer.device 'nvme' at ZeRO stage 0: DeepSpeed offloads it from stage 3 on "
        "(NVMe offload is ZeRO-Infinity, stage 3); set zero_optimization.stage to 3, or remove offload_optimizer",
    ),
    "parameter offload at stage 2": (
        zero(offload_param={"device": "cpu"}),
        "zero_optimization.offload_param.device 'cpu' at ZeRO stage 2: DeepSpeed offloads it from stage 3 on "
        "(only stage 3 partitions the parameters it would offload); set zero_optimization.stage to 3, or remove "
        "offload_param",
    ),
    "ZeRO key typo": (
        lambda c: rename(c["zero_optimization"], "overlap_comm", "overlap_com"),
        "unknown key zero_optimization.overlap_com: DeepSpeed's DeepSpeedZeroConfig has no such field; did you mean "
        "'overlap_comm'? rename it",
    ),
    "ZeRO value of the wrong type": (
        zero(overlap_comm="maybe"),
        'zero_optimization.overlap_comm "maybe" is refused by DeepSpeed (Input should be a valid boolean, unable to '
        "interpret input); give a valid value",
    ),
    "scheduler total of the wrong kind": (
        lambda c: c["scheduler"]["params"].update(total_num_steps="Auto"),
        'scheduler.params.total_num_steps "Auto" must be an integer >= 0 (or "auto": --max_steps), as WarmupCosineLR '
        "takes it",
    ),
    "scheduler warm-up negative": (
        lambda c: c["scheduler"]["params"].update(warmup_num_steps=-20),
        'scheduler.params.warmup_num_steps -20 must be an integer >= 0 (or "auto": --max_steps), as WarmupCosineLR '
        "takes it",
    ),
    "fp16 key typo": (
        lambda c: c.update(fp16={"enabled": False, "loss_scale_windw": 100}),
        "unknown key fp16.loss_scale_windw: DeepSpeed's DeepSpeedFP16Config has no such field; did you mean "
        "'loss_scale_window'? rename it",
    ),
}


@pytest.mark.bad_input
@pytest.mark.parametrize("case", sorted(CASES))
def test_train_refuses_a_deepspeed_config_by_its_meaning(capsys, tmp_path, case):
    edit, message = CASES[case]
    assert refused(capsys, tmp_path, edited(edit)) == message


def test_every_shipped_config_passes_and_accepted_spellings_pass():
    for path in sorted(Path("ds_configs").glob("*.json")):
        cfg = json.loads(path.read_text())
        cfg["scheduler"]["params"]["total_num_steps"] = 100
        check_ds_config_meaning(cfg)
    check_ds_config_meaning(edited(lambda c: c["optimizer"].update(type="adamw")))  # DeepSpeed lower-cases its own
    check_ds_config_meaning(edited(lambda c: c["optimizer"].update(type="SGD", params={"lr": 0.1, "momentum": 0.9})))
    check_ds_config_meaning(edited(lambda c: c.update(gradient_clipping=0)))
    check_ds_config_meaning(edited(zero(stage=3, offload_param={"device": "cpu"})))
    with pytest.raises(DSConfigError, match=r"optimizer.params.momentum is not a parameter of torch.optim.AdamW"):
        check_ds_config_meaning(edited(params(momentum=0.9)))  # SGD's, not AdamW's: read from the class


def test_the_known_top_level_keys_are_the_ones_the_installed_deepspeed_reads(monkeypatch):
    """Not a hand list: the keys DeepSpeedConfig looks up while parsing, so a key a newer DeepSpeed reads is known."""
    from deepspeed.runtime import config as ds_config_module
    from deepspeed.runtime import constants

    keys = deepspeed_config_keys()
    for name in ("GRADIENT_CLIPPING", "TRAIN_MICRO_BATCH_SIZE_PER_GPU", "OPTIMIZER", "SCHEDULER", "STEPS_PER_PRINT"):
        assert getattr(constants, name) in keys
    assert "zero_optimization" in keys and "zero_optimizaton" not in keys
    original = ds_config_module.get_dump_state

    def reads_one_more(param_dict):
        param_dict.get("a_key_of_a_newer_deepspeed")
        return original(param_dict)

    monkeypatch.setattr(ds_config_module, "get_dump_state", reads_one_more)
    ds_config.deepspeed_config_keys.cache_clear()
    try:
        assert "a_key_of_a_newer_deepspeed" in deepspeed_config_keys()
        check_ds_config_meaning(edited(lambda c: c.update(a_key_of_a_newer_deepspeed=1)))
    finally:
        ds_config.deepspeed_config_keys.cache_clear()


@pytest.mark.bad_input
def test_growlm_run_dry_run_refuses_the_same_config(capsys, tmp_path):
    plan, cfg = tmp_path / "plan.yaml", tmp_path / "ds.json"
    plan.write_text(PLAN)
    cfg.write_text(json.dumps(edited(lambda c: rename(c, "zero_optimization", "zero_optimizaton"))))
    argv = [
        str(plan),
        "--dry_run",
        "--",
        "--ds_config",
        str(cfg),
        "--max_steps",
        "40",
        "--out_dir",
        str(tmp_path / "r"),
    ]
    assert run_cli.main(argv) == 2
    line = one_error_line(capsys.readouterr().err, "growlm-run")
    assert line == f"--ds_config {cfg}: {CASES['top-level typo'][1]}"
    assert not (tmp_path / "r").exists()
