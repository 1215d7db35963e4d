"""One writer per output, and the files a user hands over: a second writer of growlm-prepare's, growlm-experiment's
or growlm-bench's output is refused at once (exit status 2, one line naming the holder) and touches nothing; a
truncated or damaged model.safetensors (growlm-eval of a transformers folder, train.py --init_from) and a damaged
curve JSON (growlm-experiment --report_only) are named in one line, exit status 2, nothing written."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import socket
import time
from pathlib import Path

import numpy as np
import pytest
from cli_utils import one_error_line, train_fails
from init_from_helpers import make_hf_folder

from growlm.data import prepare
from growlm.data.small_vocab import ensure_small_vocab
from growlm.data.tokens import TokenFolderWriter, open_tokens
from growlm.eval.bench import throughput as bench
from growlm.eval.experiments import cli as experiment
from growlm.eval.experiments import protocol, runner
from growlm.eval.experiments.protocol import RunSpec
from growlm.eval.metrics import cli as eval_cli
from growlm.model.weight_files import safetensors_problem
from growlm.runtime.lock import LockHeldError, output_lock, output_lock_path, queue_lock

HOLDER = rf"pid {os.getpid()} on host {re.escape(socket.gethostname())} since \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d \(\S+\)"


def held(what: str, out: Path) -> re.Pattern:
    """The one line of a writer refused because this process holds ``out``'s writer lock."""
    return re.compile(
        rf"{re.escape(what)} {re.escape(str(out))} is being written by another process \({HOLDER}; lock "
        rf"{re.escape(str(output_lock_path(out)))}\); nothing was changed: wait for it to end, or choose another output"
    )


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------------------------
# the writer lock


def test_output_lock_refuses_a_second_holder_and_leaves_no_file(tmp_path):
    out = tmp_path / "sub" / "out"
    with output_lock(out) as lock:
        assert lock == tmp_path / "sub" / ".out.lock" and lock.is_file()
        assert re.fullmatch(HOLDER, lock.read_text().strip())
        with pytest.raises(LockHeldError) as e, output_lock(out):
            pass
        assert e.value.path == lock and re.fullmatch(HOLDER, e.value.holder)
        assert lock.is_file()  # the refused one removed nothing
    assert not lock.exists()  # released and removed
    lock.write_text("pid 1 on host gone since 2020-01-01 00:00:00 (killed)\n")  # what a SIGKILLed holder leaves
    with output_lock(out):
        assert re.fullmatch(HOLDER, lock.read_text().strip())  # taken over
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == []


def test_output_lock_is_released_when_the_block_fails(tmp_path):
    with pytest.raises(RuntimeError), output_lock(tmp_path / "out"):
        raise RuntimeError("the write failed")
    with output_lock(tmp_path / "out"):
        pass
    assert list(tmp_path.iterdir()) == []


def _ensure_tiny_folder(out: Path, log: Path) -> None:
    """What every ``ensure_*`` preparer does: wait its turn on out's queue lock, build out only if it is missing
    (taking the writer lock, as any writer), and log each build."""
    with queue_lock(out):
        if (out / "meta.json").is_file():
            return
        with TokenFolderWriter(out) as w:
            time.sleep(0.5)  # the other process queues meanwhile
            splits = {}
            for split in ("train", "val"):
                sw = w.split(split)
                sw.write(np.arange(10))
                splits[split] = sw.record(1, [])
            w.finish(tokenizer="test", vocab_size=10, eot_token_id=9, splits=splits)
        with open(log, "a") as f:
            f.write(f"built by {os.getpid()}\n")


def test_queued_preparers_build_an_output_once_and_the_writer_lock_never_refuses_them(tmp_path):
    """Two processes that want one output (pytest workers wanting the small-vocabulary corpus, ranks wanting the
    built-in corpus) queue on its queue lock: one builds it under its writer lock, the other then finds it built;
    neither is refused by the writer lock (the two locks are different files)."""
    out, log = tmp_path / "cache" / "tokens", tmp_path / "log"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_ensure_tiny_folder, args=(out, log)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert len(log.read_text().splitlines()) == 1  # built once
    assert open_tokens(out, "train").tolist() == list(range(10))
    assert sorted(p.name for p in out.parent.iterdir()) == [".tokens.queue.lock", "tokens"]  # no writer lock left


@pytest.mark.bad_input
def test_ensure_small_vocab_never_replaces_another_vocabulary(small_vocab_data):
    """A cached small-vocabulary folder of another size is named and left alone, not reused or rebuilt."""
    from dist_utils import SMALL_VOCAB

    mtime = (small_vocab_data / "meta.json").stat().st_mtime_ns
    other = (
        rf"holds another small-vocabulary corpus \({SMALL_VOCAB} tokens, extra sources \[\]; wanted 4096 tokens, "
        r"extra sources \[\]\); remove it or choose another folder"
    )
    with pytest.raises(ValueError, match=other):
        ensure_small_vocab(small_vocab_data, 4096)
    assert ensure_small_vocab(small_vocab_data, SMALL_VOCAB) == small_vocab_data
    assert (small_vocab_data / "meta.json").stat().st_mtime_ns == mtime


