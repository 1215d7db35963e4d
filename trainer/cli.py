"""The growlm-train command line: its parser (``build_parser``; growlm-run parses its TRAIN_ARGS with it too) and
``main``, which runs ``trainer.run.run`` and turns bad input into one ``growlm-train: error:`` line and exit status 2.
``train.py`` at the top of the package is the script the launchers start on every rank.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from pathlib import Path

from growlm import DS_CONFIG_DIR
from growlm.growth.errors import GrowthError
from growlm.model.config import PRESETS
from growlm.runtime import peers, stop
from growlm.runtime.checkpoint import LATEST, CheckpointError
from growlm.runtime.commands import HelpFormatter, add_version
from growlm.runtime.dist import close_distributed, launch_rank
from growlm.runtime.processes import watch_driver
from growlm.trainer.config import DEFAULT_PRESET
from growlm.trainer.errors import RankError, UsageError
from growlm.trainer.run import run

__all__ = ["main", "build_parser", "parse_args"]


def build_parser() -> argparse.ArgumentParser:
    """The growlm-train argument parser (``python train.py --help`` describes every flag)."""
    p = argparse.ArgumentParser(
        prog="growlm-train",
        description="Pretrain a GPT-2 or Llama with DeepSpeed ZeRO. Model shape from --preset (+ overrides); DeepSpeed "
        "settings (ZeRO stage, precision, batch, optimizer, LR schedule) from --ds_config.",
        formatter_class=HelpFormatter,
    )
    _model_and_data_flags(p)
    _training_flags(p.add_argument_group("training"))
    _evaluation_flags(p.add_argument_group("evaluation"))
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # set by the deepspeed launcher
    return add_version(p)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``python train.py --help`` describes every flag)."""
    return build_parser().parse_args(argv)


def _model_and_data_flags(p: argparse.ArgumentParser) -> None:
    """The "model" and "data" flag groups."""
    m = p.add_argument_group("model")
    m.add_argument(
        "--preset",
        default=None,
        help=f"model shape preset, one of: {', '.join(PRESETS)} "
        f"(default {DEFAULT_PRESET}, the checkpoint's shape with --resume, the folder's with --init_from)",
    )
    m.add_argument("--n_layer", type=int, help="override the preset's number of blocks L")
    m.add_argument("--n_embd", type=int, help="override the preset's width d (must be divisible by n_head)")
    m.add_argument("--n_head", type=int, help="override the preset's number of attention heads H")
    m.add_argument(
        "--n_inner",
        type=int,
        help="override the preset's FFN width F (default 4 * n_embd; Llama: 8 * n_embd / 3 rounded up to 64)",
    )
    m.add_argument("--n_positions", type=int, help="override the preset's longest context P")
    m.add_argument("--vocab_size", type=int, help="override the preset's vocabulary V (>= the data's vocabulary)")
    m.add_argument(
        "--dropout",
        type=float,
        help="override the preset's dropout (GPT-2: embedding, attention, residual; Llama: attention)",
    )
    m.add_argument("--n_kv_head", type=int, help="Llama presets only: key/value heads K (n_head a multiple of K)")
    m.add_argument("--head_dim", type=int, help="Llama presets only: head dim Q, even (default n_embd // n_head)")
    m.add_argument("--rope_theta", type=float, help="Llama presets only: the rotary embeddings' base")
    m.add_argument("--rms_norm_eps", type=float, help="Llama presets only: RMSNorm's epsilon")
    tie = m.add_mutually_exclusive_group()  # both at once: refused, not the last one silently winning
    tie.add_argument(
        "--tie_word_embeddings",
        action="store_const",
        const=True,
        default=None,
        help="Llama presets only: the LM head shares the token embedding's weight",
    )
    tie.add_argument(
        "--untie_word_embeddings",
        dest="tie_word_embeddings",
        action="store_const",
        const=False,
        help="Llama presets only: the LM head has a weight of its own",
    )
    d = p.add_argument_group("data")
    d.add_argument(
        "--data",
        default=None,
        help="folder made by growlm-prepare (train.bin, val.bin, meta.json); "
        "default: the built-in corpus, prepared on first use into growlm's cache (~/.cache/growlm/builtin, or "
        "$GROWLM_CACHE/builtin)",
    )
    d.add_argument("--seq_len", type=int, default=None, help="tokens per training sequence T (default n_positions)")
    d.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the model init, data order and dropout (default 1234, or the checkpoint's with --resume)",
    )


