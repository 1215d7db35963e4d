"""growlm-grow end to end: checkpoints saved by 2 real ranks (ZeRO-1/2/3, fp32 and bf16) are grown or resharded
offline and resumed by train.py at 1 and 2 ranks; HF export; bad input. CPU, gloo, presets tiny and llama-tiny,
seq_len 32."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_utils import one_error_line
from dist_utils import REPO, SMALL_DATA, SMALL_VOCAB, read_metrics, run_ranks, saved_adam_steps, write_ds_config
from tqdm import tqdm

from growlm.data.prepare import open_tokens
from growlm.data.sampler import TokenWindows
from growlm.growth.offline.cli import main as grow_main
from growlm.growth.offline.cli import parse_args, stage_from_flags
from growlm.growth.offline.pipeline import grow_checkpoint, open_source
from growlm.growth.offline.universal import OPTIMIZER_STATE, UniversalStore
from growlm.growth.offline.weights import fp32_model
from growlm.growth.ops.apply import grow_param
from growlm.growth.ops.rules import param_shapes
from growlm.model.config import param_count
from growlm.model.masks import GrowthMaskedModel
from growlm.runtime import checkpoint
from growlm.runtime.atomic import current_umask
from growlm.runtime.memory import universal_checkpoint_bytes
from growlm.runtime.run_state import VERSION, RunState
from growlm.runtime.schedule import ScheduleState

# the small-vocabulary corpus (conftest.small_vocab_data): growth and resharding do not depend on the tokenizer
TINY = ["--seq_len", "32", "--log_interval", "1", "--no_final_eval", "--data", str(SMALL_DATA)]
SAVE_STEP, MAX_STEPS = 3, 5
# masked growth of every dimension (exact at ramp 0), or duplicate width x2 (exact in eval mode, no masks)
GROW = {
    "masked": ["--family", "masked", "--n_layer", "3", "--n_embd", "96", "--n_head", "6", "--ramp_steps", "4"],
    "duplicate": ["--family", "duplicate", "--n_embd", "128", "--n_head", "8"],
    # llama-tiny (L 2, d 64, H 4, K 2, F 128): width x2, heads and key/value heads, FFN and depth at once (exact), or
    # the masked family to sizes that are no multiples
    "llama-duplicate": ["--family", "duplicate", "--n_embd", "128", "--n_head", "12", "--n_kv_head", "6",
                        "--n_inner", "320", "--n_layer", "4"],
    "llama-masked": ["--family", "masked", "--n_layer", "3", "--n_embd", "96", "--n_head", "6", "--n_kv_head", "3",
                     "--n_inner", "200", "--ramp_steps", "4"],
}  # fmt: skip
TEMPLATES = {  # template: growth family
    "zero1_fp32": "masked",
    "zero2_fp32": "masked",
    "zero3_fp32": "masked",
    "zero1_bf16": "duplicate",
    "zero2_bf16": "masked",
    "zero3_bf16": "duplicate",
    "llama/zero2_fp32": "llama-duplicate",  # llama/TEMPLATE: a llama-tiny source run
    "llama/zero3_fp32": "llama-masked",
}


def ds_config(tmp: Path, template: str, gas: int = 1) -> Path:
    template = template.removeprefix("llama/")
    return write_ds_config(
        tmp / f"{template}_gas{gas}.json",
        template,
        train_micro_batch_size_per_gpu=4,
        gradient_accumulation_steps=gas,
        lr=3e-3,
        scheduler_warmup_num_steps=2,
    )


@pytest.fixture(scope="module")
def sources(tmp_path_factory, small_vocab_data):
    """template -> (run folder, its train records): 2 ranks, 5 steps, a checkpoint after step 3 (lazily made)."""
    root = tmp_path_factory.mktemp("grow_sources")
    made: dict[str, tuple[Path, list[dict]]] = {}

    def get(template: str) -> tuple[Path, list[dict]]:
        if template not in made:
            out = root / template
            preset = "llama-tiny" if template.startswith("llama/") else "tiny"
            args = [*TINY, "--preset", preset, "--vocab_size", str(SMALL_VOCAB)]
            args += ["--ds_config", str(ds_config(root, template))]
            args += ["--max_steps", str(MAX_STEPS), "--save_interval", str(SAVE_STEP), "--no_final_save"]
            r = run_ranks([*args, "--out_dir", str(out)])
            assert r.returncode == 0, r.stdout[-3000:]
            made[template] = (out, read_metrics(out))
        return made[template]

    return get


def grow(*argv: str) -> int:
    return grow_main([str(a) for a in argv])


def fixed_batch(data: Path) -> tuple[torch.Tensor, torch.Tensor]:
    return TokenWindows(open_tokens(data, "train"), 32).batch(torch.arange(100, 108))


def universal_model(tag_dir: Path) -> GrowthMaskedModel:
    """A single-process fp32 GPT or Llama (eval mode, masks at the checkpoint's step) from a universal checkpoint's
    fp32."""
    return fp32_model(checkpoint.open_checkpoint(tag_dir))  # the one checkpoint-weights reader


def ds_to_universal(tag_dir: Path, out_tag_dir: Path) -> None:
    """DeepSpeed's own ``ds_to_universal`` on a native tag folder, with ``--inject_missing_state`` (DESIGN.md,
    "DeepSpeed facts") and one worker, in a process of its own (its worker pools and memory stay out of the test)."""
    cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(tag_dir),
           "--output_folder", str(out_tag_dir), "--inject_missing_state", "--num_extract_workers", "1",
           "--num_merge_workers", "1"]  # fmt: skip
    env = dict(os.environ)
    env.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert r.returncode == 0 and (out_tag_dir / "zero" / OPTIMIZER_STATE).is_file(), (r.stdout + r.stderr)[-3000:]


def same_as_ds_to_universal(native_tag: Path, ours: Path, scratch: Path) -> None:
    """Every tensor file growlm-grow wrote (fp32, exp_avg, exp_avg_sq, step) equals ds_to_universal's, dtype and
    shape included; the tied lm_head alias is DeepSpeed's working copy (bf16 runs round it), ours the fp32 master."""
    ds_to_universal(native_tag, scratch / native_tag.name)
    ds = scratch / native_tag.name / "zero"
    theirs = {p.relative_to(ds) for p in ds.rglob("*.pt")} - {Path("optimizer_state.pt")}
    mine = {p.relative_to(ours / "zero") for p in (ours / "zero").rglob("*.pt")} - {Path("optimizer_state.pt")}
    assert mine == theirs, sorted(map(str, mine ^ theirs))[:5]
    for rel in sorted(mine):
        a, b = torch.load(ds / rel, weights_only=True), torch.load(ours / "zero" / rel, weights_only=True)
        if isinstance(a, dict):
            assert a.keys() == b.keys(), rel
            a, b = a["param"], b["param"]
        assert a.dtype == b.dtype and a.shape == b.shape, rel
        assert torch.equal(a, b) or rel.parts[0] == "lm_head.weight", rel
    shutil.rmtree(scratch)


