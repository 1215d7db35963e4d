"""The model-family registry: every family is complete (config, module, transformers adapter, presets, operators), no
module outside the registry branches on the family, and the Qwen 2 family added through it computes what
transformers' Qwen2ForCausalLM computes (logits both ways, q/k/v biases, tied and untied, GQA, rope scaling), with the
released shapes' parameter counts."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import torch
from init_from_helpers import read_as_init_from

import growlm
from growlm.model.config import PRESETS, config_from_dict, flops_per_token, from_preset, param_count
from growlm.model.hf_fields import KINDS
from growlm.model.layers import CausalLM
from growlm.model.qwen2.config import Qwen2Config
from growlm.model.qwen2.hf import from_hf_config, to_hf, to_hf_config
from growlm.model.qwen2.model import Qwen2
from growlm.model.registry import FAMILIES, build_model, family, family_of_model_type

PACKAGE = Path(growlm.__file__).resolve().parent
FAMILY_CLASSES = {"GPTConfig", "LlamaConfig", "Qwen2Config", "GPT", "Llama", "Qwen2"}
ADAPTER = ("HF_CLASS", "to_hf", "config_from_dict", "config_json", "config_problem")


def family_branches(path: Path) -> list[str]:
    """Every place in ``path`` that branches on a model family: ``arch`` or ``model_type`` compared with a string
    ("gpt2", "llama", ...), or an ``isinstance`` / ``issubclass`` against a family's config or model class."""
    tree = ast.parse(path.read_text())
    out = []

    def named(node: ast.AST, names: set[str]) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr in names) or (
            isinstance(node, ast.Name) and node.id in names
        )

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            keyed = any(named(s, {"arch", "model_type"}) for s in sides) or any(
                isinstance(s, ast.Subscript)
                and isinstance(s.slice, ast.Constant)
                and s.slice.value in ("arch", "model_type")
                for s in sides
            )
            literal = any(isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides)
            if keyed and literal:
                out.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass")
        ):
            classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            if any(named(c, FAMILY_CLASSES) for c in classes):
                out.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return out


def test_no_family_branch_outside_the_registry():
    files = [p for p in PACKAGE.rglob("*.py") if "tests" not in p.relative_to(PACKAGE).parts[:1]]
    files = [p for p in files if not p.relative_to(PACKAGE).parts[0].startswith(".")]
    assert len(files) > 100  # the whole package was read
    branches = [b for p in sorted(files) if p != PACKAGE / "model" / "registry.py" for b in family_branches(p)]
    assert branches == [], "family branches outside model/registry.py: " + ", ".join(branches)


def test_the_branch_counter_finds_branches(tmp_path):
    (tmp_path / "x.py").write_text(
        'if cfg.arch == "llama":\n    pass\nif d["model_type"] != "gpt2":\n    pass\n'
        "isinstance(c, (int, LlamaConfig))\nif a.arch == b.arch:\n    pass\n"
    )
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path
    try:
        assert family_branches(tmp_path / "x.py") == ["x.py:1", "x.py:3", "x.py:5"]
    finally:
        PACKAGE = saved


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_every_family_is_complete(arch):
    f = family(arch)
    assert f.config.arch == arch and issubclass(f.model, CausalLM)
    assert all(callable(getattr(f.hf, name)) or name == "HF_CLASS" for name in ADAPTER)
    assert set(f.hf.CONFIG_FIELDS.values()) <= set(KINDS)  # every field of a kind model.hf_fields checks
    assert family_of_model_type(f.model_type) is f
    ops = importlib.import_module(f.operators)
    assert callable(ops.make_rules)
    assert f.presets and all(type(c) is f.config for c in f.presets.values())
    name = next(iter(f.presets))
    cfg = from_preset(name)
    assert config_from_dict(cfg.to_dict()) == cfg and type(build_model(cfg)) is f.model
    assert PRESETS[name] is f.presets[name]


def test_unknown_families_are_refused():
    with pytest.raises(ValueError, match="unknown model arch 'mistral'; growlm builds"):
        family("mistral")
    assert family_of_model_type("mistral") is None
    with pytest.raises(ValueError, match="unknown model arch 'mistral'"):
        config_from_dict({"arch": "mistral"})


