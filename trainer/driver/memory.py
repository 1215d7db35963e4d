"""Expected per-rank memory of a training job's model states: parameters, gradients and Adam state, by ZeRO stage
and precision. Activations, buffers and fragmentation are not counted.

Source: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models" (arXiv
1910.02054), Sec. 3.1 and Fig. 1. With Psi parameters and N_d data-parallel ranks, mixed-precision Adam keeps
2 Psi bytes of fp16/bf16 parameters, 2 Psi of gradients and K Psi = 12 Psi of optimizer state (fp32 master
parameters, exp_avg, exp_avg_sq), 16 Psi in all; the stages partition them (Fig. 1):

    ZeRO-0: (2 + 2 + K) Psi     ZeRO-1 (P_os): (2 + 2) Psi + K Psi / N_d
    ZeRO-2 (P_os+g): 2 Psi + (2 + K) Psi / N_d     ZeRO-3 (P_os+g+p): (2 + 2 + K) Psi / N_d

In fp32 there is no separate master copy: 4 Psi parameters, 4 Psi gradients and K = 8 (exp_avg, exp_avg_sq),
16 bytes per parameter at ZeRO-0 as well, partitioned the same way.
"""

from __future__ import annotations

# bytes per parameter: (parameters, gradients, optimizer state K)
BYTES_PER_PARAM = {"fp32": (4, 4, 8), "bf16": (2, 2, 12), "fp16": (2, 2, 12)}
GIB = 1024**3


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
    if precision not in BYTES_PER_PARAM or zero_stage not in (0, 1, 2, 3) or world_size < 1:
        raise ValueError(
            f"precision {precision!r} (one of {list(BYTES_PER_PARAM)}), zero_stage {zero_stage} (0-3), "
            f"world_size {world_size} (>= 1)"
        )
    p, g, k = BYTES_PER_PARAM[precision]
    replicated, partitioned = {0: (p + g + k, 0), 1: (p + g, k), 2: (p, g + k), 3: (0, p + g + k)}[zero_stage]
    return n_params * (replicated + partitioned / world_size)
