"""Flags of the console commands whose effect no other test showed (tests/unit/test_flag_coverage.py finds them):
each test sets the flag and asserts what it changes. In-process and small: no train.py process, no download; where
a command would start runs or fetch packages, that one call is replaced by a recorder and the flag's effect on what
it is given is asserted."""

from __future__ import annotations

import json
import lzma
import types
from pathlib import Path

import pytest

from growlm.data import build_corpus
from growlm.eval.bench import throughput as bench
from growlm.growth.errors import GrowthError
from growlm.growth.offline import cli as grow
from growlm.growth.ops.apply import OptimizerPolicy
from growlm.growth.ops.schedule_rule import place_schedule
from growlm.growth.stages.plan import load_stages
from growlm.runtime.schedule import ScheduleState

REPO = Path(__file__).resolve().parents[2]
PLAN = REPO / "growth" / "plans" / "tiny_msg.yaml"  # tiny 2 x 64 -> 'deeper' 4 x 64 -> 'wider' 4 x 128


# ---------------------------------------------------------------------------------------------------------------
# growlm-prepare


def test_prepare_num_proc_gives_the_same_tokens_as_one_process(tmp_path, capsys):
    from growlm.data import prepare
    from growlm.data.prepare import open_tokens

    docs = [f"Document number {i}: the quick brown fox jumps over the lazy dog {i} times." for i in range(6)]
    src = tmp_path / "src"
    src.mkdir()
    for i, d in enumerate(docs):
        (src / f"d{i}.txt").write_text(d)
    train = [str(p) for p in sorted(src.glob("d*.txt"))]
    base = ["--train", *train, "--val", train[0]]
    assert prepare.main([*base, "--out", str(tmp_path / "one")]) == 0
    assert prepare.main([*base, "--out", str(tmp_path / "two"), "--num_proc", "2"]) == 0
    one, two = open_tokens(tmp_path / "one", "train").tolist(), open_tokens(tmp_path / "two", "train").tolist()
    assert two == one and one.count(50256) == len(docs)  # same ids, same order, one EOT per document
    capsys.readouterr()


# ---------------------------------------------------------------------------------------------------------------
# growlm-build-corpus (python -m growlm.data.build_corpus): the registries are not reached; build_documents is replaced


def _committed_documents(work: Path) -> list[build_corpus.Document]:
    """What build_documents would return today, read from the committed corpus (no download)."""
    docs = []
    for e in build_corpus.load_manifest()["files"]:
        text = lzma.decompress((build_corpus.CORPUS_DIR / e["path"]).read_bytes()).decode("utf-8")
        s = e["source"]
        docs.append(
            build_corpus.Document(e["name"], e["split"], text, s["registry"], s["package"], s["version"], e["licence"])
        )
    return docs


def test_build_corpus_check_compares_a_rebuild_with_the_manifest_and_writes_nothing(monkeypatch, tmp_path, capsys):
    before = sorted(p.name for p in build_corpus.CORPUS_DIR.rglob("*"))
    monkeypatch.setattr(build_corpus, "build_documents", _committed_documents)
    assert build_corpus.main(["--check"]) == 0
    assert capsys.readouterr().out.strip().endswith("corpus matches MANIFEST.json")

    def one_changed(work: Path) -> list:  # the first document's first character replaced: same bytes and words
        docs = _committed_documents(work)
        d = docs[0]
        text = ("#" if d.text[0] != "#" else "%") + d.text[1:]
        docs[0] = build_corpus.Document(d.name, d.split, text, d.registry, d.package, d.version, d.licence)
        return docs

    monkeypatch.setattr(build_corpus, "build_documents", one_changed)
    assert build_corpus.main(["--check"]) == 1
    first = build_corpus.load_manifest()["files"][0]
    rebuilt = build_corpus._sha256(one_changed(tmp_path)[0].text.encode("utf-8"))
    assert capsys.readouterr().out.splitlines() == [
        f"MISMATCH {first['path']}: sha256 manifest {first['sha256']} rebuilt {rebuilt} (source {first['source']})",
        "1 difference(s)",
    ]
    assert sorted(p.name for p in build_corpus.CORPUS_DIR.rglob("*")) == before  # --check writes nothing


