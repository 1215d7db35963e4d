"""Bad input train.py used to accept, or refuse only with a traceback after the ranks joined: every case here exits
with status 2 and one ``growlm-train: error:`` line before any process group starts (``train.main`` in this
process), and leaves the user's files as they were. Also the run-folder lock (runtime.lock) and the metrics.jsonl
purge of a resumed run (runtime.metrics_file.purge_after), which need no run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from cli_utils import train_fails as fails

from growlm.runtime.dist import DistInfo
from growlm.runtime.ds_config import DSConfigError, check_batch
from growlm.runtime.lock import LockHeldError, hold_lock
from growlm.runtime.metrics_file import purge_after, read_records
from growlm.trainer.errors import UsageError
from growlm.trainer.logger import MetricsLogger

TINY = ["--preset", "tiny", "--seq_len", "32", "--no_final_eval", "--max_steps", "2"]
FP32 = json.loads(Path("ds_configs/zero2_fp32.json").read_text())


@pytest.fixture(autouse=True)
def one_rank(monkeypatch):
    """A plain ``python train.py`` environment: no launcher variables."""
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)


def ds_config(tmp_path: Path, **changes) -> str:
    """zero2_fp32.json with top-level keys replaced (None: removed), written to tmp_path; returns its path."""
    cfg = json.loads(json.dumps(FP32))
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def token_folder(path: Path, n_train: int, n_val: int = 64, *, train_bytes: int | None = None) -> Path:
    """A prepared token folder (growlm-tokens-v1) with n_train/n_val token ids; ``train_bytes`` truncates train.bin."""
    path.mkdir()
    splits = {}
    for split, n in (("train", n_train), ("val", n_val)):
        data = (np.arange(n) % 1000).astype(np.uint16).tobytes()
        if split == "train" and train_bytes is not None:
            data = data[:train_bytes]
        (path / f"{split}.bin").write_bytes(data)
        splits[split] = {"file": f"{split}.bin", "n_tokens": n, "n_documents": 1}
    meta = {"format": "growlm-tokens-v1", "dtype": "uint16", "tokenizer": "gpt2", "vocab_size": 50257,
            "eot_token_id": 50256, "splits": splits}  # fmt: skip
    (path / "meta.json").write_text(json.dumps(meta))
    return path


# ----- the DeepSpeed config -------------------------------------------------------------------------------------


@pytest.mark.bad_input
def test_train_batch_size_inconsistent_with_micro_batch_accumulation_and_ranks(capsys, tmp_path, monkeypatch):
    cfg = ds_config(tmp_path, train_batch_size=10)  # micro 8 x accumulation 1 x 1 rank = 8
    fails(capsys, [*TINY, "--ds_config", cfg, "--out_dir", str(tmp_path / "run")], "train_batch_size 10",
          "(8 x 1 x 1 = 8)", "drop train_batch_size")  # fmt: skip
    monkeypatch.setenv("WORLD_SIZE", "2")  # right for one rank, wrong for the two launched
    cfg = ds_config(tmp_path, train_batch_size=8)
    fails(capsys, [*TINY, "--ds_config", cfg, "--out_dir", str(tmp_path / "run")], "(8 x 1 x 2 = 16)")
    assert not (tmp_path / "run").exists()


def test_batch_rule_follows_deepspeed_derivations():
    """DeepSpeed derives the missing values with integer division; consistent settings pass, like DeepSpeed's."""
    check_batch({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, "c", 2)  # accumulation 4
    check_batch({"train_batch_size": 32, "gradient_accumulation_steps": 2}, "c", 4)  # micro 4
    check_batch({"train_micro_batch_size_per_gpu": 3}, "c", 5)  # train 15
    with pytest.raises(DSConfigError, match=r"\(3 x 1 x 4 = 12\)"):
        check_batch({"train_batch_size": 14, "train_micro_batch_size_per_gpu": 3}, "c", 4)
    with pytest.raises(DSConfigError, match="gradient_accumulation_steps 0 must be a positive integer"):
        check_batch({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 0}, "c", 1)
    with pytest.raises(DSConfigError, match="sets neither train_batch_size nor train_micro_batch_size_per_gpu"):
        check_batch({"gradient_accumulation_steps": 2}, "c", 1)


@pytest.mark.bad_input
@pytest.mark.parametrize("stage", [5, -1, "2", None])
def test_zero_stage_outside_0_to_3(capsys, tmp_path, stage):
    cfg = ds_config(tmp_path, zero_optimization={"stage": stage})
    fails(capsys, [*TINY, "--ds_config", cfg], f"--ds_config {cfg}: zero_optimization.stage {stage!r} is not a ZeRO "
          "stage; use 0, 1, 2 or 3")  # fmt: skip


@pytest.mark.bad_input
def test_unknown_scheduler_key_or_type(capsys, tmp_path):
    sched = {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto", "warmup_max_lr": 0.001}}
    line = fails(capsys, [*TINY, "--ds_config", ds_config(tmp_path, scheduler=sched)],
                 "scheduler WarmupCosineLR takes no warmup_max_lr")  # fmt: skip
    for accepted in ("total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type"):
        assert accepted in line  # read from DeepSpeed's own signature
    assert "optimizer" not in line.split("its params are")[1]
    # the same key is one of WarmupDecayLR's: accepted there
    ok = {"type": "WarmupDecayLR", "params": {"total_num_steps": 4, "warmup_max_lr": 0.001, "warmup_num_steps": 1}}
    bad_elsewhere = ["--ds_config", ds_config(tmp_path, scheduler=ok), "--seq_len", "0"]
    fails(capsys, [*TINY, *bad_elsewhere], "--seq_len 0")  # got past the scheduler check
    fails(capsys, [*TINY, "--ds_config", ds_config(tmp_path, scheduler={"type": "Cosine", "params": {}})],
          "scheduler 'Cosine' is not a scheduler DeepSpeed knows", "WarmupCosineLR")  # fmt: skip


@pytest.mark.bad_input
def test_a_folder_given_as_ds_config(capsys, tmp_path):
    fails(capsys, [*TINY, "--ds_config", str(tmp_path)], f"--ds_config {tmp_path} is a folder", "zero2_bf16.json")


# ----- the run folder and the data -------------------------------------------------------------------------------


@pytest.mark.bad_input
def test_out_dir_that_is_a_file_is_refused_up_front(capsys, tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    fails(capsys, [*TINY, "--out_dir", str(f)], f"--out_dir {f}: {f} is a file, not a folder")
    fails(capsys, [*TINY, "--out_dir", str(f / "run")], f"{f} is a file, not a folder")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoints").write_text("also mine")
    fails(capsys, [*TINY, "--out_dir", str(tmp_path / "run")], f"{tmp_path / 'run' / 'checkpoints'} is a file")
    assert f.read_text() == "mine" and (tmp_path / "run" / "checkpoints").read_text() == "also mine"


@pytest.mark.bad_input
def test_data_with_fewer_tokens_than_one_sample(capsys, tmp_path):
    data = token_folder(tmp_path / "tok", n_train=20)
    fails(capsys, [*TINY, "--data", str(data), "--out_dir", str(tmp_path / "run")],
          "the train split holds 20 tokens, fewer than one sample of seq_len + 1 = 33", "--seq_len")  # fmt: skip
    assert not (tmp_path / "run").exists()


@pytest.mark.bad_input
def test_truncated_train_bin(capsys, tmp_path):
    data = token_folder(tmp_path / "tok", n_train=1000, train_bytes=1200)
    fails(capsys, [*TINY, "--data", str(data), "--out_dir", str(tmp_path / "run")],
          "train.bin is 1200 bytes, meta.json says 1000 tokens = 2000 bytes", "growlm-prepare")  # fmt: skip
    assert not (tmp_path / "run").exists()


# ----- numeric flags ----------------------------------------------------------------------------------------------


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--log_interval", "0", "--log_interval 0 must be >= 1"),
        ("--seq_len", "0", "--seq_len 0 must be >= 1"),
        ("--seq_len", "-4", "--seq_len -4 must be >= 1"),
        ("--save_interval", "-1", "--save_interval -1 must be >= 0 (steps between saves; 0: only at the end)"),
        ("--eval_interval", "-5", "--eval_interval -5 must be >= 0 (steps between validations; 0: only before/after)"),
        ("--max_steps", "0", "--max_steps 0 must be >= 1"),
        ("--seed", "-1", "--seed -1 must be in [0, 4294967295]"),
        ("--seed", "4294967296", "--seed 4294967296 must be in [0, 4294967295]"),
        ("--eval_tokens", "1", "--eval_tokens 1 must be >= 2"),
        ("--final_eval_tokens", "-3", "--final_eval_tokens -3 must be 0 (the whole validation split) or >= 2"),
        ("--eval_stride", "0", "--eval_stride 0 must be >= 1"),
        ("--eval_stride", "33", "--eval_stride 33 must be at most seq_len 32"),
        ("--eval_batch_size", "0", "--eval_batch_size 0 must be >= 1"),
        ("--dist_timeout_s", "0", "--dist_timeout_s 0.0 must be a positive number of seconds"),
        ("--dist_timeout_s", "nan", "--dist_timeout_s nan must be a positive number of seconds"),
        ("--dropout", "1.0", "--dropout 1.0 must be in [0, 1)"),
        ("--dropout", "-0.1", "--dropout -0.1 must be in [0, 1)"),
        ("--n_layer", "0", "--n_layer 0 must be >= 1"),
        ("--n_embd", "-8", "--n_embd -8 must be >= 1"),
        ("--n_head", "0", "--n_head 0 must be >= 1"),
        ("--n_inner", "0", "--n_inner 0 must be >= 1"),
        ("--n_positions", "0", "--n_positions 0 must be >= 1"),
        ("--vocab_size", "0", "--vocab_size 0 must be >= 1"),
    ],
)
def test_numeric_flag_out_of_range(capsys, tmp_path, flag, value, message):
    out = tmp_path / "run"
    fails(capsys, [*TINY, flag, value, "--out_dir", str(out)], message)
    assert not out.exists()  # refused before anything was written


def test_zero_keeps_its_documented_meaning(capsys):
    """0 is valid where the help gives it a meaning: --save_interval 0 (only at the end), --eval_interval 0 (only
    before/after), --final_eval_tokens 0 (the whole split)."""
    from growlm import train
    from growlm.trainer.config import check_flag_ranges

    check_flag_ranges(train.parse_args(["--save_interval", "0", "--eval_interval", "0", "--final_eval_tokens", "0"]))
    with pytest.raises(SystemExit):
        train.parse_args(["--help"])
    helps = " ".join(capsys.readouterr().out.split())
    assert "--save_interval SAVE_INTERVAL also save every N steps (0: only at the end)" in helps
    assert "--eval_interval EVAL_INTERVAL validate every N steps (0: only before/after)" in helps
    assert "(0: the whole validation split)" in helps


# ----- one run per folder ------------------------------------------------------------------------------------------


def test_lock_names_its_holder_and_is_released_when_closed(tmp_path):
    held = hold_lock(tmp_path / "train.lock")
    with pytest.raises(LockHeldError) as e:
        hold_lock(tmp_path / "train.lock")  # another open file of the same lock: refused like another process
    assert e.value.path == tmp_path / "train.lock"
    assert e.value.holder.startswith(f"pid {os.getpid()} on host ")
    held.close()
    hold_lock(tmp_path / "train.lock").close()  # free again


@pytest.mark.bad_input
def test_a_second_run_on_a_locked_out_dir_is_refused(tmp_path):
    """trainer.run.claim_out_dir (one rank: no collective): refused with the folder and the holder named; the
    folder's files are not touched."""
    from types import SimpleNamespace

    import torch

    from growlm.trainer.run import RUN_LOCK, claim_out_dir

    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"event": "train", "step": 1}\n')
    run = SimpleNamespace(out_dir=out)
    info = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    first = claim_out_dir(run, info)
    with pytest.raises(UsageError) as e:
        claim_out_dir(run, info)
    msg = str(e.value)
    assert msg.startswith(f"--out_dir {out} is in use by another growlm-train (pid {os.getpid()} on host ")
    assert f"lock {out / RUN_LOCK}" in msg and "\n" not in msg
    assert (out / "metrics.jsonl").read_text() == '{"event": "train", "step": 1}\n'
    first.close()
    claim_out_dir(run, info).close()  # the first run ended: the folder is free
    assert RUN_LOCK != "driver/lock"  # growlm-run's own lock is <out_dir>/driver/lock: its jobs can take this one


