"""Memory a training job or a growth needs per rank, and what the machine has: the check that refuses a model that
cannot fit before anything is allocated (growlm-grow, a live growth, train.py and its growth plan, growlm-run).

Model states per rank (``model_state_bytes``): parameters, gradients and Adam state, by ZeRO stage and precision; and
for a model that trains, the activations of one micro batch (``activation_bytes``, Korthikanti et al. 2022, below).
Buffers, the data, the allocator's slack and the backward's temporaries are not counted, so a model that passes may
still not fit; one that fails cannot. Memory freed but kept by malloc is not counted either: a CPU rank's malloc keeps
what is freed (runtime.dist.keep_freed_memory), so a live growth returns the heap its new engine's build freed before it
allocates the Adam state and the gather's working set (growth.live.grow); without that, 2 ranks of a 52.6M -> 193.2M
width growth peaked above these terms.

Source: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models" (arXiv
1910.02054), Sec. 3.1 and Fig. 1. With Psi parameters and N_d data-parallel ranks, mixed-precision Adam keeps
2 Psi bytes of fp16/bf16 parameters, 2 Psi of gradients and K Psi = 12 Psi of optimizer state (fp32 master
parameters, exp_avg, exp_avg_sq), 16 Psi in all; the stages partition them (Fig. 1):

    ZeRO-0: (2 + 2 + K) Psi     ZeRO-1 (P_os): (2 + 2) Psi + K Psi / N_d
    ZeRO-2 (P_os+g): 2 Psi + (2 + K) Psi / N_d     ZeRO-3 (P_os+g+p): (2 + 2 + K) Psi / N_d

In fp32 at ZeRO-0 the master copy is the parameter itself: 4 Psi parameters, 4 Psi gradients and K = 8 (exp_avg,
exp_avg_sq), 16 bytes per parameter. DeepSpeed's ZeRO optimizers keep a separate fp32 partition for Adam in fp32 too
(ZeRO-1/2 ``single_partition_of_fp32_groups``, ZeRO-3 ``fp32_partitioned_groups_flat``: each its own storage beside
the working partition; ZeRO-3 means to share them for fp32 weights on the same device, but its check never matches:
``runtime.engine.fp32_master_is_separate`` reads it from a live engine and the growth-scaling test asserts it), so
at stages 1-3 K = 12 as in mixed precision, 20 bytes per parameter unpartitioned: ZeRO-2 fp32 holds
4 Psi + 16 Psi / N_d, ZeRO-3 fp32 20 Psi / N_d (eval/bench/growth_scaling.py measured the difference: a rank's
resident memory follows 20 bytes per parameter, not 16).

Activations: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models" (arXiv
2205.05198), Sec. 4.1, eq. 1: a transformer layer without recomputation keeps s b h (34 + 5 a s / h) bytes in 16-bit
for backward (s sequence length, b micro batch, h hidden size, a attention heads), where the 5 a s^2 b term is the
score matrix, its softmax and dropout mask. growlm's attention never keeps those: torch's
scaled_dot_product_attention (causal, no dropout) runs a fused kernel that saves q, k, v, the output and the
log-sum-exp for backward, on the CPU too, which is what the paper's selective recomputation of the attention core
leaves (Sec. 5: 34 s b h per layer). So the count is 34 s b h per layer, linear in s. ZeRO partitions model states,
not activations: every rank holds its own micro batch's. The constant is the paper's for a GPT-shaped layer, used as
it is for every family (a Llama's SwiGLU and grouped keys differ a little).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from growlm.model.config import ModelConfig

# bytes per parameter: (parameters, gradients, optimizer state K)
BYTES_PER_PARAM = {"fp32": (4, 4, 8), "bf16": (2, 2, 12), "fp16": (2, 2, 12)}
FP32_SEPARATE_MASTER_STAGES = (1, 2, 3)  # DeepSpeed's ZeRO optimizers keep their own fp32 partition in fp32 too
GIB = 1024**3


def bytes_per_param(zero_stage: int, precision: str) -> tuple[int, int, int]:
    """(parameters, gradients, optimizer state K) bytes per parameter of a DeepSpeed engine at ``zero_stage`` in
    ``precision`` (module docstring: ``BYTES_PER_PARAM``, with K = 12 for fp32 at ZeRO-1/2/3)."""
    p, g, k = BYTES_PER_PARAM[precision]
    if precision == "fp32" and zero_stage in FP32_SEPARATE_MASTER_STAGES:
        k += 4
    return p, g, k


def model_state_split(n_params: int, zero_stage: int, precision: str, world_size: int) -> tuple[float, float]:
    """``model_state_bytes`` in two parts: (parameters + gradients, Adam state K Psi with the fp32 master), bytes per
    rank; the second part is what an optimizer offload moves to the host.

    Raises:
        ValueError: as ``model_state_bytes``.
    """
    check_state_args(zero_stage, precision, world_size)
    p, g, k = bytes_per_param(zero_stage, precision)
    pg = (p + g) / world_size if zero_stage == 3 else p + (g / world_size if zero_stage == 2 else g)
    opt = k / world_size if zero_stage >= 1 else k
    return n_params * pg, n_params * opt


def check_state_args(zero_stage: int, precision: str, world_size: int) -> None:
    """Raise ValueError naming what is wrong: an unknown precision or ZeRO stage, or world_size < 1."""
    if precision not in BYTES_PER_PARAM or zero_stage not in (0, 1, 2, 3) or world_size < 1:
        raise ValueError(
            f"precision {precision!r} (one of {list(BYTES_PER_PARAM)}), zero_stage {zero_stage} (0-3), "
            f"world_size {world_size} (>= 1)"
        )


def model_state_bytes(n_params: int, zero_stage: int, precision: str, world_size: int) -> float:
    """Bytes of parameters + gradients + Adam state one rank holds (module docstring: ZeRO paper Sec. 3.1, Fig. 1).

    Args:
        n_params: parameters of the model (Psi).
        zero_stage: 0-3.
        precision: "fp32", "bf16" or "fp16".
        world_size: data-parallel ranks (N_d).

    Raises:
        ValueError: an unknown precision or ZeRO stage, or world_size < 1.
    """
    check_state_args(zero_stage, precision, world_size)
    p, g, k = bytes_per_param(zero_stage, precision)
    replicated, partitioned = {0: (p + g + k, 0), 1: (p + g, k), 2: (p, g + k), 3: (0, p + g + k)}[zero_stage]
    return n_params * (replicated + partitioned / world_size)


@dataclass(frozen=True)
class MicroBatch:
    """One rank's micro batch as ``activation_bytes`` counts it: ``size`` sequences (B) of ``seq_len`` tokens (T),
    with or without activation checkpointing (train.py's --activation_checkpointing)."""

    size: int
    seq_len: int
    checkpointing: bool = False

    def text(self) -> str:
        """'B x T tokens', with ', activation checkpointing' when it is on."""
        return f"{self.size} x {self.seq_len} tokens" + (", activation checkpointing" if self.checkpointing else "")


def activation_bytes(cfg: ModelConfig, batch: MicroBatch, precision: str) -> int:
    """Bytes of activations one rank keeps for the backward of one micro batch (module docstring: Korthikanti et al.
    2022, arXiv 2205.05198). With s = ``batch.seq_len``, b = ``batch.size``, h = n_embd, L = n_layer and
    V = vocab_size, and x = 2 in fp32 (activations twice the size of 16-bit ones), else 1:

    - each layer, without recomputation: x 34 s b h (Sec. 4.1, eq. 1 without its score term, which a fused attention
      kernel never keeps: Sec. 5), L of them;
    - with activation checkpointing: each layer's input, x 2 s b h (Sec. 5), plus one layer's full activations while
      its backward recomputes them;
    - the logits, b s V elements in the parameters' dtype (2 bytes, 4 in fp32), and their fp32 copy for the cross
      entropy (model.layers: ``logits.float()``), b s V x 4 bytes.

    Per rank: ZeRO does not shard activations.

    Raises:
        ValueError: an unknown precision, or a micro batch or sequence length below 1.
    """
    if precision not in BYTES_PER_PARAM or batch.size < 1 or batch.seq_len < 1:
        raise ValueError(
            f"precision {precision!r} (one of {list(BYTES_PER_PARAM)}), micro batch {batch.size} and seq_len "
            f"{batch.seq_len} (each >= 1)"
        )
    s, b, h = batch.seq_len, batch.size, cfg.n_embd
    x = 2 if precision == "fp32" else 1
    layer = x * 34 * s * b * h
    layers = cfg.n_layer * x * 2 * s * b * h + layer if batch.checkpointing else cfg.n_layer * layer
    logits = b * s * cfg.vocab_size * (4 if precision == "fp32" else 2) + b * s * cfg.vocab_size * 4
    return layers + logits


def training_need_text(states: float, activations: float, batch: MicroBatch) -> str:
    """The parts of a training run's need, in the words every memory refusal uses: 'model states X + activations of
    one micro batch of B x T tokens Y' (``size_text``)."""
    return (
        f"model states {size_text(states)} + activations of one micro batch of {batch.text()} {size_text(activations)}"
    )


GATHER_BUCKET_BYTES = 64 * 2**20
"""Largest full fp32 size (bytes: 12 x numel, weight + exp_avg + exp_avg_sq) of the parameters a live growth gathers
in one collective (growth.live.transfer); a parameter larger than this is gathered alone. 64 MiB keeps the
collectives few (a 62M-parameter model takes about 12) while the working set stays a small fraction of the model."""


GROWN_PARAM_BYTES = 28
"""Bytes per grown element one parameter takes while its growth rule runs (growth.ops.apply.grow_param): its fp32
weight, exp_avg and exp_avg_sq (12) plus the rule's temporaries (the pieces a grown tensor is built from, and
symmetry-breaking noise, formed in the weight's dtype, at least float32). Measured by eval/bench/grow_param_peak.py
(before the noise was formed in float32: at most 26.5, width x2 with symmetry noise; 16 without)."""


def growth_working_set_bytes(largest_old: int, largest_new: int, bucket_bytes: int = GATHER_BUCKET_BYTES) -> int:
    """Bytes a rank's live growth holds besides the two engines (growth.live.transfer, "Working set"), on the
    process group's device (the GPU under NCCL, the host under gloo): the bucket's packed shards received and its
    assembled full fp32 tensors, each about max(bucket_bytes, 12 x the largest old parameter's numel), and one grown
    parameter while its rule runs (``GROWN_PARAM_BYTES`` x its numel).

    Args:
        largest_old: numel of the old model's largest parameter.
        largest_new: numel of the grown model's largest parameter.
        bucket_bytes: the gather's bucket size.
    """
    return 2 * max(bucket_bytes, 12 * largest_old) + GROWN_PARAM_BYTES * largest_new


def placed_bytes(
    params_grads: float, optimizer: float, working_set: float, on_gpu: bool, offloaded: bool, activations: float = 0.0
) -> tuple[float, float]:
    """Where a run's or a growth's bytes per rank live, as (device bytes, host bytes): on a GPU the model states
    (``model_state_split``'s two parts), the working set (``growth_working_set_bytes``: the gathered and grown
    tensors, expanded on the GPU) and the activations (``activation_bytes``) on the device, except an offloaded
    optimizer part, which the host holds; on a CPU everything on the host (device bytes 0)."""
    if not on_gpu:
        return 0.0, params_grads + optimizer + working_set + activations
    on_device = params_grads + working_set + activations + (0 if offloaded else optimizer)
    return on_device, optimizer if offloaded else 0.0


# the launchers' names for the ranks on this node, in the order read: torchrun (and growlm's own launcher),
# DeepSpeed's launcher (deepspeed/launcher/launch.py sets LOCAL_SIZE, not LOCAL_WORLD_SIZE), Open MPI's mpirun;
# WORLD_SIZE last (one node)
NODE_RANK_VARIABLES = ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "WORLD_SIZE")


