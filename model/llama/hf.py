"""Conversion between growlm's Llama and ``transformers.LlamaForCausalLM``: the model out (``to_hf``, the export)
and the config in (``config_from_dict``: train.py --init_from and growlm-eval read a folder's config.json with it);
and the parts of it that every Llama-shaped family shares (Qwen 2's adapter, model/qwen2/hf.py, calls them with its
own classes).

Both use the same parameter names and the same ``nn.Linear`` (out, in) layout, so conversion is a name filter
(transformers lists a tied ``lm_head.weight`` beside ``model.embed_tokens.weight``); weights come in by those names
from the folder's safetensors (trainer.init_from). This module imports
``transformers`` lazily.

The rotary base moved in transformers 5: it lives only in ``rope_parameters["rope_theta"]`` (``to_hf_config`` passes
``rope_theta=``, which transformers 5 moves there; its ``save_pretrained`` writes a top-level ``"rope_theta": null``),
while transformers 4 reads only the top-level ``rope_theta`` and ignores ``rope_parameters`` (a missing one is 10000).
Both are read here (``_rope``), and a written ``config.json`` gets both (``config_json``), so every version loads
the same model. A ``head_dim`` other than ``n_embd // n_head`` needs transformers >= 4.45, the first release whose
Llama reads ``config.head_dim`` (earlier ones use ``hidden_size // num_attention_heads``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from growlm.model.hf_fields import FIX, fields_problem
from growlm.model.llama.config import ROPE_TYPES, LlamaConfig
from growlm.model.llama.model import Llama

if TYPE_CHECKING:
    from transformers import LlamaConfig as HFLlamaConfig
    from transformers import LlamaForCausalLM

HF_CLASS = "LlamaForCausalLM"  # the transformers class of the family (model.registry)
# the config.json fields a Llama-shaped family reads, with the kind of value each holds (model.hf_fields)
CONFIG_FIELDS = {
    "vocab_size": "count", "hidden_size": "count", "intermediate_size": "count", "num_hidden_layers": "count",
    "num_attention_heads": "count", "num_key_value_heads": "count or null", "head_dim": "count or null",
    "max_position_embeddings": "count", "rms_norm_eps": "number", "rope_theta": "number or null",
    "rope_scaling": "object or null", "rope_parameters": "object or null", "tie_word_embeddings": "boolean",
    "attention_dropout": "fraction or null", "attention_bias": "boolean", "mlp_bias": "boolean",
    "hidden_act": "text", "pretraining_tp": "count or null",
}  # fmt: skip
# the fields of rope_scaling (transformers 4) and rope_parameters (5) that growlm reads (``_rope_fields``)
ROPE_FIELDS = {
    "rope_type": "text", "type": "text", "rope_theta": "number", "factor": "number", "low_freq_factor": "number",
    "high_freq_factor": "number", "original_max_position_embeddings": "count",
}  # fmt: skip


def _rope(hf_cfg: Any) -> tuple[float, str, Any]:
    """(rope_theta, rope_type, rope_scaling) of a transformers LlamaConfig of any version."""
    params = getattr(hf_cfg, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(hf_cfg, "rope_theta", None))
    scaling = getattr(hf_cfg, "rope_scaling", None)
    kind = params.get("rope_type") or (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"
    return float(10000.0 if theta is None else theta), kind, scaling


def hf_config_kwargs(cfg: LlamaConfig, bos_token_id: int | None, eos_token_id: int | None) -> dict[str, Any]:
    """The keyword arguments of a transformers config (``LlamaConfig``, ``Qwen2Config``) describing ``cfg``'s shape,
    rotary embedding, tie and token ids; what differs between families (biases) is the caller's."""
    return dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.n_embd,
        intermediate_size=cfg.ffn_dim,
        num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.n_kv_head,
        head_dim=cfg.head_dim,
        hidden_act="silu",
        max_position_embeddings=cfg.n_positions,
        rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta,
        **({} if cfg.rope_type == "default" else {"rope_scaling": rope_scaling_of(cfg)}),
        tie_word_embeddings=cfg.tie_word_embeddings,
        attention_dropout=cfg.dropout,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=None,
    )


def to_hf_config(cfg: LlamaConfig, bos_token_id: int | None = None, eos_token_id: int | None = None) -> HFLlamaConfig:
    """The ``transformers.LlamaConfig`` describing the same model (token ids: the tokenizer's, or none)."""
    from transformers import LlamaConfig as HFLlamaConfig  # lazy: heavy (about 2 s), only for transformers' Llama

    return HFLlamaConfig(**hf_config_kwargs(cfg, bos_token_id, eos_token_id), attention_bias=False, mlp_bias=False)


