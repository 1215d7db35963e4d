"""Training dynamics of the growth operators on a tiny GPT, single process, CPU (DESIGN.md, "Growth dynamics"):

    python -m growlm.eval.bench.operator_dynamics --data ~/.cache/growlm/bpe4096 --out dynamics.json

1. One-step logit ratio (eval/bench/dynamics.py ``logit_step_ratio``) per duplication operator, with the
   dynamics-preserving moment rules ("after") and the rules before them ("before": exp_avg_sq by the gradient rule
   alone, so entries that are 0 at growth start at 0, split copies and ln_f are not rescaled).
2. Copy divergence of the width halves (wte, wpe, residual stream) after 20 / 60 / 160 AdamW steps for the block
   pattern, the split, and the 'noise' symmetry breaker.
3. Masked ramp: the loss bump of ramping the masks 0 -> 1 without training, and with training the worst loss rise
   (over the loss at growth) of a 20-step ramp against the default ramp_frac 0.25 of the remaining run.

Model: 2 layers, n_embd 32, 4 heads, 64 positions, the data's vocabulary; AdamW lr 1e-3 (constant), betas (0.9, 0.95),
weight decay 0.1, micro batch 8 x 64 tokens. Numbers are losses in nats per token and dimensionless ratios.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path

import torch

from growlm.data.tokens import cache_dir, open_tokens
from growlm.eval.bench.dynamics import (
    TokenBatches,
    clone_training,
    grow_trained,
    logit_change,
    ramp_loss_bump,
    train_steps,
    width_divergence,
)
from growlm.growth.ops import make_rules
from growlm.growth.ops.common import DEFAULT_RAMP_FRAC
from growlm.growth.ops.rules import RuleSet
from growlm.growth.ops.single_process import make_optimizer
from growlm.model.config import GPTConfig
from growlm.model.gpt2.model import GPT
from growlm.runtime.commands import HelpFormatter, add_version

HP = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
DUP_CASES = {
    "width-block": (dict(n_embd=64, n_head=8), {}),
    "width-split": (dict(n_embd=64, n_head=8), {"pattern": "split"}),
    "width-noise": (dict(n_embd=64, n_head=8), {"symmetry": "noise"}),
    "depth-interleave": (dict(n_layer=4), {}),
    "depth-stack": (dict(n_layer=4), {"layer_order": "stack"}),
    "width+depth": (dict(n_embd=64, n_head=8, n_layer=4), {}),
    "ffn-net2net": (dict(n_inner=200), {}),
}
DIV_CASES = {"block": {}, "split": {"pattern": "split"}, "noise": {"symmetry": "noise"},
             "split+noise": {"pattern": "split", "symmetry": "noise"}}  # fmt: skip


def batches_of(data: Path, b: int = 8, t: int = 64) -> tuple[TokenBatches, int]:
    """Random (B, T+1) training windows of a growlm token folder's train split, and its vocabulary size."""
    meta = json.loads((data / "meta.json").read_text())
    return TokenBatches(open_tokens(data, "train"), b, t), int(meta["vocab_size"])


def train(model: GPT, opt: torch.optim.Optimizer, data: TokenBatches, seeds: range) -> None:
    """One AdamW step per seed's batch (eval.bench.dynamics.train_steps)."""
    train_steps(model, opt, (data(s) for s in seeds))


def grow(model: GPT, opt: torch.optim.Optimizer, plan: RuleSet) -> tuple[GPT, torch.optim.Optimizer]:
    """The grown model and its AdamW, from copies (eval.bench.dynamics.grow_trained)."""
    return grow_trained(model, opt, plan, HP)


def old_rules(plan: RuleSet) -> RuleSet:
    """The duplication rules before the dynamics-preserving moment rules: exp_avg_sq by the gradient rule alone,
    i.e. the square of the exp_avg map applied to sqrt(exp_avg_sq) (0 where exp_avg is 0; no / P^2, no ln_f or
    Net2Net c_proj rescaling)."""
    rules = {n: replace(r, exp_avg_sq=lambda v, r=r: r.exp_avg(v.sqrt()).square()) for n, r in plan.rules.items()}
    return replace(plan, rules=rules)


def ratios(small: GPT, opt: torch.optim.Optimizer, data: TokenBatches) -> dict[str, dict[str, float]]:
    """Per duplication operator: the one-step logit ratio with the old and the new moment rules."""
    x, probe = data(10_000), data(20_000)[:, :-1]
    d_small = logit_change(*clone_training(small, opt), x, probe)
    out = {}
    for name, (target, opts) in DUP_CASES.items():
        plan = make_rules(small.config, replace(small.config, **target), "duplicate", **opts)
        out[name] = {
            "before": logit_change(*grow(small, opt, old_rules(plan)), x, probe) / d_small,
            "after": logit_change(*grow(small, opt, plan), x, probe) / d_small,
        }
    return out