# ----- metrics.jsonl after a resume --------------------------------------------------------------------------------


def test_resume_purges_the_records_an_interrupted_job_wrote_after_its_checkpoint(tmp_path):
    """Killed at step 72 with saves every 50: the resumed job (purge_step 51) rewrites steps 51-72, so the file must
    hold each step once. Records up to the checkpoint stay byte for byte."""
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"event": "train", "step": s, "loss": 10.0 - s / 100}) for s in range(1, 73)]
    lines.insert(50, json.dumps({"event": "val", "step": 50, "val_loss": 4.0, "flops": 1}))
    lines.insert(51, json.dumps({"event": "growth", "step": 50, "stage": "wide"}))  # live growth after the save
    lines.insert(52, json.dumps({"event": "growth", "step": 50, "stage": "deep", "driver": True}))  # made the ckpt
    lines.append(json.dumps({"event": "val", "step": 70, "val_loss": 3.9, "flops": 2}))
    text = "\n".join(lines) + '\n{"event": "train", "st'  # the killed writer's half line
    path.write_text(text)
    log = MetricsLogger(tmp_path, enabled=True, log_interval=10, max_steps=100, purge_step=51)
    for s in range(51, 101):
        log.log({"event": "train", "step": s, "loss": 1.0})
    log.close()
    records = read_records(path)
    steps = [r["step"] for r in records if r["event"] == "train"]
    assert steps == list(range(1, 101))
    assert [r["loss"] for r in records if r["event"] == "train"][:50] == [10.0 - s / 100 for s in range(1, 51)]
    assert [(r["event"], r["step"]) for r in records if r["event"] != "train"] == [("val", 50), ("growth", 50)]
    assert path.read_text().startswith("\n".join(lines[:50]) + "\n")


