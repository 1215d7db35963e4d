"""The steps of growlm-gpu-check's sections (``eval.bench.gpu_check`` runs each in its own process and says what
each checks): env, train, offline, export, throughput, compile and fp16 here, ranks and offload in
``gpu_check_ranks``; each records what it measures and checks on a ``gpu_check_runs.Runner`` as it goes.
"""

from __future__ import annotations

import json
import math
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from growlm.eval.bench import throughput as bench
from growlm.eval.bench.gpu_check_ranks import section_offload, section_ranks
from growlm.eval.bench.gpu_check_runs import Runner, check_run, train_run
from growlm.growth.offline.cli import main as grow_main
from growlm.model.config import ModelConfig, from_preset, param_count
from growlm.model.layers import attention_kernel
from growlm.runtime.machine import device_description
from growlm.runtime.metrics_file import read_records

# |compiled loss - eager loss| allowed at every step: inductor fuses and reorders float operations
COMPILE_TOL = {"fp32": 1e-3, "bf16": 5e-2, "fp16": 1e-2}

BENCH_FIELDS = ("name", "precision", "zero_stage", "micro_batch", "tokens_per_s", "model_flops_per_s", "mfu",
                "step_time_s_median", "activation_recomputation", "peak_device_bytes_rank0",
                "peak_rss_bytes_per_rank", "recompute_memory_saved_bytes", "skipped_steps")  # fmt: skip


