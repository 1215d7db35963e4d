"""Bad input to the console commands, refused with exit status 2 and one ``PROG: error:`` line, nothing of the user's
touched: malformed plan files through every command that reads one (one loader: growth.stages.plan.load_stages),
--overwrite of a folder growlm did not write, numeric flags out of range, a repeated host, empty and UTF-16 sources,
a WikiText folder without its files, a full disk, and growlm-grow's --help defaults."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_utils import one_error_line, train_fails

from growlm.data import prepare
from growlm.data.text import InputError, read_text
from growlm.data.tokens import SplitWriter
from growlm.eval.bench import throughput as bench
from growlm.eval.metrics import cli as eval_cli
from growlm.growth.errors import GrowthError
from growlm.growth.offline import cli as grow
from growlm.growth.offline import pipeline
from growlm.growth.offline.export import EXPORT_MARKER, check_replaceable
from growlm.growth.stages.plan import load_stages
from growlm.trainer.driver import cli as run_cli

REPO = Path(__file__).resolve().parents[2]
GOOD_PLAN = """seed: 0
start: {preset: tiny, n_layer: 1}
stages:
  - name: deeper
    target: {n_layer: 2}
    family: masked
    when: {step: 2}
"""
# (file text, the line named, the words of the problem and of the fix)
BAD_PLANS = {
    "syntax": (GOOD_PLAN.replace("{n_layer: 2}", "{n_layer: 2"), 6, "not valid YAML", "fix the YAML syntax"),
    "duplicate": (GOOD_PLAN + "    when: {step: 3}\n", 8, "duplicate key 'when' (first given on line 7)",
                  "give each key once"),
    "tab": (GOOD_PLAN.replace("  - name: deeper\n    target", "  - name: deeper\n\ttarget"), 5, "a tab character",
            "replace the tabs with spaces"),
}  # fmt: skip


def _plan(tmp_path: Path, kind: str) -> tuple[Path, str]:
    text, line, problem, fix = BAD_PLANS[kind]
    f = tmp_path / f"{kind}.yaml"
    f.write_text(text)
    return f, f"{f}:{line}: "


# ---------------------------------------------------------------------------------------------------------------
# one plan-file loader


@pytest.mark.bad_input
@pytest.mark.parametrize("kind", sorted(BAD_PLANS))
def test_a_malformed_plan_is_one_line_naming_file_and_line(tmp_path, kind):
    f, where = _plan(tmp_path, kind)
    _, _, problem, fix = BAD_PLANS[kind]
    with pytest.raises(GrowthError) as e:
        load_stages(f)
    msg = str(e.value)
    assert msg.startswith(where) and problem in msg and fix in msg, msg
    assert "\n" not in msg and "<unicode string>" not in msg
    (tmp_path / "ok.yaml").write_text(GOOD_PLAN)
    assert [s.name for s in load_stages(tmp_path / "ok.yaml").stages] == ["deeper"]


@pytest.mark.bad_input
def test_a_plan_whose_stages_are_not_mappings_is_refused(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("start: {preset: tiny}\nstages: [deeper]\n")
    with pytest.raises(GrowthError, match=r"a plan: stages=\['deeper'\] must be a non-empty list of mappings, each "):
        load_stages(f)


@pytest.mark.bad_input
@pytest.mark.parametrize("kind", sorted(BAD_PLANS))
def test_growlm_grow_refuses_a_malformed_plan_before_reading_the_checkpoint(tmp_path, capsys, kind):
    f, where = _plan(tmp_path, kind)
    assert grow.main([str(tmp_path / "no_checkpoint"), str(tmp_path / "out"), "--growth_plan", str(f)]) == 2
    line = one_error_line(capsys.readouterr().err, "growlm-grow")
    assert line.startswith(f"--growth_plan {f}: {where}") and BAD_PLANS[kind][3] in line
    assert not (tmp_path / "out").exists()


@pytest.mark.bad_input
@pytest.mark.parametrize("kind", sorted(BAD_PLANS))
def test_train_refuses_a_malformed_plan(tmp_path, capsys, kind):
    f, where = _plan(tmp_path, kind)
    out = tmp_path / "run"
    line = train_fails(capsys, ["--growth_plan", str(f), "--out_dir", str(out)], f"--growth_plan {f}: {where}")
    assert "does not parse" not in line and BAD_PLANS[kind][3] in line
    assert not out.exists()


@pytest.mark.bad_input
@pytest.mark.parametrize("kind", sorted(BAD_PLANS))
def test_growlm_run_dry_run_refuses_a_malformed_plan(tmp_path, capsys, kind):
    f, where = _plan(tmp_path, kind)
    assert run_cli.main([str(f), "--dry_run", "--", "--out_dir", str(tmp_path / "run")]) == 2
    line = one_error_line(capsys.readouterr().err, "growlm-run")
    assert line.startswith(f"--growth_plan {f}: {where}") and BAD_PLANS[kind][3] in line
    assert not (tmp_path / "run").exists()


def test_a_bug_in_loading_is_not_reported_as_a_parse_error(tmp_path, monkeypatch):
    from growlm.trainer import plan_checks as trainer_stages

    def broken(path):
        raise KeyError("a bug")

    monkeypatch.setattr(trainer_stages, "load_stages", broken)
    with pytest.raises(KeyError):
        trainer_stages.load_growth_plan(str(tmp_path / "p.yaml"))


# ---------------------------------------------------------------------------------------------------------------
# growlm-run: a host listed twice


@pytest.mark.bad_input
def test_growlm_run_dry_run_refuses_a_hostfile_listing_a_host_twice(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts.txt").write_text("# two nodes\nnode-a slots=1\nnode-a slots=1\n")
    plan = GOOD_PLAN.replace("start: {preset: tiny, n_layer: 1}",
                             "start: {preset: tiny, n_layer: 1, resources: {nodes: 2, ranks_per_node: 1, "
                             "hostfile: hosts.txt}}")  # fmt: skip
    (tmp_path / "plan.yaml").write_text(plan)
    assert run_cli.main(["plan.yaml", "--dry_run", "--", "--out_dir", "runs/x"]) == 2
    line = one_error_line(capsys.readouterr().err, "growlm-run")
    assert line == (
        "hosts.txt:3: host 'node-a' is listed twice (first on line 2); DeepSpeed's launcher refuses a repeated "
        "host: list each node once, its ranks as slots=N"
    )
    (tmp_path / "plan.yaml").write_text(plan.replace("hostfile: hosts.txt", "hosts: [n0, n0]"))
    assert run_cli.main(["plan.yaml", "--dry_run", "--", "--out_dir", "runs/x"]) == 2
    line = one_error_line(capsys.readouterr().err, "growlm-run")
    assert line.startswith("resources.hosts ['n0', 'n0'] names n0 more than once;"), line
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------------------------------------------------------
# numeric flags out of range


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--world_size", "0"], "--world_size 0: must be >= 1 (ranks); give a value of at least 1"),
        (["--max_steps", "0"], "--max_steps 0: must be >= 1 (optimizer steps per run)"),
        (["--micro_batch", "0"], "--micro_batch 0: must be >= 1"),
        (["--threads_per_rank", "-1"], "--threads_per_rank -1: must be >= 1"),
        (["--seq_len", "0"], "--seq_len 0: must be >= 1"),
        (["--timeout_s", "0"], "--timeout_s 0.0: must be a positive number"),
    ],
)
def test_growlm_bench_refuses_numbers_out_of_range(tmp_path, capsys, argv, message):
    assert bench.main(["--preset", "tiny", "--out", str(tmp_path / "b"), *argv]) == 2
    assert one_error_line(capsys.readouterr().err, "growlm-bench").startswith(message)
    assert not (tmp_path / "b").exists()


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--stride", "0", "--stride 0 must be >= 1 (omit it for the context)"),
        ("--context", "0", "--context 0 must be >= 2 (omit it for the model's n_positions)"),
        ("--batch_size", "0", "--batch_size 0 must be >= 1"),
        ("--max_cloze_items", "-1", "--max_cloze_items -1 must be >= 0 (0: all)"),
    ],
)
def test_growlm_eval_refuses_zero_windows_instead_of_taking_the_default(tmp_path, capsys, flag, value, message):
    assert eval_cli.main([str(tmp_path / "no_model"), flag, value]) == 2
    assert one_error_line(capsys.readouterr().err, "growlm-eval") == message


def test_check_windows_takes_zero_as_given_not_as_the_default():
    m = SimpleNamespace(config=SimpleNamespace(n_positions=64, shape_str=lambda: "2 x 32"))
    assert eval_cli.check_windows(m, None, None) == (64, 64)
    with pytest.raises(ValueError, match="--context 0 must be in"):
        eval_cli.check_windows(m, 0, None)
    with pytest.raises(ValueError, match=r"--stride 0 must be in \[1, --context 16\]"):
        eval_cli.check_windows(m, 16, 0)


# ---------------------------------------------------------------------------------------------------------------
# growlm-eval --wikitext FOLDER


@pytest.mark.bad_input
def test_growlm_eval_names_what_a_wikitext_folder_lacks(tmp_path, capsys):
    wiki = tmp_path / "wikitext-103-raw"
    wiki.mkdir()
    (wiki / "wiki.train.raw").write_text(" = A = \n")
    assert eval_cli.main([str(tmp_path / "no_model"), "--wikitext", str(wiki)]) == 2
    line = one_error_line(capsys.readouterr().err, "growlm-eval")
    assert line == (
        f"eval folder {wiki} has no wiki.test.raw or wiki.test.tokens (it holds: wiki.train.raw); give the file to "
        f"score itself, e.g. --wikitext {wiki / 'wiki.test.raw'}"
    )
    assert "does not exist" not in line
    (wiki / "wiki.test.raw").write_text(" = B = \n text\n")  # the folder stands for its test split
    assert eval_cli.read_eval_files(str(wiki), None).wikitext_text == " = B = \n text\n"


# ---------------------------------------------------------------------------------------------------------------
# growlm-prepare: empty sources, UTF-16, --overwrite, a full disk


def _argv(tmp_path: Path, train: Path, val: Path, *extra: str) -> list[str]:
    return ["--train", str(train), "--val", str(val), "--out", str(tmp_path / "tok"), *extra]


@pytest.mark.bad_input
@pytest.mark.parametrize("split", ["train", "val"])
@pytest.mark.parametrize("name, content", [("empty.jsonl", b""), ("empty.json", b"[]\n"), ("blank.jsonl", b"\n\n")])
def test_prepare_names_an_empty_json_source_and_its_split(tmp_path, capsys, split, name, content):
    empty, good = tmp_path / name, tmp_path / "good.txt"
    empty.write_bytes(content)
    good.write_text("some text\n")
    train, val = (empty, good) if split == "train" else (good, empty)
    assert prepare.main(_argv(tmp_path, train, val)) == 2
    line = one_error_line(capsys.readouterr().err, "growlm-prepare")
    assert line == (
        f"{empty.resolve()}: the {split} source holds no rows (an empty file or an empty JSON array); add rows "
        f'({{"text": "..."}} per line), or remove it from --{split}'
    )
    assert not (tmp_path / "tok").exists()


@pytest.mark.bad_input
@pytest.mark.parametrize("encoding, name", [("utf-16-le", "little"), ("utf-16-be", "big")])
def test_a_utf16_file_gets_the_utf16_fix(tmp_path, capsys, encoding, name):
    f = tmp_path / "u16.txt"
    bom = b"\xff\xfe" if encoding == "utf-16-le" else b"\xfe\xff"
    f.write_bytes(bom + "caf\u00e9\n".encode(encoding))
    with pytest.raises(InputError) as e:
        read_text(f)
    assert str(e.value) == (
        f"{f}:1: the file is UTF-16 {name}-endian (it starts with a UTF-16 byte-order mark), not UTF-8; convert it "
        "to UTF-8, e.g. `iconv -f utf-16 -t utf-8 FILE > FILE.utf8`"
    )
    good = tmp_path / "good.txt"
    good.write_text("text\n")
    assert prepare.main(_argv(tmp_path, f, good)) == 2
    line = one_error_line(capsys.readouterr().err, "growlm-prepare")
    assert "iconv -f utf-16 -t utf-8" in line and "latin1" not in line


def _user_folder(tmp_path: Path) -> Path:
    d = tmp_path / "tok"
    d.mkdir()
    (d / "notes.txt").write_text("my notes")
    return d


@pytest.mark.bad_input
def test_prepare_overwrite_refuses_a_folder_it_did_not_write(tmp_path, capsys):
    src = tmp_path / "a.txt"
    src.write_text("some text to tokenize\n")
    user = _user_folder(tmp_path)
    assert prepare.main(_argv(tmp_path, src, src, "--overwrite")) == 2
    assert one_error_line(capsys.readouterr().err, "growlm-prepare") == (
        f"--overwrite: {user.resolve()} is not a prepared token folder (no meta.json); refusing to delete it; "
        "choose another --out, or move it away yourself"
    )
    assert (user / "notes.txt").read_text() == "my notes"
    # a prepared folder is replaced; one with a user's file added is not
    (user / "notes.txt").unlink()
    assert prepare.main(_argv(tmp_path, src, src, "--overwrite")) == 0
    assert prepare.main(_argv(tmp_path, src, src, "--overwrite")) == 0
    capsys.readouterr()
    (user / "notes.txt").write_text("my notes")
    assert prepare.main(_argv(tmp_path, src, src, "--overwrite")) == 2
    assert "holds files growlm-prepare did not write (notes.txt)" in one_error_line(
        capsys.readouterr().err, "growlm-prepare"
    )
    assert (user / "notes.txt").read_text() == "my notes" and (user / "meta.json").is_file()


@pytest.mark.bad_input
def test_prepare_on_a_full_disk_says_so_and_keeps_nothing(tmp_path, capsys, monkeypatch):
    src = tmp_path / "a.txt"
    src.write_text("some text to tokenize\n")
    assert prepare.main(_argv(tmp_path, src, src)) == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "tok").iterdir()}
    capsys.readouterr()

    def full(self, ids):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(SplitWriter, "write", full)
    out = (tmp_path / "tok").resolve()
    assert prepare.main(_argv(tmp_path, src, src, "--overwrite")) == 2
    err = capsys.readouterr().err  # datasets' progress bar, then the one error line
    assert "Traceback" not in err
    lines = [x for x in err.splitlines() if "growlm-prepare: error:" in x]
    assert len(lines) == 1 and lines[0].split("growlm-prepare: error: ", 1)[1] == (
        f"no space left on device while writing {out}; nothing was kept and the old folder is unchanged: free "
        "space, or choose an --out on a disk with room, and run again"
    ), err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the old folder, whole
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no half-written folder
    assert prepare.main(["--train", str(src), "--val", str(src), "--out", str(tmp_path / "new")]) == 2
    assert "no space left on device" in capsys.readouterr().err and not (tmp_path / "new").exists()


# ---------------------------------------------------------------------------------------------------------------
# growlm-grow --export_hf DIR --overwrite, --help


@pytest.mark.bad_input
def test_export_overwrite_refuses_a_folder_growlm_did_not_write(tmp_path, capsys, monkeypatch):
    from growlm.model.config import from_preset

    tag = tmp_path / "ckpt" / "global_step3"
    tag.mkdir(parents=True)
    src = SimpleNamespace(state=SimpleNamespace(global_step=3, growth_masks=None),
                          config=from_preset("tiny", vocab_size=50304), tag_dir=tag, ckpt_dir=tag.parent)  # fmt: skip
    monkeypatch.setattr(pipeline, "open_source", lambda path, verifying=None: src)  # cli imports it when it runs
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "notes.txt").write_text("my notes")
    argv = [str(tag.parent), "--export_hf", str(hf), "--tokenizer", "gpt2", "--overwrite"]
    assert grow.main(argv) == 2
    assert one_error_line(capsys.readouterr().err, "growlm-grow") == (
        f"--overwrite: {hf} is not a growlm export (no {EXPORT_MARKER}); refusing to delete it; choose another "
        "--export_hf folder, or move it away yourself"
    )
    assert (hf / "notes.txt").read_text() == "my notes" and sorted(p.name for p in hf.iterdir()) == ["notes.txt"]
    # an export with a user's file added: refused too; a plain export, or an empty folder: replaceable
    for name in ("config.json", "model.safetensors", "tokenizer.json", EXPORT_MARKER):
        (hf / name).write_text("{}")
    with pytest.raises(Exception, match=r"holds files an export does not write \(notes.txt\)"):
        check_replaceable(hf)
    (hf / "notes.txt").unlink()
    check_replaceable(hf)
    check_replaceable(tmp_path / "missing")
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(Exception, match="is not a growlm export; refusing to replace it"):
        check_replaceable(tmp_path / "a_file")


def test_growlm_grow_help_shows_one_true_default_per_flag(capsys):
    with pytest.raises(SystemExit):
        grow.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in text and "(default: False)" not in text
    assert "operator family (default: masked)" in text and "(default masked)" not in text
    assert "stage name (default: the stage that starts from the checkpoint's shape) growth stage" in text
    assert "the token folder the checkpoint was trained on) --overwrite" in text
    assert "instead of OUT (default: no export)" in text
    assert "(default: carry)" in text and "re-warm over this many steps (default: 0)" in text
    assert "target n_inner (default: follows the width" in text and "default: keeps the query heads per" in text
    assert text.count("(default:") == 9  # export_hf, stage, family, n_inner, moments, fresh_exp_avg_sq, schedule, ...


@pytest.mark.bad_input
def test_grow_overwrite_replaces_only_a_growlm_grow_output(tmp_path):
    """growlm-grow CKPT OUT --overwrite: a user's folder, a training run's checkpoints folder, or a growlm-grow output
    a user added a file to is refused and left as it was; an empty folder or a growlm-grow output may be replaced."""
    from growlm.growth.offline.pipeline import check_replaceable
    from growlm.runtime.checkpoint import CheckpointError

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match=r"not a growlm-grow output \(no latest_universal\)"):
        check_replaceable(mine)
    grown = tmp_path / "grown"
    (grown / "global_step4").mkdir(parents=True)
    (grown / "global_step4" / "growlm_state.json").write_text(json.dumps(
        {"model_config": {"n_layer": 1, "n_embd": 8, "n_head": 2}, "global_step": 4, "consumed_samples": 8,
         "seq_len": 8, "world_size": 1, "zero_stage": 2, "seed": 0, "universal": True}))  # fmt: skip
    (grown / "latest").write_text("global_step4")
    (grown / "latest_universal").write_text("global_step4")
    check_replaceable(grown)  # growlm-grow's own output: may be replaced
    check_replaceable(tmp_path / "empty_or_missing")
    (grown / "notes.txt").write_text("keep me too")
    with pytest.raises(CheckpointError, match=r"holds entries growlm-grow did not write \(notes.txt\)"):
        check_replaceable(grown)
    assert (mine / "notes.txt").read_text() == "keep me" and (grown / "notes.txt").is_file()
