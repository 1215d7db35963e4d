"""The Qwen 2 language model: the Llama family's module (model/llama/model.py) built from a ``Qwen2Config``, whose
``qkv_bias`` gives q_proj, k_proj and v_proj their biases; parameter names and layouts are those of
``transformers.Qwen2ForCausalLM``. Torch only."""

from __future__ import annotations

from growlm.model.llama.model import Llama


class Qwen2(Llama):
    """Qwen 2 / 2.5 causal language model: ``Llama`` with q/k/v biases (initialised to zero), names equal to
    ``Qwen2ForCausalLM``'s (``model.layers.{i}.self_attn.{q,k,v}_proj.bias`` besides Llama's).

    Raises:
        ValueError: ``masks`` does not fit the config (see ``MaskSpec.check``).
    """
