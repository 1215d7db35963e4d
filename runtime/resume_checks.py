"""The checks of a resume before any engine is built: that the checkpoint fits the run (model shape, world size,
ZeRO stage, precision) and holds every rank's RNG file; each refusal names the fix.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from growlm.runtime.checkpoint import CheckpointError, OpenCheckpoint
from growlm.runtime.rng import rng_file
from growlm.runtime.run_state import RunState


def check_rng_files(ckpt: OpenCheckpoint, world_size: int) -> None:
    """Refuse a resume at the saved world size whose tag folder lacks a rank's RNG file (a checkpoint without a
    manifest cannot say so itself): that rank would silently continue with a fresh random stream, so the resumed run
    would not repeat the interrupted one. At another world size no RNG file is restored (each rank is reseeded), and
    a growlm-grow (universal) checkpoint carries only the files its source had; neither is checked.

    Raises:
        CheckpointError: names the first missing file, the ranks missing and the fix.
    """
    if ckpt.state.world_size != world_size or ckpt.state.universal:
        return
    missing = [r for r in range(world_size) if not rng_file(ckpt.tag_dir, r).is_file()]
    if missing:
        raise CheckpointError(
            f"{rng_file(ckpt.tag_dir, missing[0])} is missing: the checkpoint {ckpt.tag_dir} holds no RNG state for "
            f"rank(s) {', '.join(map(str, missing))} of {world_size}, so the resumed run would not continue the "
            "interrupted one; restore the file(s) or resume from another tag"
        )


def check_compatible(
    state: RunState,
    *,
    model_config: dict,
    world_size: int,
    zero_stage: int,
    path: Path,
    precision: str | None = None,
    ds_config: str = "",
) -> None:
    """Refuse a resume that DeepSpeed would get wrong or fail on, before any engine is built.

    Args:
        precision, ds_config: the run's training precision and the DeepSpeed config file it comes from (None: not
            checked).

    Raises:
        CheckpointError: the model shape differs from the checkpoint's; or the data-parallel world size differs
            at ZeRO stage >= 1 (partitioned optimizer state cannot be loaded at another size); or the ZeRO stage
            crosses between 1/2 and 3; or the precision differs from the one a (non-universal) checkpoint was
            saved in (DeepSpeed keeps the optimizer state per precision: a bf16 run looks for ``bf16_zero_*``
            files that an fp32 or fp16 one never wrote).
    """
    saved_cfg = state.model_config.to_dict()
    diff = {
        k: (saved_cfg.get(k), model_config.get(k))
        for k in sorted(set(saved_cfg) | set(model_config))
        if k != "dropout" and saved_cfg.get(k) != model_config.get(k)
    }
    if diff:
        raise CheckpointError(
            f"{path} holds a model of another shape; differing fields (checkpoint, requested): {diff}. "
            "Drop the shape flags to resume the checkpoint's own shape, or grow it first"
        )
    saved_stage = state.zero_stage
    if (saved_stage == 3) != (zero_stage == 3):
        raise CheckpointError(
            f"{path} was saved at ZeRO stage {saved_stage} and cannot be loaded at stage {zero_stage}: "
            "DeepSpeed does not convert between stages 1/2 and 3; use a config with the saved stage"
        )
    if precision is not None and state.precision not in (None, precision) and not state.universal:
        raise CheckpointError(
            f"{path} was saved in {state.precision} and this run's DeepSpeed config "
            f"({ds_config or 'the default'}) trains in {precision}: DeepSpeed keeps the optimizer state per precision. "
            f"Resume with a config of the saved precision (--ds_config, e.g. ds_configs/zero{max(zero_stage, 1)}_"
            f"{state.precision}.json)"
        )
    if state.universal and zero_stage == 0:  # written by growlm-grow: DeepSpeed reshards it at load
        raise CheckpointError(
            f"{path} is a universal checkpoint (growlm-grow), which DeepSpeed loads at ZeRO stage "
            f"{'3' if saved_stage == 3 else '1 or 2'} only, not 0; use a ZeRO-{saved_stage} config"
        )
    if state.world_size != world_size and max(saved_stage, zero_stage) >= 1 and not state.universal:
        raise CheckpointError(
            f"{path} was saved by {state.world_size} ranks with ZeRO stage {saved_stage}, and this run has "
            f"{world_size}; partitioned optimizer state only loads at the same data-parallel size. Reshard it with "
            f"`growlm-grow {shlex.quote(str(path))} <new>` (DeepSpeed's ds_to_universal plus growlm's state; then "
            "--resume <new>) "
            "or run with the saved world size"
        )