# ---------------------------------------------------------------------------------------------------------------
# a second writer of the same output


@pytest.mark.bad_input
def test_growlm_prepare_into_a_folder_being_written_is_refused(tmp_path, capsys):
    src = tmp_path / "a.txt"
    src.write_text("some text to tokenize\n")
    out = (tmp_path / "tok").resolve()
    argv = ["--train", str(src), "--val", str(src), "--out", str(out)]
    assert prepare.main(argv) == 0
    before = snapshot(out)
    capsys.readouterr()
    with output_lock(out):
        assert prepare.main([*argv, "--overwrite"]) == 2
        assert held("--out", out).fullmatch(one_error_line(capsys.readouterr().err, "growlm-prepare"))
        assert snapshot(out) == before  # the other writer's folder, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "tok"]  # no staging folder, no lock file
    assert prepare.main([*argv, "--overwrite"]) == 0  # free again: replaced


@pytest.mark.bad_input
@pytest.mark.parametrize("report_only", [True, False])
def test_growlm_experiment_into_a_folder_being_written_is_refused(tmp_path, capsys, report_only):
    out = tmp_path / "res"
    argv = ["--quick", "--out", str(out), *(["--report_only"] if report_only else ["--data", str(tmp_path / "no")])]
    with output_lock(out):
        assert experiment.main(argv) == 2
        assert held("--out", out).fullmatch(one_error_line(capsys.readouterr().err, "growlm-experiment"))
    assert not out.exists()


@pytest.mark.bad_input
def test_growlm_bench_into_a_folder_being_written_is_refused(tmp_path, capsys):
    out = tmp_path / "bench"
    with output_lock(out):
        assert bench.main(["--preset", "tiny", "--out", str(out)]) == 2
        assert held("--out", out).fullmatch(one_error_line(capsys.readouterr().err, "growlm-bench"))
    assert not out.exists()  # nothing run, nothing written


# ---------------------------------------------------------------------------------------------------------------
# truncated or damaged model.safetensors


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    return make_hf_folder(tmp_path_factory.mktemp("hf") / "tiny")


def damaged(hf_dir: Path, dst: Path, cut: int | None = None, data: bytes | None = None) -> tuple[Path, int, int]:
    """A copy of ``hf_dir`` whose model.safetensors is cut to ``cut`` bytes (or replaced by ``data``); returns the
    folder, the whole file's size and the damaged one's."""
    shutil.copytree(hf_dir, dst)
    f = dst / "model.safetensors"
    whole = f.read_bytes()
    f.write_bytes(whole[:cut] if data is None else data)
    return dst, len(whole), f.stat().st_size


LFS = b"version https://git-lfs.github.com/spec/v1\n"  # a Git LFS pointer where the weights should be
FIX_INIT = "export the model again or copy the whole file again"  # growlm-eval's too: one check (read_folder)


@pytest.mark.bad_input
def test_growlm_eval_of_a_truncated_safetensors_names_it(tmp_path, capsys, hf_dir):
    d, whole, size = damaged(hf_dir, tmp_path / "cut", cut=-1000)
    before = snapshot(d)
    assert eval_cli.main([str(d)]) == 2
    assert one_error_line(capsys.readouterr().err, "growlm-eval") == (
        f"{d}: model.safetensors is truncated: {size:,} bytes, its header describes {whole:,}; {FIX_INIT}"
    )
    assert snapshot(d) == before


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "kind, data, problem",
    [
        ("empty", b"", "is 0 bytes, too short for a safetensors file (empty or truncated)"),
        ("header", (16).to_bytes(8, "little") + b"{not json here!}",
         "has a damaged header (not the JSON table of a safetensors file)"),
        ("text", LFS, f"is {len(LFS)} bytes, shorter than its own {int.from_bytes(LFS[:8], 'little'):,}-byte header "
         "says (truncated, or not a safetensors file)"),
    ],
)  # fmt: skip
def test_growlm_eval_and_init_from_name_a_damaged_safetensors(tmp_path, capsys, hf_dir, kind, data, problem):
    d, _, _ = damaged(hf_dir, tmp_path / kind, data=data)
    assert safetensors_problem(d / "model.safetensors") == problem
    assert eval_cli.main([str(d)]) == 2
    assert one_error_line(capsys.readouterr().err, "growlm-eval") == f"{d}: model.safetensors {problem}; {FIX_INIT}"
    line = train_fails(capsys, ["--init_from", str(d), "--seq_len", "32", "--max_steps", "1"])
    assert line == f"growlm-train: error: --init_from {d}: model.safetensors {problem}; {FIX_INIT}"


@pytest.mark.bad_input
def test_init_from_a_truncated_safetensors_names_it(tmp_path, capsys, hf_dir):
    d, whole, size = damaged(hf_dir, tmp_path / "cut", cut=-8)
    line = train_fails(capsys, ["--init_from", str(d), "--seq_len", "32", "--max_steps", "1"])
    assert line == (
        f"growlm-train: error: --init_from {d}: model.safetensors is truncated: {size:,} bytes, its header "
        f"describes {whole:,}; {FIX_INIT}"
    )
    assert safetensors_problem(hf_dir / "model.safetensors") is None  # the whole file passes