def test_build_corpus_extra_writes_each_named_source_under_out(monkeypatch, tmp_path, capsys):
    calls = []

    def fake_source(work: Path, out: Path) -> None:
        calls.append(out.name.split(".")[1].removeprefix("tmp-"))  # built in .tmp-NAME.XXXX beside out/NAME
        out.mkdir(parents=True, exist_ok=True)
        (out / "a.txt").write_text("article")

    monkeypatch.setattr(build_corpus, "EXTRAS", {"alpha": fake_source, "beta": fake_source})
    assert build_corpus.main(["--extra", " beta , alpha,", "--out", str(tmp_path / "x")]) == 0
    assert calls == ["beta", "alpha"]  # the named sources, in the order given, spaces and empty names dropped
    assert (tmp_path / "x" / "beta" / "a.txt").read_text() == "article"
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == ["alpha", "beta"]  # no staging folder left
    assert capsys.readouterr().out.splitlines() == [f"beta -> {tmp_path / 'x' / 'beta'}",
                                                    f"alpha -> {tmp_path / 'x' / 'alpha'}"]  # fmt: skip
    with pytest.raises(ValueError, match=r"unknown extra source\(s\) \['gamma'\]"):
        build_corpus.main(["--extra", "gamma", "--out", str(tmp_path / "y")])
    assert not (tmp_path / "y").exists()


@pytest.mark.bad_input
def test_build_corpus_never_writes_into_an_installed_package(monkeypatch, tmp_path, capsys):
    installed = tmp_path / "site-packages" / "growlm" / "data" / "corpus"  # no .git above it: not a clone
    installed.mkdir(parents=True)
    monkeypatch.setattr(build_corpus, "CORPUS_DIR", installed)
    assert build_corpus.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"growlm-build-corpus: error: {installed} belongs to an installed growlm") and "--out" in err
    assert not list(installed.iterdir())


# ---------------------------------------------------------------------------------------------------------------
# growlm-grow: the stage the flags describe (stage_from_flags / stage_from_plan_file), no checkpoint needed


def test_grow_export_hf_has_a_dashed_spelling():
    assert grow.parse_args(["ck", "--export_hf", "hf"]).export_hf == "hf"
    assert grow.parse_args(["ck", "--export_hf", "hf"]).export_hf == "hf"


def test_grow_stage_picks_the_named_stage_of_the_plan():
    sched = load_stages(PLAN)
    deeper = sched.stages[0].target
    args = grow.parse_args(["ck", "out", "--growth_plan", str(PLAN), "--stage", "wider"])
    stage, seed = grow.stage_from_plan_file(args.growth_plan, args.stage, deeper)
    assert (stage.name, stage.target.n_embd, seed) == ("wider", 128, 0)
    wrong_start = "stage 'wider' of .* grows from L=4 d=64 .*the checkpoint's model is L=2 d=64"
    with pytest.raises(GrowthError, match=wrong_start):
        grow.stage_from_plan_file(args.growth_plan, args.stage, sched.start)  # the tiny start is 'deeper''s
    with pytest.raises(GrowthError, match=r"has no stage 'widest'; its stages are \['deeper', 'wider'\]"):
        grow.stage_from_plan_file(str(PLAN), "widest", sched.start)


def test_grow_optimizer_and_schedule_flags_make_the_stage():
    cfg = load_stages(PLAN).start
    argv = ["ck", "out", "--n_layer", str(2 * cfg.n_layer), "--family", "duplicate", "--option", "layer_order=stack",
            "--option", "exact=false", "--moments", "reset", "--fresh_exp_avg_sq", "mean", "--schedule", "target",
            "--constant_op", "2", "--rewarm_steps", "5", "--total_num_steps", "400",
            "--warmup_num_steps", "40"]  # fmt: skip
    stage = grow.stage_from_flags(grow.parse_args(argv), cfg, step=100)
    assert stage.options == {"layer_order": "stack", "exact": False}  # VALUE read as JSON where it is JSON
    assert stage.optimizer == OptimizerPolicy("reset", "mean")
    before = ScheduleState(total_num_steps=200, warmup_num_steps=20, last_batch_iteration=99)
    placed = place_schedule(before, 100, stage.schedule)
    assert (placed.total_num_steps, placed.warmup_num_steps) == (400, 40)  # the target schedule
    assert (placed.last_batch_iteration, placed.rewarm_start, placed.rewarm_steps) == (50, 100, 5)  # 99 / 2
    defaults = grow.stage_from_flags(grow.parse_args(argv[:6]), cfg, step=100)
    assert defaults.optimizer == OptimizerPolicy("carry", "zero")
    kept = place_schedule(before, 100, defaults.schedule)  # 'continue': same schedule, same position
    assert (kept.total_num_steps, kept.warmup_num_steps, kept.last_batch_iteration) == (200, 20, 99)
    with pytest.raises(GrowthError, match="--option 'stack' must be KEY=VALUE"):
        grow.stage_from_flags(grow.parse_args([*argv[:4], "--option", "stack"]), cfg, step=100)