def test_a_fresh_run_moves_an_earlier_runs_records_aside_and_keeps_them(tmp_path, capsys):
    """A run started again into its --out_dir without --resume (a lost rank before the first checkpoint: "run it
    again"): the dead run's step-1 record and TensorBoard files are moved aside, not appended to nor deleted, and
    one line says where; an empty metrics.jsonl (killed before its first record) is simply reused."""
    dead = '{"event": "train", "step": 1, "loss": 10.9}\n{"event": "train", "st'
    (tmp_path / "metrics.jsonl").write_text(dead)
    os.utime(tmp_path / "metrics.jsonl", (0, 86400 * 365))  # the dead run's last write: 1971-01-01 00:00:00 UTC
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "events.out.tfevents.1").write_bytes(b"dead run")
    log = MetricsLogger(tmp_path, enabled=True, log_interval=1, max_steps=1)
    log.log({"event": "train", "step": 1, "loss": 10.8})
    log.close()
    assert [r["loss"] for r in read_records(tmp_path)] == [10.8]  # step 1 once: this run's
    assert (tmp_path / "metrics.earlier-19710101T000000Z.jsonl").read_text() == dead
    assert (tmp_path / "tb.earlier-19710101T000000Z" / "events.out.tfevents.1").read_bytes() == b"dead run"
    assert capsys.readouterr().out.splitlines()[0] == (
        f"growlm: --out_dir {tmp_path} holds an earlier run's records and this run starts afresh (no --resume): moved "
        "metrics.jsonl (2 line(s)) to metrics.earlier-19710101T000000Z.jsonl and tb/ to tb.earlier-19710101T000000Z/, "
        "so its steps do not mix with this run's"
    )
    (tmp_path / "metrics.jsonl").write_text("")
    MetricsLogger(tmp_path, enabled=True, log_interval=1, max_steps=1).close()
    assert capsys.readouterr().out == "" and len(list(tmp_path.glob("metrics.earlier-*"))) == 1
    (tmp_path / "metrics.jsonl").write_text('{"event": "train", "step": 1, "loss": 10.8}\n')
    MetricsLogger(tmp_path, enabled=True, log_interval=1, max_steps=2, purge_step=2).close()  # a resume keeps it
    assert [r["step"] for r in read_records(tmp_path)] == [1] and len(list(tmp_path.glob("metrics.earlier-*"))) == 1


def test_purge_leaves_a_file_without_later_records_untouched(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"event": "train", "step": 1}\n{"event": "stop", "step": 2, "stage": "a"}\n')
    before = path.stat().st_mtime_ns, path.stat().st_ino
    assert purge_after(path, 2, stop_stage="b") == 0
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == before  # not rewritten
    assert purge_after(path, 2, stop_stage="a") == 1  # the resumed job stops at stage a again
    assert read_records(path) == [{"event": "train", "step": 1}]
    assert purge_after(tmp_path / "none.jsonl", 5) == 0
