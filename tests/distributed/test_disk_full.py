"""A disk that fills up in the middle of the work, on a real small tmpfs (tests/disk_helpers.py; skipped, saying why,
where the test may not mount one): a checkpoint save of a 2-rank run, growlm-grow, ``--export_hf`` and
growlm-prepare each end with one line that says no space is left and where, earlier outputs stay whole, and no
staging folder is left behind. The same four on a read-only file system: one line, nothing written (growlm-eval
before it evaluates)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
from cli_utils import one_error_line
from disk_helpers import small_disk, tree_bytes
from dist_utils import REPO, SMALL_DATA, SMALL_VOCAB, base_env, run_ranks, tiny_ds_config

from growlm.growth.offline import cli as grow_cli
from growlm.runtime import checkpoint, memory

TINY = ["--preset", "tiny", "--vocab_size", str(SMALL_VOCAB), "--seq_len", "32", "--no_final_eval",
        "--log_interval", "1"]  # fmt: skip


@pytest.fixture(scope="module")
def reference(tmp_path_factory, small_vocab_data):
    """A 2-rank run with checkpoints at steps 2 and 4 on an ordinary disk: what the disk-full runs are sized from."""
    tmp = tmp_path_factory.mktemp("disk_full")
    args = [*TINY, "--data", str(SMALL_DATA), "--ds_config", str(tiny_ds_config(tmp)), "--max_steps", "4",
            "--save_interval", "2"]  # fmt: skip
    r = run_ranks([*args, "--out_dir", str(tmp / "ref")], timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    return args, tmp / "ref"


def rank_lines(stdout: str) -> dict[int, list[str]]:
    """Each rank's error lines (run_ranks' output is rank by rank, each after a ``--- rank R`` line)."""
    lines: dict[int, list[str]] = {}
    rank = -1
    for ln in stdout.splitlines():
        if ln.startswith("--- rank "):
            rank = int(ln.split()[2])
        elif ln.startswith("growlm-train: error:"):
            lines.setdefault(rank, []).append(ln)
    return lines


def test_a_checkpoint_save_on_a_full_disk(reference, tmp_path):
    args, ref = reference
    ck4 = tree_bytes(ref / "checkpoints" / "global_step4")
    with small_disk(tmp_path / "disk", tree_bytes(ref) - ck4 + ck4 // 2) as disk:  # global_step4 fits half-way
        out = disk / "run"
        r = run_ranks([*args, "--out_dir", str(out)], timeout=300)
        assert r.returncode == 2 and "Traceback" not in r.stdout, r.stdout[-4000:]
        ck = out / "checkpoints"
        lines = rank_lines(r.stdout)
        assert sorted(lines) == [0, 1] and all(len(v) == 1 for v in lines.values()), lines
        assert lines[0][0] == (
            f"growlm-train: error: no space left on device while saving checkpoint global_step4 into {ck}: the "
            "unfinished save was removed, the earlier checkpoints and 'latest' are untouched; free space there (or "
            f"use an --out_dir on another disk) and --resume {ck}"
        )
        assert "global_step4" in lines[1][0], lines  # rank 1: its own full disk, or rank 0's line, or rank 0 ended
        # the earlier checkpoint whole and named by latest; nothing of the failed save left
        assert (ck / "latest").read_text() == "global_step2" and checkpoint.existing_tags(ck) == ["global_step2"]
        assert not list(ck.glob(".tmp-*")) and not list(ck.glob(".old-*"))
        assert checkpoint.open_checkpoint(ck).state.global_step == 2  # manifest and files check out


SAVE_PROBE = """
import errno, json, sys
from pathlib import Path
from growlm.runtime.dist import close_distributed, init_distributed
info = init_distributed(60)
from growlm.model.config import GPTConfig
from growlm.runtime import checkpoint, collectives
from growlm.runtime.run_state import RunState

class Engine:  # DeepSpeed's save as far as the failure goes: rank 1's disk fills, rank 0 waits in a collective
    def save_checkpoint(self, save_dir, tag, client_state, save_latest):
        if info.rank == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        (Path(save_dir) / tag / "mp_rank_00_model_states.pt").write_bytes(b"written")
        collectives.barrier()

cfg = GPTConfig(n_layer=1, n_embd=16, n_head=2, n_positions=8, vocab_size=32)
state = RunState(model_config=cfg, global_step=4, consumed_samples=8, seq_len=8, world_size=2, zero_stage=2, seed=0)
try:
    checkpoint.save(Engine(), sys.argv[1], state, rank=info.rank)
    result = ["saved", ""]
except Exception as e:
    result = [type(e).__name__, str(e)]