def divergence(small: GPT, opt: torch.optim.Optimizer, data: TokenBatches, steps: tuple[int, ...]) -> dict:
    """Per width symmetry option: copy divergence of wte, wpe and the residual stream after each of ``steps``."""
    probe = data(30_000)[:, :-1]
    wide = replace(small.config, n_embd=2 * small.config.n_embd, n_head=2 * small.config.n_head)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, opts in DIV_CASES.items():
        big, big_opt = grow(small, opt, make_rules(small.config, wide, "duplicate", **opts))
        done, out[name] = 0, {}
        for n in steps:
            train(big, big_opt, data, range(50_000 + done, 50_000 + n))
            done = n
            d = width_divergence(big, probe)
            out[name][str(n)] = {k: d[k] for k in ("wte", "wpe", "residual")}
    return out


def ramp(small: GPT, opt: torch.optim.Optimizer, data: TokenBatches, remaining: int) -> dict:
    """Masked width growth (n_embd x2): loss bump of the ramp without training (at mask values 0.25 .. 1), and with
    training the probe loss 10 / 20 / 30 / 60 / H steps after growth (H = the longest ramp + 10) for a 20-step ramp,
    for DEFAULT_RAMP_FRAC of ``remaining`` steps, and for the small model trained on without growing."""
    probe = data(40_000)
    wide = replace(small.config, n_embd=2 * small.config.n_embd, n_head=2 * small.config.n_head)
    lengths = {"ramp_20": 20, "ramp_frac_default": max(1, round(DEFAULT_RAMP_FRAC * remaining))}
    horizon = max(lengths.values()) + 10
    marks = sorted({10, 20, 30, 60, horizon} - {m for m in (10, 20, 30, 60) if m > horizon})

    def curve(model: GPT, model_opt: torch.optim.Optimizer) -> dict[str, float]:
        out = {}
        for s in range(1, horizon + 1):
            train(model, model_opt, data, range(60_000 + s, 60_001 + s))
            if s in marks:
                with torch.no_grad():
                    out[str(s)] = model.eval()(probe[:, :-1], targets=probe[:, 1:]).item()
        return out

    with torch.no_grad():
        res: dict[str, object] = {"loss_at_growth": small.eval()(probe[:, :-1], targets=probe[:, 1:]).item()}
    for name, r in lengths.items():
        big, big_opt = grow(small, opt, make_rules(small.config, wide, "masked", ramp_steps=r))
        if name == "ramp_20":
            values = (0.25, 0.5, 0.75, 1.0)
            res["bump_no_training"] = dict(zip(map(str, values), ramp_loss_bump(big, probe, values), strict=True))
        res[name] = {"ramp_steps": r, "loss_after_steps": curve(big, big_opt)}
    res["no_growth"] = {"loss_after_steps": curve(*clone_training(small, opt))}
    return res


def main() -> None:
    """Run the three measurements and write them (with the command) as JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.prog = "python -m growlm.eval.bench.operator_dynamics"
    ap.formatter_class = HelpFormatter  # every flag's default in --help
    add_version(ap)
    ap.add_argument("--data", type=Path, default=cache_dir() / "bpe4096", help="growlm token folder")
    ap.add_argument("--out", type=Path, help="JSON file to write")
    ap.add_argument("--small_steps", type=int, default=40, help="AdamW steps of the small model before growth")
    ap.add_argument("--total_steps", type=int, default=240, help="the run length, for the ramp's remaining steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", choices=("ratio", "divergence", "ramp"), help="run one measurement only")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    data, vocab = batches_of(args.data)
    small = GPT(GPTConfig(n_layer=2, n_embd=32, n_head=4, n_positions=64, vocab_size=vocab))
    opt = make_optimizer(small, HP)
    train(small, opt, data, range(args.small_steps))
    res: dict[str, object] = {
        "command": shlex.join(["python", "-m", "growlm.eval.bench.operator_dynamics", *sys.argv[1:]]),
        "small_steps": args.small_steps,
    }
    if args.only in (None, "ratio"):
        res["logit_step_ratio"] = ratios(small, opt, data)
    if args.only in (None, "divergence"):
        res["copy_divergence"] = divergence(small, opt, data, (20, 60, 160))
    if args.only in (None, "ramp"):
        res["ramp"] = ramp(small, opt, data, args.total_steps - args.small_steps)
    print(json.dumps(res, indent=1))
    if args.out:
        args.out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