def rope_scaling_of(cfg: LlamaConfig) -> dict[str, Any]:
    """transformers' ``rope_scaling`` mapping of ``cfg``'s rotary scaling (``rope_type`` "linear" or "llama3")."""
    out: dict[str, Any] = {"rope_type": cfg.rope_type, "factor": cfg.rope_factor}
    if cfg.rope_type == "llama3":
        out |= {"low_freq_factor": cfg.rope_low_freq_factor, "high_freq_factor": cfg.rope_high_freq_factor,
                "original_max_position_embeddings": cfg.rope_original_positions}  # fmt: skip
    return out


def config_json(written: dict[str, Any], cfg: LlamaConfig) -> dict[str, Any]:
    """``written`` (the dict of a ``config.json`` that ``save_pretrained`` wrote for ``cfg``) with a top-level
    ``rope_theta`` equal to ``cfg.rope_theta`` and, for a scaled rotary embedding, ``rope_scaling``, which
    transformers 4 reads, beside transformers 5's ``rope_parameters`` (kept as written). A new dict; ``written``
    is not changed."""
    scaling = {} if cfg.rope_type == "default" else {"rope_scaling": rope_scaling_of(cfg)}
    return {**written, "rope_theta": cfg.rope_theta, **scaling}


def params_of(hf_cfg: Any, scaling: Any) -> dict[str, Any]:
    """The rotary scaling's parameters of a transformers LlamaConfig of any version (``rope_parameters`` in 5,
    ``rope_scaling`` in 4)."""
    return {**(scaling or {}), **(getattr(hf_cfg, "rope_parameters", None) or {})}