print("RESULT " + json.dumps(result), flush=True)
close_distributed()
"""


def test_the_rank_whose_disk_did_not_fill_ends_with_the_line_of_the_one_whose_did(tmp_path):
    """Rank 1's write fails (no space) while rank 0 waits in a collective of the save: rank 0 ends with rank 1's
    disk line (exit status 2 in growlm-train), not "rank 1 ended during the save"; nothing of the save is left."""
    script = tmp_path / "save_probe.py"
    script.write_text(SAVE_PROBE)
    ck = tmp_path / "checkpoints"
    r = run_ranks([str(ck)], script=str(script), timeout=120)
    assert r.returncode == 0, r.stdout[-3000:]
    results = [json.loads(ln.removeprefix("RESULT ")) for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    want = (
        f"no space left on device while saving checkpoint global_step4 into {ck}: the unfinished save was removed; "
        "free space there (or use an --out_dir on another disk) and run again"
    )
    assert results == [["CheckpointSaveError", want], ["CheckpointSaveError", want]], r.stdout[-3000:]
    assert list(ck.iterdir()) == []  # no .tmp-global_step4, no latest


@pytest.fixture
def roomy(monkeypatch):
    """growlm-grow's free-space check sees room: the disk fills while it writes (another writer took the space)."""
    monkeypatch.setattr(memory.shutil, "disk_usage", lambda path: SimpleNamespace(free=2**40, total=2**41, used=0))


@pytest.mark.parametrize("kind", ["grow", "export"])
def test_growlm_grow_and_export_on_a_full_disk(reference, tmp_path, capsys, roomy, kind):
    _, ref = reference
    src = ref / "checkpoints"
    with small_disk(tmp_path / "disk", 256 * 1024) as disk:  # the tiny model's output is about 2 MiB
        (disk / "earlier").mkdir()
        (disk / "earlier" / "kept.txt").write_text("an earlier output\n")
        out = disk / kind
        argv = [str(src), str(out), "--n_layer", "4"] if kind == "grow" else [str(src), "--export_hf", str(out)]
        assert grow_cli.main(argv) == 2
        captured = capsys.readouterr()
        assert "Traceback" not in captured.err
        line = one_error_line(captured.err, "growlm-grow")
        what = "the grown checkpoint" if kind == "grow" else "the export"
        assert line == (
            f"no space left on device while writing {what} {out}; nothing was left there: free space there, or "
            "choose a folder on another disk, and run it again"
        )
        assert sorted(p.name for p in disk.iterdir()) == ["earlier"]  # no staging folder, no lock file
        assert (disk / "earlier" / "kept.txt").read_text() == "an earlier output\n"


def test_growlm_prepare_on_a_full_disk(tmp_path):
    with small_disk(tmp_path / "disk", 1200 * 1024) as disk:  # the corpus is about 7 MB of tokens: datasets refuses
        (disk / "earlier").mkdir()
        out = disk / "tokens"
        train = sorted(str(p) for p in (REPO / "data" / "corpus" / "train").glob("*.txt.xz"))
        val = str(REPO / "data" / "corpus" / "val" / "persuasion.txt.xz")
        cmd = [sys.executable, "-m", "growlm.data.prepare", "--train", *train, "--val", val, "--out", str(out)]
        r = subprocess.run(cmd, cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
        line = one_error_line(r.stderr, "growlm-prepare")
        assert line.startswith(f"no space left on device while writing {out}"), line
        assert line.endswith("nothing was kept: free space, or choose an --out on a disk with room, and run again")
        assert sorted(p.name for p in disk.iterdir()) == ["earlier"]  # no staging folder, no lock file
    assert shutil.disk_usage(tmp_path).free > 0


@pytest.mark.bad_input
@pytest.mark.parametrize("kind", ["grow", "export", "eval", "prepare"])
def test_a_read_only_output_folder_is_one_line(reference, tmp_path, capsys, roomy, kind):
    """growlm-grow, --export_hf, growlm-eval --out and growlm-prepare --out on a read-only file system: one line,
    nothing written; growlm-eval refuses before it evaluates anything."""
    from growlm.data import prepare
    from growlm.eval.metrics import cli as eval_cli

    src = reference[1] / "checkpoints"
    with small_disk(tmp_path / "ro", 64 * 1024, read_only=True) as ro:
        out = ro / kind
        fix = "choose a folder you can write, and run it again"
        if kind in ("grow", "export"):
            argv = [str(src), str(out), "--n_layer", "4"] if kind == "grow" else [str(src), "--export_hf", str(out)]
            assert grow_cli.main(argv) == 2
            what = "the grown checkpoint" if kind == "grow" else "the export"
            want = f"Read-only file system while writing {what} {out}; nothing was left there: {fix}"
            prog = "growlm-grow"
        elif kind == "eval":
            assert eval_cli.main([str(src), "--sets", "builtin", "--out", str(out / "results.json")]) == 2
            want = f"Read-only file system while writing --out {out / 'results.json'}; nothing was evaluated: {fix}"
            prog = "growlm-eval"
        else:
            train, val = (str(REPO / "data" / "corpus" / "val" / f"{n}.txt.xz") for n in ("hamlet", "persuasion"))
            assert prepare.main(["--train", train, "--val", val, "--out", str(out)]) == 2
            want = f"Read-only file system while writing --out {out}; nothing was written: {fix}"
            prog = "growlm-prepare"
        captured = capsys.readouterr()
        assert one_error_line(captured.err, prog) == want and captured.out == ""
        assert list(ro.iterdir()) == []