def test_qwen_presets_have_the_released_parameter_counts():
    """Qwen2.5-0.5B and 1.5B (their config.json files: tied, 151,936 tokens, q/k/v biases): 494,032,768 and
    1,543,714,304 parameters, as transformers' Qwen2ForCausalLM of the same config counts them (built on the meta
    device); the FLOPs count every weight once (tied)."""
    from transformers import Qwen2ForCausalLM

    for name, released in (("qwen2.5-0.5b", 494_032_768), ("qwen2.5-1.5b", 1_543_714_304)):
        cfg = PRESETS[name]
        assert param_count(cfg) == released, name
        with torch.device("meta"):
            hf = Qwen2ForCausalLM(to_hf_config(cfg))
        assert sum(p.numel() for p in hf.parameters()) == released, name
        with torch.device("meta"):
            ours = build_model(cfg)
        assert sum(p.numel() for p in ours.parameters()) == released, name
        assert flops_per_token(cfg, 1) == 6 * released + 12 * cfg.n_layer * cfg.n_head * cfg.head_dim
    assert PRESETS["qwen2.5-0.5b"].shape_str().startswith("qwen2 L=24 d=896 H=14 K=2 Q=64 F=4864 P=32768 V=151936 tied")


QWEN_SHAPES = [  # (n_head, n_kv_head, tied, rope scaling)
    (8, 2, True, None),
    (4, 1, False, None),
    (4, 4, True, None),
    (8, 2, False, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 16}),
]  # fmt: skip


@pytest.mark.parametrize("n_head,n_kv_head,tied,scaling", QWEN_SHAPES)
def test_qwen2_logits_equal_transformers_both_ways(n_head, n_kv_head, tied, scaling, tmp_path):
    """transformers' Qwen2ForCausalLM (its init, then non-zero biases, non-trivial gains), saved and read back as
    --init_from reads a folder, gives logits within 1e-5 of it, and so does its ``to_hf`` export, on 48 positions
    (past the original context of the scaled case)."""
    from transformers import Qwen2Config as HFQwen2Config
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    kw = dict(vocab_size=131, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=n_head,
              num_key_value_heads=n_kv_head, max_position_embeddings=48, tie_word_embeddings=tied, rope_theta=1e6,
              rms_norm_eps=1e-6)  # fmt: skip
    if scaling:
        kw["rope_scaling"] = scaling
    hf = Qwen2ForCausalLM(HFQwen2Config(**kw)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.add_((0.1 if "norm" in name or name.endswith("bias") else 0.05) * torch.randn_like(p))
    assert hf.model.layers[0].self_attn.q_proj.bias.abs().min() > 0
    ours = read_as_init_from(hf, tmp_path / "hf")
    assert type(ours) is Qwen2 and ours.config.tie_word_embeddings == tied and ours.config.n_kv_head == n_kv_head
    assert ours.config.rope_type == ("llama3" if scaling else "default") and ours.config.rope_theta == 1e6
    idx = torch.randint(0, 131, (3, 48))
    with torch.no_grad():
        theirs = hf(idx).logits
        assert (ours(idx) - theirs).abs().max().item() <= 1e-5
        back = to_hf(ours)
        assert type(back) is Qwen2ForCausalLM
        assert (back(idx).logits - theirs).abs().max().item() <= 1e-5


@pytest.mark.bad_input
def test_qwen2_sliding_window_is_refused():
    from transformers import Qwen2Config as HFQwen2Config

    hf_cfg = HFQwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, use_sliding_window=True, sliding_window=16)  # fmt: skip
    with pytest.raises(ValueError, match="^cannot convert this Qwen2Config: use_sliding_window=True"):
        from_hf_config(hf_cfg)


def test_qwen2_config_round_trips_and_keeps_its_family():
    cfg = from_preset("qwen2-tiny", n_embd=128)
    assert type(cfg) is Qwen2Config and cfg.head_dim == 32 and cfg.n_inner == 384 and cfg.qkv_bias
    d = cfg.to_dict()
    assert d["arch"] == "qwen2" and config_from_dict(d) == cfg
    with pytest.raises(ValueError, match="config is for arch 'llama', not 'qwen2'"):
        Qwen2Config.from_dict({**d, "arch": "llama"})