def _rope_fields(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """LlamaConfig's rope_* fields for transformers' rotary ``kind`` and its parameters."""
    if kind == "default":
        return {}
    out: dict[str, Any] = {"rope_type": kind, "rope_factor": float(params.get("factor", 1.0))}
    if kind == "llama3":
        out |= {"rope_low_freq_factor": float(params.get("low_freq_factor", 1.0)),
                "rope_high_freq_factor": float(params.get("high_freq_factor", 4.0)),
                "rope_original_positions": int(params.get("original_max_position_embeddings", 8192))}  # fmt: skip
    return out


def config_from_hf(hf_cfg: Any, cls: type, problems: list[str]) -> Any:
    """The growlm config of class ``cls`` (LlamaConfig or a subclass) of a transformers config of a Llama-shaped
    family, after the refusals every such family shares (another activation, a rotary scaling other than "linear"
    and "llama3", tensor-parallel pretraining_tp > 1) and the caller's own ``problems``.

    Raises:
        ValueError: any problem, in one message, or an invalid shape.
    """
    theta, kind, scaling = _rope(hf_cfg)
    unsupported = list(problems)
    if getattr(hf_cfg, "hidden_act", "silu") != "silu":
        unsupported.append(f"hidden_act={hf_cfg.hidden_act!r} (need 'silu')")
    if kind not in ROPE_TYPES:
        unsupported.append(
            f"rope type {kind!r} ({scaling or hf_cfg.rope_parameters}; growlm computes {', '.join(ROPE_TYPES)})"
        )
    if (getattr(hf_cfg, "pretraining_tp", 1) or 1) > 1:
        unsupported.append(f"pretraining_tp={hf_cfg.pretraining_tp}")
    if unsupported:
        raise ValueError(f"cannot convert this {type(hf_cfg).__name__}: " + "; ".join(unsupported))
    return cls(
        n_layer=hf_cfg.num_hidden_layers,
        n_embd=hf_cfg.hidden_size,
        n_head=hf_cfg.num_attention_heads,
        n_kv_head=hf_cfg.num_key_value_heads or hf_cfg.num_attention_heads,
        n_inner=hf_cfg.intermediate_size,
        head_dim=getattr(hf_cfg, "head_dim", None) or hf_cfg.hidden_size // hf_cfg.num_attention_heads,
        n_positions=hf_cfg.max_position_embeddings,
        vocab_size=hf_cfg.vocab_size,
        rope_theta=theta,
        **_rope_fields(kind, params_of(hf_cfg, scaling)),
        rms_norm_eps=float(hf_cfg.rms_norm_eps),
        tie_word_embeddings=bool(getattr(hf_cfg, "tie_word_embeddings", False)),
        dropout=float(getattr(hf_cfg, "attention_dropout", 0.0) or 0.0),
    )


def from_hf_config(hf_cfg: HFLlamaConfig) -> LlamaConfig:
    """The LlamaConfig of a ``transformers.LlamaConfig``.

    Raises:
        ValueError: the config uses a feature growlm's Llama does not implement (another activation, biases in
            attention or MLP, a rotary scaling other than "linear" and "llama3" (Llama 3.1's), such as "yarn" or
            "dynamic", tensor-parallel pretraining_tp > 1), or its shape is invalid.
    """
    biased = getattr(hf_cfg, "attention_bias", False) or getattr(hf_cfg, "mlp_bias", False)
    return config_from_hf(hf_cfg, LlamaConfig, ["attention_bias / mlp_bias (growlm's Llama has no biases)"] * biased)


def config_from_dict(d: dict[str, Any]) -> LlamaConfig:
    """The LlamaConfig of a ``config.json``'s dict (``model_type`` "llama").

    Raises:
        ValueError: see ``from_hf_config``.
    """
    import transformers  # lazy: heavy (about 2 s), only for a transformers folder

    return from_hf_config(transformers.LlamaConfig.from_dict(d))


def config_problem(d: dict[str, Any], fields: dict[str, str] = CONFIG_FIELDS) -> str | None:
    """What is malformed in the ``config.json`` dict ``d`` of a Llama-shaped family (``fields``: its fields and their
    kinds, ``CONFIG_FIELDS`` or Qwen 2's), as a one-line problem and fix, or None: a value of the wrong kind
    (model.hf_fields), a rotary scaling field of the wrong kind (``ROPE_FIELDS``), hidden_size not divisible by
    num_attention_heads without a head_dim, an odd head_dim (rotary embeddings rotate pairs), or
    num_attention_heads not a multiple of num_key_value_heads. Fields that are absent are transformers' defaults,
    and what growlm's Llama does not compute (a rope type, biases) is ``from_hf_config``'s to refuse."""
    problem = fields_problem(d, fields)
    for name in ("rope_scaling", "rope_parameters"):
        if problem is None and isinstance(d.get(name), dict):
            problem = fields_problem(d[name], ROPE_FIELDS, prefix=f"{name}.")
    if problem is not None:
        return problem
    hidden, heads, kv, head_dim = (d.get(k) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                                        "head_dim"))  # fmt: skip
    if head_dim is None and hidden is not None and heads is not None:
        if hidden % heads:
            return (
                f"config.json: hidden_size {hidden} is not divisible by num_attention_heads {heads} and there is no "
                f"head_dim; give head_dim (the width of one head) or correct num_attention_heads in config.json"
            )
        if (hidden // heads) % 2:
            return (
                f"config.json: hidden_size {hidden} / num_attention_heads {heads} gives heads {hidden // heads} wide, "
                f"not an even width (rotary embeddings rotate pairs of dimensions); give an even head_dim or "
                f"correct num_attention_heads in config.json"
            )
    if head_dim is not None and head_dim % 2:
        return (
            f"config.json: head_dim is {head_dim}, not an even number (rotary embeddings rotate pairs of dimensions); "
            f"{FIX}"
        )
    if heads is not None and kv is not None and heads % kv:
        return (
            f"config.json: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv} (every key/value "
            "head serves as many query heads); correct one of them in config.json"
        )
    return None


def to_hf(model: Llama, bos_token_id: int | None = None, eos_token_id: int | None = None) -> LlamaForCausalLM:
    """A ``LlamaForCausalLM`` holding copies of ``model``'s weights (fp32), in eval mode.

    Raises:
        ValueError: the model still carries growth masks (finish the ramp first), or the names do not match.
    """
    from transformers import LlamaForCausalLM  # lazy: heavy (about 2 s), only for transformers' Llama

    return copy_to_hf(model, LlamaForCausalLM(to_hf_config(model.config, bos_token_id, eos_token_id)))


def copy_to_hf(model: Llama, hf: Any) -> Any:
    """``hf`` (a transformers model of ``model``'s family and shape) holding copies of ``model``'s weights (fp32),
    in eval mode.

    Raises:
        ValueError: the model still carries growth masks (finish the ramp first), or the names do not match.
    """
    if model.growth_masks is not None:
        raise ValueError("model still has growth masks; let the mask ramp finish (masks at 1 are removed) first")
    tied = model.config.tie_word_embeddings
    ours = {k: v.detach().float() for k, v in model.state_dict().items()}
    if tied:
        ours.pop("lm_head.weight", None)
    missing, unexpected = hf.load_state_dict(ours, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and tied)]
    if missing or unexpected:
        raise ValueError(f"state dict mismatch converting to transformers: missing {missing}, unexpected {unexpected}")
    if tied:
        hf.tie_weights()
    return hf.eval()
