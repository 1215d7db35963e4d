"""Conversion between growlm's GPT and ``transformers.GPT2LMHeadModel``: the model out (``to_hf``, the export) and
the config in (``config_from_dict``: train.py --init_from and growlm-eval read a folder's config.json with it).

Both models use the same parameter names and the same (in, out) Conv1D layout, so conversion is a name filter:
HF adds ``lm_head.weight`` (tied) and, in some versions, non-persistent ``attn.bias`` causal-mask buffers. Weights
come in by those names from the folder's safetensors (trainer.init_from).
``transformers`` is imported lazily, inside the functions that need it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from growlm.model.gpt2.config import GPTConfig
from growlm.model.gpt2.model import GPT
from growlm.model.hf_fields import fields_problem

if TYPE_CHECKING:
    from transformers import GPT2Config, GPT2LMHeadModel

HF_CLASS = "GPT2LMHeadModel"  # the transformers class of the family (model.registry)
# the config.json fields GPT-2 reads, with the kind of value each holds (model.hf_fields); hidden_size,
# num_attention_heads, num_hidden_layers and max_position_embeddings are transformers' other names of n_*
CONFIG_FIELDS = {
    "vocab_size": "count", "n_positions": "count", "n_embd": "count", "n_layer": "count", "n_head": "count",
    "n_inner": "count or null", "hidden_size": "count", "num_attention_heads": "count", "num_hidden_layers": "count",
    "max_position_embeddings": "count", "activation_function": "text", "resid_pdrop": "fraction",
    "embd_pdrop": "fraction", "attn_pdrop": "fraction", "layer_norm_epsilon": "number",
    "tie_word_embeddings": "boolean", "scale_attn_weights": "boolean", "scale_attn_by_inverse_layer_idx": "boolean",
    "reorder_and_upcast_attn": "boolean",
}  # fmt: skip


def to_hf_config(cfg: GPTConfig, bos_token_id: int | None = None, eos_token_id: int | None = None) -> GPT2Config:
    """The ``transformers.GPT2Config`` describing the same model (pre-LN, tanh GELU, tied head).

    ``eos_token_id``: the tokenizer's end-of-text id (None: GPT-2's 50256 when the vocabulary holds it, else none);
    ``bos_token_id``: None means the end-of-text id, as GPT-2's tokenizer has it.
    """
    from transformers import GPT2Config  # lazy: heavy (about 2 s), only for the transformers GPT-2

    if eos_token_id is None and cfg.vocab_size > 50256:
        eos_token_id = 50256

    return GPT2Config(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.n_positions,
        n_embd=cfg.n_embd,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_inner=cfg.n_inner,
        activation_function="gelu_new",
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.dropout,
        layer_norm_epsilon=cfg.layer_norm_epsilon,
        tie_word_embeddings=True,
        bos_token_id=eos_token_id if bos_token_id is None else bos_token_id,
        eos_token_id=eos_token_id,
    )


def from_hf_config(hf_cfg: GPT2Config) -> GPTConfig:
    """The GPTConfig of a ``transformers.GPT2Config``.

    Raises:
        ValueError: the HF config uses a feature growlm's GPT does not implement (another activation, untied
            head, scaled or reordered attention, or unequal dropouts).
    """
    unsupported = []
    if hf_cfg.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        unsupported.append(f"activation_function={hf_cfg.activation_function!r} (need 'gelu_new')")
    if not getattr(hf_cfg, "tie_word_embeddings", True):
        unsupported.append("tie_word_embeddings=False")
    if getattr(hf_cfg, "scale_attn_by_inverse_layer_idx", False) or getattr(hf_cfg, "reorder_and_upcast_attn", False):
        unsupported.append("scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn")
    if not getattr(hf_cfg, "scale_attn_weights", True):
        unsupported.append("scale_attn_weights=False")
    drops = {hf_cfg.resid_pdrop, hf_cfg.embd_pdrop, hf_cfg.attn_pdrop}
    if len(drops) > 1:
        unsupported.append(f"unequal dropouts {sorted(drops)}")
    if unsupported:
        raise ValueError("cannot convert this GPT2Config: " + "; ".join(unsupported))
    return GPTConfig(
        n_layer=hf_cfg.n_layer,
        n_embd=hf_cfg.n_embd,
        n_head=hf_cfg.n_head,
        n_inner=hf_cfg.n_inner,
        n_positions=hf_cfg.n_positions,
        vocab_size=hf_cfg.vocab_size,
        dropout=float(drops.pop()),
        layer_norm_epsilon=hf_cfg.layer_norm_epsilon,
    )


def to_hf(model: GPT, bos_token_id: int | None = None, eos_token_id: int | None = None) -> GPT2LMHeadModel:
    """A ``GPT2LMHeadModel`` holding copies of ``model``'s weights (fp32), in eval mode (token ids: as in
    ``to_hf_config``).

    Raises:
        ValueError: the model still carries growth masks (finish the ramp first; a masked model is not GPT-2).
    """
    from transformers import GPT2LMHeadModel  # lazy: heavy (about 2 s), only for the transformers GPT-2

    if any("mask" in name or "gate" in name for name, _ in model.named_buffers()):
        raise ValueError("model still has growth masks; let the mask ramp finish (masks at 1 are removed) first")
    hf = GPT2LMHeadModel(to_hf_config(model.config, bos_token_id, eos_token_id))
    ours = {k: v.detach().float() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    missing, unexpected = hf.load_state_dict(ours, strict=False)
    missing = [k for k in missing if not k.endswith((".attn.bias", ".attn.masked_bias")) and k != "lm_head.weight"]
    if missing or unexpected:
        raise ValueError(f"state dict mismatch converting to HF: missing {missing}, unexpected {unexpected}")
    hf.tie_weights()
    return hf.eval()


def config_from_dict(d: dict[str, Any]) -> GPTConfig:
    """The GPTConfig of a ``config.json``'s dict (``model_type`` "gpt2").

    Raises:
        ValueError: see ``from_hf_config``.
    """
    import transformers  # lazy: heavy (about 2 s), only for a transformers folder

    return from_hf_config(transformers.GPT2Config.from_dict(d))


def config_problem(d: dict[str, Any]) -> str | None:
    """What is malformed in a GPT-2 ``config.json`` dict, as a one-line problem and fix, or None: a value of the
    wrong kind (``CONFIG_FIELDS``, model.hf_fields), or n_embd not divisible by n_head. Absent fields are
    transformers' defaults; what growlm's GPT does not compute is ``from_hf_config``'s to refuse."""
    problem = fields_problem(d, CONFIG_FIELDS)
    if problem is not None:
        return problem
    embd, embd_key = next(((d[k], k) for k in ("n_embd", "hidden_size") if k in d), (None, None))
    heads, heads_key = next(((d[k], k) for k in ("n_head", "num_attention_heads") if k in d), (None, None))
    if embd is not None and heads is not None and embd % heads:
        return (
            f"config.json: {embd_key} {embd} is not divisible by {heads_key} {heads}; correct {heads_key} in "
            "config.json"
        )
    return None


def config_json(written: dict[str, Any], cfg: GPTConfig) -> dict[str, Any]:
    """The ``config.json`` dict an export writes for ``cfg``: ``save_pretrained``'s, unchanged (every transformers
    version reads GPT-2's as it is)."""
    return written