def fit_micro_batch(
    cfg: ModelConfig, seq_len: int, device_bytes: int, *, recompute: bool, fraction: float = 0.85
) -> int:
    """The largest power-of-two micro batch whose estimated peak memory fits ``fraction`` of one device (ZeRO-1 on
    one rank, bf16/fp16 with fp32 Adam).

    Model state: 16 bytes per parameter (2 + 2 half weights and gradients, 4 + 4 + 4 fp32 master, exp_avg,
    exp_avg_sq; Rajbhandari et al. 2020, ZeRO, section 3.1). Activations per sequence and layer: 34 T d bytes
    (Korthikanti et al. 2022, arXiv 2205.05198, eq. 1, without its 5 a T^2 score term: flash attention keeps none);
    with recomputation each layer keeps only its 2 T d-byte input, plus one layer's 34 T d while it recomputes. The
    LM head adds 12 T V bytes per sequence at the backward peak (half logits, their fp32 copy for the cross entropy,
    its fp32 gradient, the half gradient of the logits).

    Returns:
        The micro batch (at least 1).
    """
    state = 16 * param_count(cfg)
    layer = 34 * seq_len * cfg.n_embd
    acts = (cfg.n_layer * 2 * seq_len * cfg.n_embd + layer) if recompute else cfg.n_layer * layer
    per_seq = acts + 12 * seq_len * cfg.vocab_size
    fit = max(1, int((fraction * device_bytes - state) // per_seq))
    return 2 ** int(math.log2(fit))


def environment(cuda: bool) -> dict[str, Any]:
    """Versions and the device (the env section): CUDA device 0 when ``cuda``, else the CPU."""
    import deepspeed  # lazy: deepspeed picks its accelerator at import (section_main sets it first)

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
    }
    if cuda:
        props = torch.cuda.get_device_properties(0)
        env.update(device=props.name, device_memory_bytes=props.total_memory, capability=f"{props.major}.{props.minor}")
        try:
            q = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
            env["driver"] = subprocess.run(q, capture_output=True, text=True, timeout=30).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            env["driver"] = None
        env["attention"] = {p: attention_kernel(64, getattr(torch, n), "cuda") for p, n in
                            (("bf16", "bfloat16"), ("fp16", "float16"))}  # fmt: skip
    else:
        env.update(device=device_description("cpu"), device_memory_bytes=None, driver=None)
        env["attention"] = {"fp32": attention_kernel(64, torch.float32, "cpu")}
    return env


def section_env(r: Runner) -> None:
    """env: versions and the device."""
    env = environment(cuda=not r.smoke)
    r.record("environment", env)
    r.check("device and versions", bool(env["device"] and env["torch"] and env["deepspeed"]),
            f"{env['device']}; torch {env['torch']}, DeepSpeed {env['deepspeed']}, CUDA {env['cuda']}")  # fmt: skip


def section_train(r: Runner) -> None:
    """train: ZeRO 1, 2 and 3 in the mode's precision, each growing live twice."""
    for stage in (1, 2, 3):
        name = f"train-zero{stage}-{r.s.precision}"
        r.record(name, train_run(r, name, stage, r.s.precision))


def source_checkpoint(r: Runner, name: str) -> Path | None:
    """A ZeRO-2 checkpoint of the mode's source model after ``source_steps`` steps (WORK/NAME/checkpoints), or None
    when the run failed (a failed check)."""
    args = [*r.s.source_shape, "--max_steps", str(r.s.source_steps)]
    rc, run, error, wall = r.train(name, [*args, "--ds_config", str(r.ds_config(name, 2, r.s.precision))])
    r.record(name, {"exit_status": rc, "wall_s": wall})
    ok = r.check(f"{name}: ZeRO-2 checkpoint after {r.s.source_steps} steps", rc == 0,
                 f"exit status {rc}" + (f": {error}" if error else ""))  # fmt: skip
    return run / "checkpoints" if ok else None


def section_offline(r: Runner) -> None:
    """offline: growlm-grow of a ZeRO-2 checkpoint (masked, one more layer, universal) and its resume."""
    src = source_checkpoint(r, "offline-source")
    if src is None:
        return
    shape = dict(zip(r.s.source_shape[::2], r.s.source_shape[1::2], strict=True))
    n_layer = int(shape.get("--n_layer", from_preset(shape["--preset"]).n_layer)) + 1
    grown = r.work / "grown"
    t = time.monotonic()
    rc = grow_main([str(src), str(grown), "--family", "masked", "--n_layer", str(n_layer), "--ramp_steps", "2"])
    r.record("grow_s", time.monotonic() - t)
    r.drop(src.parent)
    if not r.check("growlm-grow (masked, +1 layer, universal)", rc == 0, f"exit status {rc}"):
        return
    name = "resume-grown"
    args = ["--resume", str(grown), "--max_steps", str(r.s.source_steps + 2), "--no_final_save"]
    rc, run, error, wall = r.train(name, [*args, "--ds_config", str(r.ds_config(name, 2, r.s.precision))])
    losses = [x["loss"] for x in read_records(run, "train")] if rc == 0 else []
    r.record("resume", {"exit_status": rc, "losses": losses, "wall_s": wall})
    r.check("the grown checkpoint resumes", rc == 0 and len(losses) == 2 and all(map(math.isfinite, losses)),
            f"exit status {rc}" + (f": {error}" if error else f", losses {losses}"))  # fmt: skip
    r.drop(grown, run)


def section_export(r: Runner) -> None:
    """export: export -> --init_from for one step at LR 0 without weight decay -> export; the weights must come back
    bit for bit."""
    src = source_checkpoint(r, "export-source")
    if src is None:
        return
    a, b = r.work / "hf-a", r.work / "hf-b"
    rc = grow_main([str(src), "--export_hf", str(a)])
    r.drop(src.parent)
    if not r.check("export to transformers", rc == 0, f"exit status {rc}"):
        return
    name = "init-from"
    cfg = r.ds_config(name, 2, r.s.precision, lr=0.0, weight_decay=0.0)
    args = ["--init_from", str(a), "--max_steps", "1", "--ds_config", str(cfg)]
    rc, run, error, wall = r.train(name, args)
    rc2 = grow_main([str(run / "checkpoints"), "--export_hf", str(b)]) if rc == 0 else None
    r.drop(run)
    r.record("init_from", {"exit_status": rc, "export_exit_status": rc2, "wall_s": wall})
    if r.check("--init_from and export again", rc == 0 and rc2 == 0,
               f"exit status {rc}" + (f": {error}" if error else "") + f", export {rc2}"):  # fmt: skip
        wa, wb = (load_file(str(x / "model.safetensors")) for x in (a, b))
        worst = (
            max(float((wa[k].float() - wb[k].float()).abs().max()) for k in wa) if sorted(wa) == sorted(wb) else None
        )
        r.record("round_trip_max_abs_diff", worst)
        r.check("export -> --init_from -> export is exact", worst == 0.0, f"max |diff| {worst}")
    r.drop(a, b)


def section_throughput(r: Runner) -> None:
    """throughput: growlm-bench (one rank, ZeRO-1, with and without activation checkpointing) and the baseline.
    Its outputs (a JSON record per configuration as it finishes, bench.json, bench.md) go to
    OUT/<device>/throughput/bench-PRESET."""
    preset, p = r.s.bench_preset, r.s.precision
    cfg = from_preset(preset)
    if r.smoke:
        micro = 4
    else:
        micro = fit_micro_batch(cfg, r.s.bench_seq_len, torch.cuda.get_device_properties(0).total_memory,
                                recompute=False)  # fmt: skip
    name = f"bench-{preset}"
    out = r.folder / "throughput" / name
    shutil.rmtree(out, ignore_errors=True)  # an earlier run's records
    argv = ["--preset", preset, "--seq_len", str(r.s.bench_seq_len), "--world_size", "1", "--zero_stage", "1",
            "--precision", p, "--micro_batch", str(micro), "--max_steps", str(r.s.bench_steps),
            "--skip_steps", str(r.s.bench_skip), "--activation_checkpointing", "both", "--out", str(out)]  # fmt: skip
    argv += ["--threads_per_rank", "1"] if r.smoke else []
    argv += ["--data", r.data] if r.data else []
    rc = bench.main(argv)
    records = json.loads((out / "bench.json").read_text()) if (out / "bench.json").is_file() else []
    r.record(name, [{k: rec.get(k) for k in (*BENCH_FIELDS, "failed", "error")} for rec in records])
    r.check(f"{name} (micro batch {micro})", rc == 0, f"growlm-bench exit status {rc}, {len(records)} record(s)")
    for rec in records:
        if rec.get("failed"):
            r.check(f"{name}: {rec['name']}", False, rec["error"])


def section_compile(r: Runner) -> None:
    """compile: train.py --compile (GPU: one live growth) against the same run in eager mode; skipped with train.py's
    reason where it refuses --compile (exit status 2)."""
    p, grow = r.s.precision, r.s.compile_grow
    args = ["--ds_config", str(r.ds_config("compile", 2, p)), "--max_steps", str(r.s.compile_steps), "--no_final_save"]
    args += ["--growth_plan", str(r.plan("compile", grow, None))] if grow else list(r.s.compile_shape)
    name = f"compile-zero2-{p}"
    rc, run, error, wall = r.train(name, [*args, "--compile"])
    if rc == 2 and error:
        r.drop(run)
        r.skip(error)
        return
    rec: dict[str, Any] = {"exit_status": rc, "wall_s": wall}
    if r.check(f"{name} ran", rc == 0, f"exit status {rc}" + (f": {error}" if error else "")):
        rec.update(check_run(r, name, run, p, growths=1 if grow else 0))
    r.drop(run)
    r.record(name, rec)
    eager_name = f"eager-zero2-{p}"
    rc, run, error, wall = r.train(eager_name, args)
    eager: dict[str, Any] = {"exit_status": rc, "wall_s": wall}
    if r.check(f"{eager_name} ran", rc == 0, f"exit status {rc}" + (f": {error}" if error else "")):
        eager.update(check_run(r, eager_name, run, p, growths=1 if grow else 0))
    r.drop(run)
    r.record(eager_name, eager)
    if "losses" in rec and "losses" in eager and len(rec["losses"]) == len(eager["losses"]):
        worst = max(abs(a - b) for a, b in zip(rec["losses"], eager["losses"], strict=True))
        rec["step_time_vs_eager"] = rec["step_time_s_median"] / eager["step_time_s_median"]
        r.record(name, rec)
        r.check(f"{name}: the eager run's losses", worst <= COMPILE_TOL[p],
                f"max |diff| {worst:.2e} (tolerance {COMPILE_TOL[p]:g}); median step time "
                f"{rec['step_time_vs_eager']:.2f}x of eager (the first step, which compiles, left out: "
                f"{rec['first_step_s']:.1f} s)")  # fmt: skip


def section_fp16(r: Runner) -> None:
    """fp16: ZeRO-2 in fp16 growing live twice; the loss scaler's overflow-skipped steps counted."""
    device, avail = bench.available_precisions()
    if "fp16" not in avail:
        r.skip(f"this device ({device}) does not train fp16; available precisions: {', '.join(avail)}")
        return
    name = "train-zero2-fp16"
    rec = train_run(r, name, 2, "fp16")
    r.record(name, rec)
    if "losses" in rec:
        skipped, n = rec["skipped_steps"], len(rec["losses"])
        r.check(f"{name} loss scaler", skipped is not None and skipped < n,
                f"{skipped} overflow-skipped step(s) of {n}")  # fmt: skip


SECTION_FNS = {"env": section_env, "train": section_train, "offline": section_offline, "export": section_export,
               "throughput": section_throughput, "ranks": section_ranks, "compile": section_compile,
               "fp16": section_fp16, "offload": section_offload}  # fmt: skip
