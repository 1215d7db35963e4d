"""A checkpoint's fp32 weights, in one process: the one reader behind the transformers export (growlm-grow
--export_hf), growlm-eval and the tests.

Any ZeRO stage, any world size, native or universal (an output of growlm-grow). ZeRO 1-3: the fp32 masters, merged
straight out of the native shards (growth.offline.shards.ZeroShardStore, the merge ``ds_to_universal`` performs) or
read from the universal files (growth.offline.universal.UniversalStore). Stage 0 writes no partitions: its weights
are the module state in ``mp_rank_00_model_states.pt`` (fp32 runs: the exact weights; bf16/fp16 runs: the working
copy, since stage 0 keeps no separate fp32 master on disk). Every tensor is checked against the shape of
``model_config`` in growlm_state.json.
"""

from __future__ import annotations

from torch import Tensor

from growlm.growth.offline.shards import ZeroShardStore
from growlm.growth.offline.universal import UniversalStore
from growlm.growth.ops.rules import param_shapes
from growlm.model.masks import GrowthMaskedModel
from growlm.model.registry import build_model
from growlm.runtime.checkpoint import STATE_FILE, CheckpointError, OpenCheckpoint, safe_load

MODULE_STATES = "mp_rank_00_model_states.pt"  # DeepSpeed's module state file of model-parallel rank 0


def fp32_weights(ckpt: OpenCheckpoint) -> dict[str, Tensor]:
    """name -> fp32 tensor of every parameter of the checkpoint's model (``growth.ops.rules.param_shapes``: GPT-2's
    HF names with Conv1D weights (in, out), or Llama's ``LlamaForCausalLM`` names with Linear weights (out, in); a
    tied head shares the token embedding (the config's ``embedding_name``) and is not listed, an untied Llama's
    ``lm_head.weight`` is).

    Raises:
        CheckpointError: the shard or universal files are missing or do not fit ``model_config`` (the message
            names the tensor), or a stage-0 checkpoint has no module state file.
    """
    state = ckpt.state
    shapes = param_shapes(state.model_config)
    if state.universal:
        store = UniversalStore(ckpt.tag_dir / "zero", shapes, flat=state.zero_stage == 3)
        return {name: store.read_tensor(name, "fp32") for name in shapes}
    if state.zero_stage != 0:
        store = ZeroShardStore(ckpt.tag_dir, shapes, zero_stage=state.zero_stage, world=state.world_size)
        return {name: store.read_tensor(name, "fp32") for name in shapes}
    path = ckpt.tag_dir / MODULE_STATES
    if not path.is_file():
        raise CheckpointError(f"{ckpt.tag_dir}: a ZeRO stage 0 checkpoint without {MODULE_STATES}; it is incomplete")
    module = safe_load(path, "module weights")["module"]
    out = {}
    for name, shape in shapes.items():
        t = module.get(name)
        if t is None or tuple(t.shape) != tuple(shape):
            got = "missing" if t is None else f"shape {tuple(t.shape)}"
            raise CheckpointError(
                f"{path}: {name} is {got}, but model_config in {STATE_FILE} ({state.model_config.shape_str()}) "
                f"gives {tuple(shape)}; the checkpoint is inconsistent"
            )
        out[name] = t.float()
    return out


def fp32_model(ckpt: OpenCheckpoint) -> GrowthMaskedModel:
    """The checkpoint's model (``GPT`` or ``Llama``, by its config's arch) in fp32, eval mode, its growth masks (if
    still ramping) at the saved step's value.

    Raises:
        CheckpointError: see ``fp32_weights``.
    """
    state = ckpt.state
    model = build_model(state.model_config, state.growth_masks)
    weights = fp32_weights(ckpt)
    for name, p in model.named_parameters():
        p.data.copy_(weights.pop(name))
    if state.growth_masks is not None:
        model.set_growth_step(state.global_step)
    return model.eval()