@pytest.mark.parametrize("template", list(TEMPLATES))
def test_grow_offline_keeps_loss_and_applies_adam_rule(tmp_path, sources, small_vocab_data, template):
    run, _ = sources(template)
    ckpt = run / "checkpoints"
    # reshard only (growlm-grow reads the ZeRO shards itself): exactly DeepSpeed's ds_to_universal tensors of the
    # saved (old) model, the reference for the rule; then grow that universal checkpoint (native -> grown runs in the
    # resume tests below; the rewrite is the same code)
    assert grow(ckpt, tmp_path / "old") == 0
    same_as_ds_to_universal(ckpt / "global_step3", tmp_path / "old" / "global_step3", tmp_path / "ds")
    family = TEMPLATES[template]
    assert grow(tmp_path / "old", tmp_path / "new", *GROW[family]) == 0
    old_tag, new_tag = tmp_path / "old" / "global_step3", tmp_path / "new" / "global_step3"
    assert (tmp_path / "new" / "latest").read_text() == "global_step3"
    assert not list(tmp_path.glob(".tmp-*"))

    x, y = fixed_batch(small_vocab_data)
    with torch.no_grad():
        loss_old = float(universal_model(old_tag)(x, y))
        loss_new = float(universal_model(new_tag)(x, y))
    assert abs(loss_new - loss_old) <= 1e-5, (loss_old, loss_new)  # exact operator, fp32 master weights

    # Adam moments (and weights) are the operator's rule applied to the saved tensors, element by element
    src = open_source(old_tag)
    stage = stage_from_flags(parse_args(["in", "out", *GROW[family]]), src.config, SAVE_STEP)
    plan = stage.rules(src.config, 0)
    flat = src.zero_stage == 3
    old = UniversalStore(old_tag / "zero", param_shapes(plan.old), flat=flat)
    new = UniversalStore(new_tag / "zero", param_shapes(plan.new), flat=flat)
    assert set(plan.rules) == set(new.names())
    for name, rule in plan.rules.items():
        want, got = grow_param(rule, old.read(rule.source or name), stage.optimizer), new.read(name)
        for a, b in zip(want, got, strict=True):
            assert torch.equal(a, b), name
    if not flat:  # the Adam step is carried
        embedding = plan.new.embedding_name  # transformer.wte.weight or model.embed_tokens.weight
        assert torch.equal(
            torch.load(new_tag / f"zero/{embedding}/step.pt"),
            torch.tensor(3.0).reshape(torch.load(old_tag / f"zero/{embedding}/step.pt").shape),
        )
    state = json.loads((new_tag / "growlm_state.json").read_text())
    assert state["model_config"] == plan.new.to_dict() and state["universal"] and state["global_step"] == 3
    assert state["consumed_samples"] == 3 * 8
    assert (state["growth_masks"] is not None) == family.endswith("masked")
    # the disk figure growlm-grow checks before writing (runtime.memory.universal_checkpoint_bytes) is this output's
    # size less what it leaves out, a few KiB per file (pickle framing, metadata, RNG and manifest files): 4-7% here
    size = sum(p.stat().st_size for p in (tmp_path / "new").rglob("*") if p.is_file())
    tied = not flat and plan.new.tied_head  # ZeRO-1/2 write a tied head's alias (an untied head is a parameter)
    figure = universal_checkpoint_bytes(param_count(plan.new), plan.new.vocab_size * plan.new.n_embd if tied else 0)
    assert figure <= size <= 1.1 * figure + 2**20, (figure, size)
    print(f"{template}: output {size:,} bytes, figure {figure:,}")