def ranks_on_this_node() -> int:
    """How many ranks share this node (its memory and its cores): the first of ``NODE_RANK_VARIABLES`` that holds a
    positive integer, else 1. The one reader of these variables (host memory per rank here, torch threads per rank in
    ``runtime.dist.rank_threads``): on 4 nodes x 8 GPUs under DeepSpeed's launcher it is 8, not the world size 32."""
    for key in NODE_RANK_VARIABLES:
        try:
            return max(1, int(os.environ[key]))
        except (KeyError, ValueError):
            continue
    return 1


def rank_memory_bytes(device: torch.device, free: bool) -> int:
    """This rank's share of ``device``'s memory: on CUDA the device's own (free: ``torch.cuda.mem_get_info`` plus what
    torch's allocator holds unused; else its total), on the CPU the node's (free: ``psutil`` available; else total)
    divided by the ranks on this node."""
    if device.type == "cuda":
        if free:
            unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
            return int(torch.cuda.mem_get_info(device)[0] + unused)
        return int(torch.cuda.get_device_properties(device).total_memory)
    vm = psutil.virtual_memory()
    return int((vm.available if free else vm.total) // ranks_on_this_node())


SHORTFALL_FIX = "choose a smaller target, more ranks or a higher ZeRO stage"


def shortfall(need: float, device: torch.device, free: bool, what: str, fix: str = SHORTFALL_FIX) -> str:
    """The one-line refusal when ``need`` bytes per rank exceed ``rank_memory_bytes(device, free)``, naming both
    figures in GiB, ``what`` needs them and the ``fix``; '' when it fits."""
    have = rank_memory_bytes(device, free)
    if need <= have:
        return ""
    where = "GPU" if device.type == "cuda" else f"host memory ({ranks_on_this_node()} rank(s) on this node)"
    kind = "free" if free else "in all"
    return (
        f"{what} needs about {need / GIB:,.1f} GiB per rank, and this rank's {where} has {have / GIB:,.1f} GiB "
        f"{kind}: {fix}"
    )


def placed_shortfall(
    parts: list[tuple[float, float]], work: float, device: torch.device, offloaded: bool, what: str,
    fix: str = SHORTFALL_FIX, activations: float = 0.0,
) -> str:  # fmt: skip
    """``shortfall`` of the models whose ``model_state_split`` parts are ``parts`` (plus a growth's ``work``ing set
    and a training run's ``activations``, 0 for none) placed where they live (``placed_bytes``: on a GPU rank the
    GPU's part against the GPU's total memory, then the host's part; on a CPU rank everything against the host's
    total divided by the ranks on this node); '' when they fit. The one check of train.py's run and plan stages
    against the machine."""
    pg, opt = sum(p for p, _ in parts), sum(o for _, o in parts)
    on_gpu = device.type == "cuda"
    gpu, host = placed_bytes(pg, opt, work, on_gpu, offloaded, activations)
    return (shortfall(gpu, device, False, what, fix) if on_gpu else "") or shortfall(
        host, torch.device("cpu"), False, what, fix
    )


# bytes per parameter element of a universal checkpoint's per-parameter files (growth.offline.universal.UniversalStore):
# zero/<name>/fp32.pt, exp_avg.pt and exp_avg_sq.pt, each fp32
UNIVERSAL_BYTES_PER_PARAM = 12


def offline_growth_host_bytes(largest_old: int, largest_new: int) -> int:
    """Host bytes growlm-grow holds at once (growth.offline.pipeline: one pass, one parameter at a time,
    growth.ops.apply.apply_rules): the largest old parameter read whole in fp32 with both Adam moments (12 x its
    numel) and the largest grown one's three fp32 tensors twice (12 x 2 x its numel: the one being built and the
    previous one still queued for the writer thread, growth.offline.universal.Written, at most three files). The old
    shards are memory-mapped and the model is never held whole; an operator's short-lived temporaries are not
    counted.

    Args:
        largest_old: numel of the input model's largest parameter.
        largest_new: numel of the output model's largest parameter.
    """
    return UNIVERSAL_BYTES_PER_PARAM * (largest_old + 2 * largest_new)


def universal_checkpoint_bytes(n_params: int, tied_numel: int = 0) -> int:
    """Bytes a universal checkpoint of ``n_params`` parameters takes on disk (growth.offline.universal): the fp32
    weight, exp_avg and exp_avg_sq of every parameter (``UNIVERSAL_BYTES_PER_PARAM``) plus the fp32 weight of a tied
    alias (``lm_head.weight``, ``tied_numel`` elements; ZeRO-1/2 only). The model-states files hold only the growth
    masks (no weights), and the metadata, RNG and manifest files a few KiB each: not counted."""
    return UNIVERSAL_BYTES_PER_PARAM * n_params + 4 * tied_numel


def disk_free_bytes(path: Path) -> tuple[Path, int]:
    """(the nearest existing folder at or above ``path``, the bytes free to this user on its filesystem:
    ``shutil.disk_usage``)."""
    where = Path(os.path.abspath(path))
    while not where.exists() and where != where.parent:
        where = where.parent
    return where, int(shutil.disk_usage(where).free)


def disk_shortfall(need: float, path: Path, what: str, fix: str) -> str:
    """The one-line refusal when ``need`` bytes exceed the free space of ``path``'s filesystem, naming both figures
    (``size_text``: GiB, MiB or KiB), ``what`` needs them and the ``fix``; '' when it fits."""
    where, have = disk_free_bytes(path)
    if need <= have:
        return ""
    return f"{what} needs about {size_text(need)} on disk, and {where} has {size_text(have)} free: {fix}"


def size_text(n_bytes: float) -> str:
    """A size in the unit that shows it: GiB from 1 GiB up, else MiB from 1 MiB, else KiB (one decimal)."""
    for unit, size in (("GiB", GIB), ("MiB", 2**20)):
        if n_bytes >= size:
            return f"{n_bytes / size:,.1f} {unit}"
    return f"{n_bytes / 1024:,.1f} KiB"