# ---------------------------------------------------------------------------------------------------------------
# growlm-eval on a tiny random transformers model (no process)


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=1, n_embd=8, n_head=2, n_inner=16, n_positions=32, vocab_size=50257)
    out = tmp_path_factory.mktemp("hf")
    GPT2LMHeadModel(cfg).save_pretrained(out)
    return out


def _eval_json(model: Path, capsys, *args: str) -> dict:
    from growlm.eval.metrics import cli

    rc = cli.main([str(model), "--tokenizer", "gpt2", "--no_progress", *args])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    return json.loads(cap.out)


def test_eval_stride_and_batch_size(tiny_hf, tmp_path, capsys):
    doc = tmp_path / "doc.txt"
    doc.write_text(" ".join(f"word{i % 17} and more text" for i in range(40)))
    base = ["--sets", "", "--wikitext", str(doc), "--context", "16"]
    a = _eval_json(tiny_hf, capsys, *base, "--stride", "4", "--batch_size", "1")
    b = _eval_json(tiny_hf, capsys, *base, "--stride", "4", "--batch_size", "7")
    c = _eval_json(tiny_hf, capsys, *base, "--stride", "16")
    assert (a["context"], a["stride"], c["stride"]) == (16, 4, 16)
    ra, rb, rc = (x["results"]["wikitext_file"] for x in (a, b, c))
    assert ra["tokens"] == rb["tokens"] == rc["tokens"]  # every token scored once, whatever the stride
    assert rb["total_nll"] == pytest.approx(ra["total_nll"], rel=1e-5)  # batching changes no number
    assert rc["total_nll"] != pytest.approx(ra["total_nll"], rel=1e-6)  # shorter contexts: another sum


def test_eval_max_cloze_items_scores_only_the_first_n(tiny_hf, capsys):
    three = _eval_json(tiny_hf, capsys, "--sets", "cloze", "--max_cloze_items", "3", "--context", "32")
    assert three["results"]["cloze"]["n_items"] == 3
    five = _eval_json(tiny_hf, capsys, "--sets", "cloze", "--max_cloze_items", "5", "--context", "32")
    assert five["results"]["cloze"]["n_items"] == 5


def test_eval_wiki_split_picks_the_held_out_articles(tiny_hf, tmp_path, monkeypatch, capsys):
    extra = tmp_path / "extra"  # growlm's cache folder is GROWLM_CACHE: its extra/ holds the sample
    for split, names in (("val", ["v1"]), ("test", ["t1", "t2"])):
        (extra / "wikipedia" / split).mkdir(parents=True)
        for n in names:
            (extra / "wikipedia" / split / f"{n}.txt").write_text(f"Article {n} has a few words of text in it.")
    monkeypatch.setenv("GROWLM_CACHE", str(tmp_path))
    val = _eval_json(tiny_hf, capsys, "--sets", "wikipedia", "--wiki_split", "val")["results"]["wikipedia"]
    test = _eval_json(tiny_hf, capsys, "--sets", "wikipedia")["results"]["wikipedia"]  # default: test
    assert (val["split"], val["documents"]) == ("val", 1)
    assert (test["split"], test["documents"]) == ("test", 2)


# ---------------------------------------------------------------------------------------------------------------
# growlm-bench: what reaches train.py and the report, without starting it


