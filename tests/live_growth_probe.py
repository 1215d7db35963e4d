"""Run by tests/distributed/test_live_growth.py as every rank of a real 2-rank job: train a tiny GPT (or Llama) with
DeepSpeed, grow the live engine, and record what the new engine holds against what the growth plan says it must hold.

    python tests/live_growth_probe.py DS_CONFIG FAMILY OUT_JSON [--force-cpu-fp16]

FAMILY: masked, duplicate or depth (GPT-2), or llama-masked, llama-duplicate, llama-duplicate-tied (Llama; the
last with tied embeddings), or the same with qwen2- (Qwen 2: the Llama shape with q/k/v biases).

Rank 0 writes OUT_JSON with: loss on a fixed batch before/after growth; per parameter the largest difference
between the new engine's gathered weight / exp_avg / exp_avg_sq and the plan's rule applied to the gathered old
state; Adam step, global step, LR of the first post-growth step and the expected one; hooks left on the old module;
fp32 master vs working copy after a training step; whether new entries moved; losses of the continued training;
the fp16 loss scaler before/after.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import replace
from pathlib import Path

from growlm.runtime.dist import init_distributed  # noqa: E402

info = init_distributed(120)

import deepspeed.utils as dsu  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from deepspeed.accelerator import get_accelerator  # noqa: E402

from growlm.growth.live.grow import EngineStore, adam_step_of, grow_engine  # noqa: E402
from growlm.growth.ops import make_rules  # noqa: E402
from growlm.growth.ops.apply import OptimizerPolicy, grow_param  # noqa: E402
from growlm.growth.ops.schedule_rule import ScheduleRule, place_schedule  # noqa: E402
from growlm.model.config import GPTConfig, LlamaConfig  # noqa: E402
from growlm.model.qwen2.config import Qwen2Config  # noqa: E402
from growlm.runtime.engine import build_engine  # noqa: E402
from growlm.runtime.schedule import engine_schedule, start_schedule  # noqa: E402

ds_path, family, out_path = sys.argv[1:4]
fp16_native = bool(get_accelerator().is_fp16_supported())
if "--force-cpu-fp16" in sys.argv:  # DeepSpeed refuses fp16 on this CPU; the fp16 code path itself runs
    type(get_accelerator()).is_fp16_supported = lambda self: True

ds_cfg = json.loads(Path(ds_path).read_text())
ds_cfg["scheduler"]["params"].update(total_num_steps=40, warmup_num_steps=2)
zero_stage = ds_cfg["zero_optimization"]["stage"]
old_cfg = GPTConfig(n_layer=1, n_embd=32, n_head=2, n_positions=16, vocab_size=97)
llama_shaped = family.startswith(("llama-", "qwen2-"))
if llama_shaped:  # the Llama family (or Qwen 2, with q/k/v biases): GQA (2 query heads, 1 key/value head), head_dim 16
    tied = family.endswith("-tied")
    cls = Qwen2Config if family.startswith("qwen2-") else LlamaConfig
    old_cfg = cls(
        n_layer=1, n_embd=32, n_head=2, n_kv_head=1, n_inner=64, n_positions=16, vocab_size=97, rope_theta=1e4,
        rms_norm_eps=1e-5, tie_word_embeddings=tied,
    )  # fmt: skip
    family = "llama-" + family.split("-", 1)[1]
if family == "llama-masked":  # every dimension at once: width to no multiple, heads and key/value heads, FFN, depth
    new_cfg = replace(old_cfg, n_layer=2, n_embd=48, n_head=4, n_kv_head=2, n_inner=100)
    plan = make_rules(old_cfg, new_cfg, "masked", seed=3, ramp_steps=3)
    policy = OptimizerPolicy(moments="carry", fresh_exp_avg_sq="mean")
elif family.startswith("llama-duplicate"):  # exact: width x2 (4 heads, 2 kv), then heads 8 over the same 2 kv heads
    # (4 query heads per key/value head where there were 2: new heads join the old groups), FFN, depth x2; the
    # copies' symmetry broken by zero-sum noise (exact at growth)
    new_cfg = replace(old_cfg, n_layer=2, n_embd=64, n_head=8, n_kv_head=2, n_inner=160)
    plan = make_rules(old_cfg, new_cfg, "duplicate", symmetry="noise", seed=3)
    policy = OptimizerPolicy(moments="carry")
elif family == "masked":  # every dimension at once, FFN to a size that is no multiple of the old one
    new_cfg = GPTConfig(n_layer=2, n_embd=48, n_head=3, n_inner=160, n_positions=16, vocab_size=97)
    plan = make_rules(old_cfg, new_cfg, "masked", seed=3, ramp_steps=3)
    policy = OptimizerPolicy(moments="carry", fresh_exp_avg_sq="mean")
elif family == "depth":  # depth x2 alone: at ZeRO-3 every rule is applied from the rank's own partition
    new_cfg = GPTConfig(n_layer=2, n_embd=32, n_head=2, n_positions=16, vocab_size=97)
    plan = make_rules(old_cfg, new_cfg, "duplicate")
    policy = OptimizerPolicy(moments="carry")
else:  # staged training: width x2 then depth x2 (exact)
    new_cfg = GPTConfig(n_layer=2, n_embd=64, n_head=4, n_positions=16, vocab_size=97)
    plan = make_rules(old_cfg, new_cfg, "duplicate")
    policy = OptimizerPolicy(moments="carry")
# after 3 steps lbi is 4; constant_op 10 puts the target position at round(0.4) = 0, an LR of 0, unless placement
# keeps it at FIRST_ITERATION: the first post-growth LR (re-warm 1/2 included) must still be > 0
rule = ScheduleRule(kind="target", constant_op=10.0, rewarm_steps=2)

torch.manual_seed(0)
engine = build_engine(old_cfg, None, ds_cfg)
start_schedule(engine)  # as train.py: step 1 trains at the warm-up's first non-zero LR
gen = torch.Generator().manual_seed(100 + info.rank)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(0, 97, (4, 17), generator=gen)
    return x[:, :-1], x[:, 1:]


def train_step(e) -> float:
    x, y = batch()
    loss = e(x, y)
    e.backward(loss)
    e.step()
    e.module.set_growth_step(e.global_steps)  # the mask ramp, as train.py moves it
    t = loss.detach().double().reshape(1)
    dist.all_reduce(t)
    return float(t) / info.world_size


def eval_loss(e, x, y) -> float:
    e.eval()
    with torch.no_grad():
        t = e(x, y).detach().double().reshape(1)
    e.train()
    dist.all_reduce(t)
    return float(t) / info.world_size


for _ in range(3):
    train_step(engine)
step = engine.global_steps
old_state = {n: s for n, s in ((n, EngineStore(engine).read(n)) for n in EngineStore(engine).names())}
expected = {name: grow_param(r, old_state[r.source or name], policy) for name, r in plan.rules.items()}
fixed = batch()
loss_before = eval_loss(engine, *fixed)
scaler_fields = ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis")
scaler = getattr(engine.optimizer, "loss_scaler", None)
scaler_before = {k: getattr(scaler, k, None) for k in scaler_fields} if scaler is not None else None
expected_sched = place_schedule(engine_schedule(engine), step, rule)
adam_before = adam_step_of(engine)
old_module = engine.module

result = grow_engine(
    engine,
    plan,
    functools.partial(build_engine, ds_config=ds_cfg, partitioned=zero_stage == 3),
    policy=policy,
    schedule_rule=rule,
    ramp_steps=3,
)
del engine
new = result.engine
loss_after = eval_loss(new, *fixed)
store = EngineStore(new)
diffs = {}
for name in store.names():
    got = store.read(name)
    want = expected[name]
    diffs[name] = [float((g - w).abs().max()) if g.numel() else 0.0 for g, w in zip(got, want, strict=True)]
hooks_left = sum(
    len(m._forward_pre_hooks) + len(m._forward_hooks) + len(m._backward_hooks) for m in old_module.modules()
)
new_scaler = getattr(new.optimizer, "loss_scaler", None)
scaler_after = {k: getattr(new_scaler, k, None) for k in scaler_fields} if new_scaler is not None else None
first_lr = new.get_lr()[0]
adam_after, global_after = adam_step_of(new), new.global_steps
peak_lr = ds_cfg["optimizer"]["params"]["lr"]

# continue: the grown values must survive steps (master and working copy agree) and new entries must move
before_steps = {n: store.read(n).weight for n in store.names()}
losses = [train_step(new) for _ in range(4)]
master_vs_working = {}
moved = {}
for name, p in new.module.named_parameters():
    master = dsu.safe_get_full_fp32_param(p)
    if master is None:  # stage 0: the optimizer steps p itself (fp32) or an fp32 master (bf16)
        master = EngineStore(new).read(name).weight
    if hasattr(p, "ds_id"):
        import deepspeed

        with deepspeed.zero.GatheredParameters([p]):
            working = p.detach().float().clone()
    else:
        working = p.detach().float().clone()
    master = master.detach().float().cpu().reshape(working.shape)
    master_vs_working[name] = float((master.to(p.dtype).float() - working).abs().max())
    moved[name] = float((master - before_steps[name]).abs().max())

if info.rank == 0:
    Path(out_path).write_text(
        json.dumps(
            {
                "zero_stage": zero_stage,
                "dtype": str(next(new.module.parameters()).dtype),
                "step": step,
                "loss_before": loss_before,
                "loss_after": loss_after,
                "diffs": diffs,
                "adam_step_before": adam_before,
                "adam_step_after": adam_after,
                "global_steps_after": global_after,
                "first_lr": first_lr,
                "expected_first_lr": peak_lr * expected_sched.ratio(step),
                "hooks_left_on_old_module": hooks_left,
                "scaler_before": scaler_before,
                "scaler_after": scaler_after,
                "fp16_supported_natively": fp16_native,
                "losses_after_growth": losses,
                "master_vs_working": master_vs_working,
                "moved": moved,
                "masks_left": new.module.growth_masks is not None,
                "bytes_moved": result.bytes_moved,
                "old_params": sum(x.weight.numel() for x in old_state.values()),
                "collectives": result.collectives,
                "build_seconds": result.build_seconds,
            }
        )
    )
dist.barrier()