@pytest.mark.parametrize(
    "template, nprocs, tol",
    [
        ("zero2_fp32", (1, 2), 1e-5),
        ("zero3_fp32", (1,), 1e-5),
        ("zero1_bf16", (2,), 3e-2),
        ("llama/zero2_fp32", (1,), 1e-5),
        ("llama/zero3_fp32", (1,), 1e-5),
    ],
)
def test_grown_checkpoint_resumes_at_any_world_size(tmp_path, sources, template, nprocs, tol):
    run, ref = sources(template)
    grown = tmp_path / "grown"
    assert grow(run / "checkpoints", grown, *GROW[TEMPLATES[template]], "--rewarm_steps", "2") == 0
    state = json.loads((grown / "global_step3" / "growlm_state.json").read_text())
    sched = ScheduleState(**state["schedule"])
    # continue at the saved position: step 3 was trained at lbi 3 (a fresh schedule starts at FIRST_ITERATION 1)
    assert (sched.rewarm_start, sched.rewarm_steps, sched.last_batch_iteration) == (3, 2, 4)
    for n in nprocs:
        out = tmp_path / f"resumed{n}"
        args = [*TINY, "--ds_config", str(ds_config(tmp_path, template, gas=2 // n)), "--max_steps", str(MAX_STEPS)]
        r = run_ranks([*args, "--resume", str(grown), "--out_dir", str(out)], nproc=n)
        assert r.returncode == 0, r.stdout[-3000:]
        b = read_metrics(out)
        assert [m["step"] for m in b] == [4, 5]
        # same global batch (1 rank x 2 micro steps = 2 ranks x 1): the first step's loss is the pre-growth loss
        assert abs(b[0]["loss"] - ref[3]["loss"]) <= tol, (b[0], ref[3])
        assert b[0]["consumed_samples"] == ref[3]["consumed_samples"]  # data position carried
        assert b[0]["lr"] == pytest.approx(3e-3 * sched.ratio(3), rel=1e-9)  # re-warm: 1/2 of the placed LR
        assert b[1]["lr"] == pytest.approx(ref[4]["lr"], rel=1e-9)  # re-warm over: the schedule's LR
        assert all(m["loss"] == m["loss"] and m["loss"] < 12 for m in b)  # training continues
        # grow -> train -> save: the growth history growlm-grow wrote is carried into the next checkpoint
        saved = RunState.from_json((out / "checkpoints" / "global_step5" / "growlm_state.json").read_text())
        family = TEMPLATES[template].removeprefix("llama-")
        assert saved.growth == state["growth"] and [g["family"] for g in saved.growth] == [family]
        assert saved.growth[0]["to"] == saved.model_config.to_dict() and not saved.universal
        assert saved.version == VERSION and saved.global_step == 5


@pytest.mark.parametrize("template", ["zero1_fp32", "zero3_fp32"])  # ZeRO-2: the round trip below
def test_resharded_resume_matches_uninterrupted_and_keeps_one_adam_step(tmp_path, sources, template):
    """Reshard only (2 ranks -> universal) and resume on 2 ranks: steps 4 and 5 equal the uninterrupted run's (the
    weights alone fix step 4; step 5 needs every group's Adam step right), and every Adam step saved after step 5 is
    5 (runtime.engine.repair_adam_steps: DeepSpeed's ZeRO-3 universal loader shares one step tensor between groups)."""
    run, ref = sources(template)
    assert set(saved_adam_steps(run / "checkpoints" / "global_step3")) == {3.0}
    assert grow(run / "checkpoints", tmp_path / "universal") == 0
    out = tmp_path / "resumed"
    args = [*TINY, "--ds_config", str(ds_config(tmp_path, template)), "--max_steps", str(MAX_STEPS)]
    r = run_ranks([*args, "--resume", str(tmp_path / "universal"), "--out_dir", str(out)])
    assert r.returncode == 0, r.stdout[-3000:]
    got = read_metrics(out)
    assert [m["step"] for m in got] == [4, 5]
    for m, want in zip(got, ref[3:], strict=True):
        assert abs(m["loss"] - want["loss"]) <= 1e-6, (template, m, want)
        assert m["lr"] == pytest.approx(want["lr"], rel=1e-12)
    steps = saved_adam_steps(out / "checkpoints" / "global_step5")
    assert len(steps) >= 2 and set(steps) == {5.0}, steps  # every group, every rank: the global step


def test_reshard_round_trip_2_1_2_matches_uninterrupted(tmp_path, sources):
    run, ref = sources("zero2_fp32")
    assert grow(run / "checkpoints", tmp_path / "u2") == 0  # 2 ranks -> universal
    one = tmp_path / "one"
    args = [*TINY, "--max_steps", str(MAX_STEPS)]
    r = run_ranks(
        [
            *args,
            "--ds_config",
            str(ds_config(tmp_path, "zero2_fp32", gas=2)),
            "--save_interval",
            "1",
            "--resume",
            str(tmp_path / "u2"),
            "--out_dir",
            str(one),
        ],
        nproc=1,
    )
    assert r.returncode == 0, r.stdout[-3000:]
    a = read_metrics(one)
    assert grow(one / "checkpoints" / "global_step4", tmp_path / "u1") == 0  # 1 rank -> universal
    two = tmp_path / "two"
    r = run_ranks(
        [
            *args,
            "--ds_config",
            str(ds_config(tmp_path, "zero2_fp32")),
            "--resume",
            str(tmp_path / "u1"),
            "--out_dir",
            str(two),
        ]
    )
    assert r.returncode == 0, r.stdout[-3000:]
    b = read_metrics(two)
    assert [m["step"] for m in a] == [4, 5] and [m["step"] for m in b] == [5]
    for got, want in ((a[0], ref[3]), (a[1], ref[4]), (b[0], ref[4])):
        assert abs(got["loss"] - want["loss"]) <= 1e-6, (got, want)
        assert got["lr"] == pytest.approx(want["lr"], rel=1e-12)
        assert got["consumed_samples"] == want["consumed_samples"]
    for tag in (one / "checkpoints" / "global_step5", two / "checkpoints" / "global_step5"):
        steps = saved_adam_steps(tag)
        assert len(steps) >= 2 and set(steps) == {5.0}, (tag, steps)  # every group's Adam step is the global step


def test_export_hf_logits_equal_ours(tmp_path, sources, small_vocab_data):
    from transformers import GPT2LMHeadModel

    run, _ = sources("zero3_bf16")
    assert grow(run / "checkpoints", tmp_path / "grown", *GROW["duplicate"]) == 0
    for ckpt in (run / "checkpoints", tmp_path / "grown"):  # native (converted on the fly) and universal
        hf_dir = tmp_path / f"hf_{ckpt.parent.name}"
        assert grow(ckpt, "--export_hf", hf_dir) == 0
        assert (hf_dir / "model.safetensors").is_file() and (hf_dir / "config.json").is_file()
        for f in ("model.safetensors", "config.json"):  # the umask's mode (0644 under 022), not tempfile's 0600
            assert (hf_dir / f).stat().st_mode & 0o777 == 0o666 & ~current_umask(), f
        hf = GPT2LMHeadModel.from_pretrained(hf_dir).eval()
        x, _ = fixed_batch(small_vocab_data)
        if ckpt == tmp_path / "grown":
            ours = universal_model(ckpt / "global_step3")
        else:
            assert grow(ckpt, tmp_path / "u") == 0
            ours = universal_model(tmp_path / "u" / "global_step3")
        with torch.no_grad():
            torch.testing.assert_close(hf(x).logits, ours(x), rtol=0, atol=1e-5)


# ----- bad input: clear error, exit status 2, input untouched, nothing half-written ---------------------------------


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.bad_input
def test_bad_input_is_refused_before_writing(tmp_path, sources, capsys):
    run, _ = sources("zero2_fp32")
    ckpt = run / "checkpoints"
    before = snapshot(ckpt)

    def refused(*argv: str, match: str) -> None:
        assert grow(*argv) == 2
        err = capsys.readouterr().err
        assert match in err, err

    refused(ckpt / "global_step99", tmp_path / "o", match="no such file")  # a tag that does not exist
    refused(
        ckpt, tmp_path / "o", "--growth_plan", REPO / "growth/plans/tiny_msg.yaml", match="does not chain"
    )  # vocab 512
    refused(ckpt, tmp_path / "o", "--zero_stage", "3", *GROW["masked"], match="do not cross")
    refused(ckpt, ckpt / "global_step3" / "inside", match="overlaps the input")
    refused(ckpt, run, match="overlaps the input")
    (tmp_path / "exists").mkdir()
    refused(ckpt, tmp_path / "exists", match="already exists")
    assert not list(tmp_path.glob("o*")) and not list(tmp_path.glob(".tmp-*"))

    # stage 0 (DESIGN.md, "Checkpoint failure kinds: no universal checkpoint at stage 0"): refused with the supported
    # stages named
    z0 = tmp_path / "z0"
    shutil.copytree(ckpt / "global_step3", z0)
    (z0 / "growlm_manifest.json").unlink()
    st = json.loads((z0 / "growlm_state.json").read_text())
    (z0 / "growlm_state.json").write_text(json.dumps({**st, "zero_stage": 0}))
    refused(z0, tmp_path / "o", match="supports ZeRO stages 1, 2, 3 only")

    # a run shorter than its warm-up (train.py accepts it: "auto" total_num_steps 5 < warmup 20): the flag to fix it
    short = tmp_path / "short"
    shutil.copytree(ckpt / "global_step3", short)
    (short / "growlm_manifest.json").unlink()
    st = json.loads((short / "growlm_state.json").read_text())
    st["ds_config"]["scheduler"]["params"]["warmup_num_steps"] = 20
    (short / "growlm_state.json").write_text(json.dumps(st))
    assert grow(short, tmp_path / "o", *GROW["masked"]) == 2
    assert one_error_line(capsys.readouterr().err, "growlm-grow") == (
        "the LR schedule growth would place has total_num_steps 5 < warmup_num_steps 20 (the run trained shorter "
        "than its warm-up), which growth cannot place; give --total_num_steps N with N >= 20 (the length of the run "
        "that will continue), or a shorter warmup_num_steps"
    )

    # a truncated shard: the manifest catches it (here and in train.py's read_state) ...
    bad = tmp_path / "bad"
    shutil.copytree(ckpt / "global_step3", bad)
    shard = bad / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    shard.write_bytes(shard.read_bytes()[:1000])
    refused(bad, tmp_path / "o", match="truncated")
    with pytest.raises(checkpoint.CheckpointError, match="truncated"):
        checkpoint.read_state(bad.parent, bad.name)
    # ... and without a manifest the pickle check, which runs before DeepSpeed's loaders, names the file
    (bad / "growlm_manifest.json").unlink()
    refused(bad, tmp_path / "o", match=f"{shard.name} cannot be read")
    shard.unlink()  # a missing shard
    refused(bad, tmp_path / "o", match="lacks zero_pp_rank_1")
    assert not list(tmp_path.glob("o*")) and not list(tmp_path.glob(".tmp-*"))
    assert snapshot(ckpt) == before  # the input is untouched


@pytest.mark.bad_input
def test_overwrite_mixed_file_and_masks_in_ramp(tmp_path, sources, capsys):
    run, _ = sources("zero2_fp32")
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale").write_text("x")  # a file growlm-grow did not write: --overwrite refuses and keeps it
    assert grow(run / "checkpoints", out, *GROW["masked"], "--overwrite") == 2
    assert "is not a growlm-grow output" in capsys.readouterr().err and (out / "stale").read_text() == "x"
    (out / "stale").unlink()  # an empty folder may be replaced
    assert grow(run / "checkpoints", out, *GROW["masked"], "--overwrite") == 0
    assert (out / "latest").is_file() and (out / "latest_universal").is_file()
    assert not list(tmp_path.glob(".tmp-*")) and not list(tmp_path.glob(".old-*"))

    # a growth while the masks still ramp, and an HF export of a masked model: refused
    assert grow(out, tmp_path / "again", "--n_layer", "4") == 2
    assert "mask ramp is still running" in capsys.readouterr().err
    assert grow(out, "--export_hf", tmp_path / "hf") == 2
    assert "a masked model is not a transformers" in capsys.readouterr().err

    # a tensor file swapped in from another checkpoint (same size): the manifest names it
    tag = out / "global_step3"
    a, b = tag / "zero/transformer.h.0.ln_1.weight/fp32.pt", tag / "zero/transformer.h.0.ln_2.weight/fp32.pt"
    a.write_bytes(b.read_bytes())
    with pytest.raises(checkpoint.CheckpointError, match="sha256"):
        checkpoint.read_state(out, "global_step3")
    # a corrupt tensor file without a manifest: the store names the file
    (tag / "growlm_manifest.json").unlink()
    a.write_bytes(b"not a tensor")
    assert grow(out, tmp_path / "again") == 2
    assert "transformer.h.0.ln_1.weight/fp32.pt cannot be read" in capsys.readouterr().err


def test_a_growth_shows_its_progress_on_a_terminal_only(tmp_path, sources, capsys):
    """The progress bar (growth.offline.pipeline.ProgressStore) counts parameters done of all and the bytes written
    of the grown model's total (fp32 weight and both moments); on a stderr that is not a terminal it stays silent."""
    run, _ = sources("zero2_fp32")
    src = open_source(run / "checkpoints")
    stage = stage_from_flags(parse_args(["in", "out", *GROW["masked"]]), src.config, SAVE_STEP)
    grow_checkpoint(src, tmp_path / "shown", stage, progress=True, log=lambda *_: None)
    err = capsys.readouterr().err
    n, nbytes = len(param_shapes(stage.target)), 12 * param_count(stage.target)
    last = err.replace("\r", "\n").strip().splitlines()[-1]
    assert last.startswith("growlm-grow: 100%") and f"{n}/{n} parameters" in last, last
    size = tqdm.format_sizeof(nbytes, divisor=1024)
    assert f"| {size}/{size} [" in last, (last, nbytes)
    lines: list[str] = []
    grow_checkpoint(src, tmp_path / "quiet", stage, log=lines.append)  # stderr captured: not a terminal
    assert capsys.readouterr().err == ""
    # the resume it suggests names the source's own config: the default (bf16) would resume an fp32 run in bf16
    assert f"`train.py --resume {tmp_path / 'quiet'} --ds_config ds_configs/zero2_fp32.json`" in lines[-1]