def test_bench_sweep_takes_every_stage_and_precision_this_device_has(monkeypatch):
    monkeypatch.setattr(bench, "available_precisions", lambda: ("cpu", ["fp32", "bf16"]))
    _, precisions, stages, _, _ = bench._resolve(bench.parse_args(["--preset", "tiny", "--precision", "fp32"]))
    assert (precisions, stages) == (["fp32"], [2])
    _, precisions, stages, _, _ = bench._resolve(bench.parse_args(["--preset", "tiny", "--sweep"]))
    assert (precisions, stages) == (["fp32", "bf16"], [0, 1, 2, 3])


def test_bench_grad_accum_and_timeout_reach_the_train_py_run(monkeypatch, tmp_path):
    monkeypatch.setattr(bench, "available_precisions", lambda: ("cpu", ["fp32"]))
    args = bench.parse_args(["--preset", "tiny", "--precision", "fp32", "--micro_batch", "2", "--grad_accum", "3",
                             "--world_size", "2", "--timeout_s", "7"])  # fmt: skip
    device_type, _, _, cfg, fpt = bench._resolve(args)
    common = bench._common(args, cfg, fpt, device_type)
    assert (common["grad_accum"], common["global_batch"]) == (3, 2 * 3 * 2)
    seen = {}

    def launch(cmd, nproc, **kw):
        seen.update(kw)
        return types.SimpleNamespace(timed_out=True, returncode=-9, max_rss_bytes=[0, 0])

    monkeypatch.setattr(bench, "launch_ranks", launch)
    with pytest.raises(bench.BenchError, match="did not finish within --timeout_s 7"):
        bench.bench_deepspeed(args, 2, "fp32", tmp_path, {"device_type": "cpu", "common": common})
    assert seen["timeout_s"] == 7.0
    assert json.loads((tmp_path / "zero2-fp32.json").read_text())["gradient_accumulation_steps"] == 3


def test_bench_peak_tflops_replaces_the_measured_peak(monkeypatch, tmp_path):
    monkeypatch.setattr(bench, "available_precisions", lambda: ("cpu", ["fp32"]))
    seen = {}

    class Stop(Exception):
        pass

    def measure(args, precisions, stages, base, work):
        seen.update(base["peaks"])
        raise Stop

    monkeypatch.setattr(bench, "_measure", measure)
    args = bench.parse_args(["--preset", "tiny", "--precision", "fp32", "--world_size", "2",
                             "--threads_per_rank", "1", "--peak_tflops", "3.5", "--out", str(tmp_path)])  # fmt: skip
    with pytest.raises(Stop):
        bench.run(args)
    peak = seen[("fp32", 1)]
    assert (peak.flops_per_s, peak.source) == (3.5e12, "given: 3.5 TFLOP/s")  # no matmul was timed


# ---------------------------------------------------------------------------------------------------------------
# --version and --help of every console command


def _mains():
    from growlm import train
    from growlm.data import build_corpus, prepare
    from growlm.eval.bench import gpu_check, throughput
    from growlm.eval.experiments import cli as experiment
    from growlm.eval.metrics import cli as eval_cli
    from growlm.growth.offline import cli as grow_cli
    from growlm.trainer.driver import cli as driver_cli

    return {"growlm-train": train.main, "growlm-prepare": prepare.main, "growlm-build-corpus": build_corpus.main,
            "growlm-grow": grow_cli.main, "growlm-run": driver_cli.main, "growlm-eval": eval_cli.main,
            "growlm-experiment": experiment.main, "growlm-bench": throughput.main,
            "growlm-gpu-check": gpu_check.main}  # fmt: skip


@pytest.mark.parametrize("command", sorted(_mains()))
def test_every_command_has_version(command, capsys):
    import growlm

    with pytest.raises(SystemExit) as e:
        _mains()[command](["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"{command} (growlm {growlm.__version__})"


def test_train_help_shows_defaults(capsys):
    from growlm import train

    with pytest.raises(SystemExit):
        train.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--max_steps MAX_STEPS train until this many optimizer steps (global step) (default: 200)" in out
    assert "--log_interval LOG_INTERVAL steps between TensorBoard/console logs (>= 1) (default: 10)" in out