def _training_flags(t: argparse._ArgumentGroup) -> None:
    """The "training" flag group."""
    t.add_argument(
        "--ds_config",
        default=str(DS_CONFIG_DIR / "zero2_bf16.json"),
        help='DeepSpeed JSON config; a scheduler total_num_steps of "auto" becomes --max_steps',
    )
    t.add_argument("--max_steps", type=int, default=200, help="train until this many optimizer steps (global step)")
    t.add_argument(
        "--out_dir",
        default="runs/default",
        help="run folder: checkpoints/, tb/ (TensorBoard), "
        "metrics.jsonl; refused if it already holds checkpoints this run would write, or while another growlm-train "
        "runs in it (<out_dir>/train.lock)",
    )
    t.add_argument(
        "--growth_plan",
        default=None,
        help="YAML growth plan (growth/plans/*.yaml): the starting shape and stages to grow into during this run; "
        "each stage's operator, trigger (step, tokens or loss slope), mask ramp, Adam policy and LR rule",
    )
    t.add_argument(
        "--resume",
        default=None,
        help="checkpoint to continue from: a checkpoints folder (its "
        "'latest' tag) or a tag folder; restores weights, Adam state, LR schedule, loss scaler, "
        "consumed samples and RNG. DeepSpeed's loader unpickles the checkpoint's files: use checkpoints from a "
        "trusted source only (growlm refuses any file holding more than tensor data and a few known types)",
    )
    t.add_argument(
        "--init_from",
        default=None,
        help="transformers GPT-2 or Llama folder to start from (growlm-grow --export_hf output, or a GPT2LMHeadModel "
        "or LlamaForCausalLM with plain RoPE saved with save_pretrained; docs/models.md): config.json gives the model "
        "shape (no --preset/--n_* that differ), model.safetensors or its shards the weights (safetensors only; "
        "pytorch_model.bin is refused), tokenizer.json, if present, must match --data's tokenizer (growlm-prepare "
        "--tokenizer DIR). Fresh Adam state and LR schedule, any ZeRO stage and precision; with --growth_plan the "
        "plan's start must be this shape. Not with --resume",
    )
    t.add_argument(
        "--stop_before_stage",
        metavar="NAME",
        help="with --growth_plan: when stage NAME is due, save a checkpoint and exit 0 instead of growing live "
        "(growlm-run then grows it offline and relaunches on the stage's resources)",
    )
    t.add_argument(
        "--new_schedule",
        action="store_true",
        help="with --resume: train on this run's LR schedule (--ds_config's scheduler, \"auto\" lengths from "
        "--max_steps) from the checkpoint's position, instead of the checkpoint's own schedule, which a resume keeps "
        "by default; the LR of the next step before and after is printed",
    )
    t.add_argument("--save_interval", type=int, default=0, help="also save every N steps (0: only at the end)")
    t.add_argument(
        "--no_final_save",
        action="store_true",
        help="do not save a checkpoint at the end, nor where a signal stops the run",
    )
    t.add_argument(
        "--activation_checkpointing",
        action="store_true",
        help="recompute each transformer block's activations in backward instead of keeping them: less activation "
        "memory for about one more forward pass of the blocks; grown blocks get it too; same losses and gradients",
    )
    t.add_argument(
        "--compile",
        action="store_true",
        help="compile the model with torch.compile (inductor; each grown model is compiled anew, the first steps "
        "after the start and after each growth include the compilation). Also on a CPU, where inductor builds C++ "
        "with g++: slow to compile (about half a minute per shape) and not measured faster than eager",
    )
    t.add_argument("--log_interval", type=int, default=10, help="steps between TensorBoard/console logs (>= 1)")
    t.add_argument("--dist_timeout_s", type=float, default=300.0, help="seconds to wait for other ranks")


def _evaluation_flags(e: argparse._ArgumentGroup) -> None:
    """The "evaluation" flag group."""
    e.add_argument("--eval_interval", type=int, default=0, help="validate every N steps (0: only before/after)")
    e.add_argument("--eval_tokens", type=int, default=32768, help="held-out tokens used by periodic validation")
    e.add_argument(
        "--final_eval_tokens",
        type=int,
        default=0,
        help="held-out tokens scored before and after training (0: the whole validation split)",
    )
    e.add_argument(
        "--eval_stride",
        type=int,
        default=None,
        help="sliding-window stride for before/after perplexity (default seq_len: non-overlapping windows)",
    )
    e.add_argument("--eval_batch_size", type=int, default=8, help="windows per forward pass when evaluating")
    e.add_argument("--no_final_eval", action="store_true", help="skip the before/after perplexity")


def resume_arg(args: argparse.Namespace) -> str | None:
    """The ``--resume`` value that continues this run from its last complete checkpoint (``<out_dir>/checkpoints``
    when its ``latest`` exists), shell-quoted; None when it has none yet."""
    save_dir = Path(args.out_dir) / "checkpoints"
    return shlex.quote(str(save_dir)) if (save_dir / LATEST).is_file() else None


def main(argv: list[str] | None = None) -> int:
    """growlm-train: run ``run`` and turn bad input into one message and exit status 2. SIGTERM and SIGINT stop the
    run after the current step on every rank (``runtime.stop``, ``trainer.stopping``): exit status 128 + the
    signal's number (143, 130); a second SIGINT stops it at once (130, no checkpoint of that step). A rank whose
    collective fails because another rank ended, was killed or stopped answering (``runtime.peers``) says so in one
    line, naming that rank, what the job was doing and the ``--resume`` that continues it: exit status 1."""
    args = parse_args(argv)
    watch_driver()  # under growlm-run: die with the driver (no-op otherwise)
    rank_env = launch_rank()
    stop.reset()
    restore_handlers = stop.install()
    try:
        return run(args)
    except (UsageError, CheckpointError, GrowthError) as e:
        if rank_env == 0 or isinstance(e, RankError):
            print(f"growlm-train: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a second SIGINT: at once, mid-step
        if rank_env == 0:
            print(
                "growlm-train: interrupted again: stopped at once, without saving; resume from the last checkpoint "
                f"in {args.out_dir}/checkpoints with --resume",
                file=sys.stderr,
            )
        return stop.exit_status(signal.SIGINT)
    except Exception:  # a collective failed: when a peer is lost, say which, once, not gloo's or NCCL's traceback
        line = peers.lost_rank_message(resume_arg(args))
        if line is None:
            raise
        print(f"growlm-train: error: {line}", file=sys.stderr)
        return 1
    finally:  # success, refusal or exception: leave no process group, TCP store or rendezvous variables behind
        close_distributed()
        restore_handlers()