# ---------------------------------------------------------------------------------------------------------------
# a damaged curve JSON under growlm-experiment's --out

FIX_CURVE = "delete it (a rerun of growlm-experiment trains that run again) or restore it from where it came"


def curve_folder(out: Path) -> tuple[Path, Path]:
    """--out with two curves of the quick profile: a whole one and one cut short. Returns both paths."""
    s = protocol.quick(protocol.PROFILES["cpu"])
    settings = {**s.as_dict(), "data": {"vocab_size": s.vocab_size}}
    files = []
    for seed in (0, 1):
        sp = RunSpec("main", "scratch", seed, 1.0, 2e-3, size="L1")
        path = runner.curve_path(out, sp)
        path.parent.mkdir(parents=True, exist_ok=True)
        curve = {"points": [], "final": {"val_loss": 3.0, "val_se": 0.01}, "wall_s": 1.0}
        path.write_text(json.dumps({"settings": settings, "spec": sp.as_dict(), "curve": curve}))
        files.append(path)
    return files[0], files[1]


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "kind, damage, problem",
    [
        ("truncated", lambda b: b[: len(b) // 2], "is not valid JSON ({msg}: truncated or damaged)"),
        ("binary", lambda b: b"\xff\xfe" + b, "is not UTF-8 text (byte 0)"),
        ("list", lambda b: b"[1, 2]", ": not a curve record (a JSON object with the objects settings, spec and curve)"),
        ("spec", lambda b: b.replace(b'"seed"', b'"sead"'),
         ": its spec is not a run of this experiment (RunSpec.__init__() got an unexpected keyword argument 'sead')"),
    ],
)  # fmt: skip
def test_report_only_over_a_damaged_curve_names_it(tmp_path, capsys, kind, damage, problem):
    out = tmp_path / "res"
    good, bad = curve_folder(out)
    bad.write_bytes(damage(bad.read_bytes()))
    if "{msg}" in problem:
        try:
            json.loads(bad.read_text())
        except json.JSONDecodeError as e:
            problem = problem.format(msg=f"{e.msg} at line {e.lineno} column {e.colno}")
    before = snapshot(out)
    assert experiment.main(["--quick", "--report_only", "--out", str(out)]) == 2
    sep = "" if problem.startswith(":") else " "
    assert one_error_line(capsys.readouterr().err, "growlm-experiment") == f"{bad}{sep}{problem}; {FIX_CURVE}"
    assert snapshot(out) == before  # no report.md, no results.json, every curve as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res"]  # no lock file left


# ---------------------------------------------------------------------------------------------------------------
# a damaged token folder (truncated .bin files and a meta.json that is not JSON are refused already)


@pytest.mark.bad_input
def test_a_token_folder_whose_meta_json_is_not_text_is_named(tmp_path, capsys):
    data = tmp_path / "tok"
    data.mkdir()
    (data / "meta.json").write_bytes(b'\xff\xfe{"format": "growlm-tokens-v1"}')
    line = train_fails(capsys, ["--data", str(data), "--seq_len", "32", "--max_steps", "1", "--out_dir",
                                str(tmp_path / "run")])  # fmt: skip
    assert line.endswith(
        f"{data / 'meta.json'} is not UTF-8 text (byte 0: damaged); re-run with --overwrite: run `growlm-prepare "
        f"--train ... --val ... --out {data}` (or plain `growlm-prepare` for the built-in corpus)"
    ), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok"]  # no run folder


def test_every_spelling_of_one_output_names_one_lock(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    lock = tmp_path / "real" / ".out.lock"
    spellings = [tmp_path / "link" / "out", f"{tmp_path / 'real' / 'out'}/", tmp_path / "real" / "x" / ".." / "out"]
    assert [output_lock_path(s) for s in spellings] == [lock] * 3
    with output_lock(tmp_path / "real" / "out"):
        for s in spellings:
            with pytest.raises(LockHeldError), output_lock(s):
                pass


@pytest.mark.bad_input
def test_growlm_experiment_preparing_a_vocabulary_another_process_prepares_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GROWLM_CACHE", str(tmp_path / "cache"))
    s = protocol.quick(protocol.PROFILES["cpu"])
    data = tmp_path / "cache" / f"bpe{s.vocab_size}"
    with output_lock(data):
        assert experiment.main(["--quick", "--out", str(tmp_path / "res"), "--parallel", "1"]) == 2
        line = one_error_line(capsys.readouterr().err, "growlm-experiment")
        prefix = f"preparing the {s.vocab_size}-token BPE into {data}: "
        assert line.startswith(prefix) and held("--out", data).fullmatch(line.removeprefix(prefix)), line
    # nothing of the token folder; the queue lock it waited its turn on stays (runtime.lock.queue_lock)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [f".bpe{s.vocab_size}.queue.lock"]
    assert not (tmp_path / "res" / "curves").exists()
