"""Growth operators of the Llama-shaped families (growth.ops.llama), each test run for Llama and for Qwen 2 (q/k/v
biases, which every operator carries): every duplication operator and its masked counterpart keeps the logits (eval,
fp32) of a trained GQA model, tied and untied; the Adam moments follow each operator's rule element by element and
match the grown model's real gradients; symmetry noise stays exact; refusals say what to change."""

import sys
from functools import lru_cache

import pytest
import torch

from growlm.growth.errors import GrowthError
from growlm.growth.ops import make_rules
from growlm.growth.ops.apply import OptimizerPolicy, apply_rules, fresh_entries
from growlm.growth.ops.common import ZERO_ENTRY_UPDATE, replica_map
from growlm.growth.ops.llama import head_sources
from growlm.growth.ops.rules import check_rules, param_shapes, tied_aliases
from growlm.growth.ops.single_process import TrainingState, from_modules, grow_state, make_optimizer, to_modules
from growlm.growth.ops.stores import ModuleStore
from growlm.model.config import GPTConfig, LlamaConfig
from growlm.model.llama.config import llama_head_index
from growlm.model.llama.model import Llama
from growlm.model.qwen2.config import Qwen2Config
from growlm.model.registry import build_model
from growlm.model.registry import family as family_of

HP = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
Z2 = ZERO_ENTRY_UPDATE**2
EXACT = dict(rtol=1e-6, atol=0.0)  # rules that only copy or scale: equal to rounding
CLS: type[LlamaConfig] = LlamaConfig  # the family under test (the ``family`` fixture sets it)
QKV_BIASES = ("q_proj.bias", "k_proj.bias", "v_proj.bias")


@pytest.fixture(autouse=True, params=[LlamaConfig, Qwen2Config], ids=["llama", "qwen2"])
def family(request, monkeypatch):
    """Every test once per Llama-shaped family: Llama, and Qwen 2 (q/k/v biases)."""
    monkeypatch.setattr(sys.modules[__name__], "CLS", request.param)
    return request.param


def cfg(**kw) -> LlamaConfig:
    """L=2, d=32, H=4, K=2 (2 query heads per key/value head), Q=8, F=48, 16 positions, vocab 97, of the family
    under test."""
    base = dict(n_layer=2, n_embd=32, n_head=4, n_kv_head=2, head_dim=8, n_inner=48, n_positions=16, vocab_size=97,
                tie_word_embeddings=False)  # fmt: skip
    return CLS(**(base | kw))


def tokens(c: LlamaConfig, seed: int = 1, t: int = 12) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, c.vocab_size, (2, t), generator=g)


def random_llama(c: LlamaConfig, dtype: torch.dtype = torch.float32) -> Llama:
    """Llama(c) with its RMSNorm gains moved off 1 and its biases (Qwen 2) off 0 (so none is trivial)."""
    torch.manual_seed(0)
    model = build_model(c).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def trained(tie: bool) -> TrainingState:
    """The state of cfg(tie) after two AdamW steps (non-zero moments everywhere). grow_state leaves it untouched."""
    return _trained(tie, CLS)


@lru_cache(maxsize=4)
def _trained(tie: bool, cls: type) -> TrainingState:
    model = random_llama(cfg(tie_word_embeddings=tie)).train()
    opt = make_optimizer(model, HP)
    for seed in range(2):
        x = tokens(model.config, seed=10 + seed, t=16)
        opt.zero_grad()
        model(x[:, :-1], x[:, 1:]).backward()
        opt.step()
    return from_modules(model.eval(), opt)


def logits(state: TrainingState, x: torch.Tensor) -> torch.Tensor:
    model, _, _ = to_modules(state)
    with torch.no_grad():
        return model.eval()(x)


DUPLICATE = {
    "width": (dict(n_embd=64, n_head=8, n_kv_head=4, n_inner=96), {}),
    "width_split_noise": (
        dict(n_embd=64, n_head=8, n_kv_head=4, n_inner=96),
        dict(pattern="split", alpha=0.7, symmetry="noise", noise_std=1.0),
    ),
    "width_x3_noise": (dict(n_embd=96, n_head=12, n_kv_head=6, n_inner=144), dict(symmetry="noise")),
    "heads_in_groups": (dict(n_head=8), {}),  # g 2 -> 4
    "heads_and_kv": (dict(n_head=8, n_kv_head=4), {}),
    "heads_6_3": (dict(n_head=6, n_kv_head=3), {}),
    "heads_noise": (dict(n_head=12), dict(symmetry="noise")),
    "heads_and_kv_noise": (dict(n_head=8, n_kv_head=4), dict(symmetry="noise", noise_std=1.0)),
    "ffn": (dict(n_inner=53), {}),
    "ffn_noise": (dict(n_inner=96), dict(symmetry="noise")),
    "ffn_53_noise": (dict(n_inner=53), dict(symmetry="noise", noise_std=1.0)),
    "depth_interleave": (dict(n_layer=3), {}),
    "depth_stack": (dict(n_layer=4), dict(layer_order="stack")),
    "all": (dict(n_embd=64, n_head=12, n_kv_head=4, n_inner=100, n_layer=3), dict(symmetry="noise")),
}
MASKED = {
    "width": (dict(n_embd=64, n_head=8, n_kv_head=4, n_inner=96), {}),
    "n_embd_only": (dict(n_embd=40), dict(init_std=1.0)),
    "heads_in_groups": (dict(n_head=8), dict(init_std=1.0)),
    "heads_and_kv": (dict(n_head=8, n_kv_head=4), {}),
    "ffn": (dict(n_inner=53), dict(init_std=1.0)),
    "depth_copy": (dict(n_layer=3), {}),
    "depth_fresh": (dict(n_layer=4), dict(new_layers="fresh", layer_order="interleave")),
    "all": (dict(n_embd=40, n_head=6, n_kv_head=3, n_inner=50, n_layer=3), dict(init_std=0.5, bias_std=0.5)),
}


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize(
    ("family", "case"), [("duplicate", c) for c in DUPLICATE] + [("masked", c) for c in MASKED]
)  # fmt: skip
def test_growth_keeps_logits(family, case, tie):
    target, opts = (DUPLICATE if family == "duplicate" else MASKED)[case]
    state = trained(tie)
    plan = make_rules(state.config, cfg(tie_word_embeddings=tie, **target), family, **opts)
    assert plan.exact and plan.family == family
    grown = grow_state(state, plan)
    assert grown.config == plan.new and grown.adam_step == state.adam_step
    x = tokens(state.config)
    assert (logits(grown, x) - logits(state, x)).abs().max().item() <= 1e-5


def test_plain_depth_copy_is_not_exact():
    state = trained(False)
    plan = make_rules(state.config, cfg(n_layer=4), "duplicate", exact=False)
    assert not plan.exact
    x = tokens(state.config)
    assert (logits(grow_state(state, plan), x) - logits(state, x)).abs().max().item() > 1e-3


def _attention_io(model: Llama, x: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """Per block: the k_proj and v_proj outputs (B, T, K Q) and o_proj's input (B, T, H Q: the query heads' attention
    outputs side by side), of one eval forward of ``model`` on ``x``."""
    out: list[dict[str, torch.Tensor]] = [{} for _ in model.model.layers]
    hooks = []
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        for s, mod in (("k", attn.k_proj), ("v", attn.v_proj)):
            hooks.append(mod.register_forward_hook(lambda _m, _a, y, i=i, s=s: out[i].__setitem__(s, y.detach())))
        hooks.append(attn.o_proj.register_forward_pre_hook(lambda _m, a, i=i: out[i].__setitem__("o", a[0].detach())))
    with torch.no_grad():
        model.eval()(x)
    for h in hooks:
        h.remove()
    return out


READS = {  # target, options, source of grown query head p (H = 4 old heads)
    "width_x2": (dict(n_embd=64, n_head=8, n_kv_head=4, n_inner=96), {}, lambda p: p % 4),
    "width_x3_split_noise": (
        dict(n_embd=96, n_head=12, n_kv_head=6, n_inner=144),
        dict(pattern="split", alpha=0.6, symmetry="noise"),
        lambda p: p % 4,
    ),
    "heads_12_2": (dict(n_head=12), {}, lambda p: head_sources(cfg(), 12, 2)[0][p].item()),
    "heads_8_4": (dict(n_head=8, n_kv_head=4), {}, lambda p: head_sources(cfg(), 8, 4)[0][p].item()),
    "width_then_heads": (  # width x2 gives 8 heads (kv 4): copy j of head h at 4 j + h; then heads 8 -> 12
        dict(n_embd=64, n_head=12, n_kv_head=4, n_inner=96),
        {},
        lambda p: head_sources(cfg(n_embd=64, n_head=8, n_kv_head=4, n_inner=96), 12, 4)[0][p].item() % 4,
    ),
}


@pytest.mark.parametrize("case", list(READS))
def test_grown_query_heads_read_their_sources_kv_head(case):
    """Grow a trained model with the operator, run both models, and for every block and every grown query head p
    (source h): the key/value head p reads (p // g', Llama's grouping) holds the keys and values of h's key/value head
    (h // g) in the small model, and p's attention output equals h's. A head reading any other key/value head would
    see other keys and values (the small model's two key/value heads differ)."""
    target, opts, source = READS[case]
    state = trained(False)
    plan = make_rules(state.config, cfg(**target), "duplicate", **opts)
    x = tokens(state.config)
    small = _attention_io(to_modules(state)[0], x)
    big = _attention_io(to_modules(grow_state(state, plan))[0], x)
    q, g, g_new = 8, 2, plan.new.group_size
    assert (small[0]["k"][..., :q] - small[0]["k"][..., q:]).abs().max() > 1e-2  # the two kv heads differ

    def head(t: torch.Tensor, j: int) -> torch.Tensor:
        return t[..., j * q : (j + 1) * q]

    for i in range(state.config.n_layer):
        for p in range(plan.new.n_head):
            h = source(p)
            for s in ("k", "v"):
                torch.testing.assert_close(head(big[i][s], p // g_new), head(small[i][s], h // g), rtol=0, atol=1e-5)
            torch.testing.assert_close(head(big[i]["o"], p), head(small[i]["o"], h), rtol=0, atol=1e-5)


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_width_moments_by_rule(tie):
    """Width x2, block pattern: matrices [[W, 0], [0, W]], exp_avg [[m/2, 0], [0, m/2]], exp_avg_sq v/4 on the
    diagonal blocks and v / (4 s0^2) off it; embedding and gains [x, x] with m/2, v/4; the tied head's final norm
    [g/2, g/2] with m, 4v; the untied head [W/2, W/2] with m, 4v and its final norm tiled like the others."""
    state = trained(tie)
    old = state.config
    target = cfg(tie_word_embeddings=tie, n_embd=64, n_head=8, n_kv_head=4, n_inner=96)
    grown = grow_state(state, make_rules(old, target, "duplicate"))
    for i in range(old.n_layer):
        for s in ("q_proj", "k_proj", "v_proj", "o_proj"):
            _check_kron(state, grown, f"model.layers.{i}.self_attn.{s}.weight")
        for s in ("gate_proj", "up_proj", "down_proj"):
            _check_kron(state, grown, f"model.layers.{i}.mlp.{s}.weight")
        for s in ("input_layernorm", "post_attention_layernorm"):
            _check_tiled(state, grown, f"model.layers.{i}.{s}.weight", 1.0, 0.5, 0.25)
        for s in QKV_BIASES if old.qkv_bias else ():  # a bias as its row blocks: [b, b], m/2, v/4
            _check_tiled(state, grown, f"model.layers.{i}.self_attn.{s}", 1.0, 0.5, 0.25)
    _check_tiled(state, grown, "model.embed_tokens.weight", 1.0, 0.5, 0.25)
    if tie:
        _check_tiled(state, grown, "model.norm.weight", 0.5, 1.0, 4.0)
        assert "lm_head.weight" not in grown.params
    else:
        _check_tiled(state, grown, "model.norm.weight", 1.0, 0.5, 0.25)
        _check_tiled(state, grown, "lm_head.weight", 0.5, 1.0, 4.0)


def _check_kron(state, grown, name):
    old, new = state.params[name], grown.params[name]
    n, m = old.weight.shape
    for (a, b), diag in (((0, 0), True), ((1, 1), True), ((0, 1), False), ((1, 0), False)):
        blk = (slice(a * n, (a + 1) * n), slice(b * m, (b + 1) * m))
        torch.testing.assert_close(new.weight[blk], old.weight if diag else torch.zeros_like(old.weight), **EXACT)
        torch.testing.assert_close(new.exp_avg[blk], old.exp_avg / 2 if diag else 0 * old.exp_avg, **EXACT)
        torch.testing.assert_close(new.exp_avg_sq[blk], old.exp_avg_sq / 4 / (1 if diag else Z2), **EXACT)


def _check_tiled(state, grown, name, w_scale, m_scale, v_scale):
    old, new = state.params[name], grown.params[name]
    for got, ref, scale in zip(new, old, (w_scale, m_scale, v_scale), strict=True):
        torch.testing.assert_close(got, torch.cat([ref, ref], dim=-1) * scale, **EXACT)


@pytest.mark.parametrize("order", ["interleave", "stack"])
def test_depth_moments_by_rule(order):
    """Copies carry their source block's weights and moments; with exact=True their o_proj and down_proj are 0,
    exp_avg 0 and exp_avg_sq the source's / s0^2. interleave: L0 L0' L1 L1'; stack: L0 L1 L0' L1'."""
    state = trained(False)
    grown = grow_state(state, make_rules(state.config, cfg(n_layer=4), "duplicate", layer_order=order))
    sources = [0, 0, 1, 1] if order == "interleave" else [0, 1, 0, 1]
    copies = [1, 3] if order == "interleave" else [2, 3]
    for i, src in enumerate(sources):
        for name, new in grown.params.items():
            if not name.startswith(f"model.layers.{i}."):
                continue
            old = state.params[name.replace(f"layers.{i}.", f"layers.{src}.")]
            zeroed = i in copies and name.endswith(("o_proj.weight", "down_proj.weight"))
            torch.testing.assert_close(new.weight, 0 * old.weight if zeroed else old.weight, **EXACT)
            torch.testing.assert_close(new.exp_avg, 0 * old.exp_avg if zeroed else old.exp_avg, **EXACT)
            torch.testing.assert_close(new.exp_avg_sq, old.exp_avg_sq / (Z2 if zeroed else 1), **EXACT)
    for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        torch.testing.assert_close(grown.params[name].exp_avg, state.params[name].exp_avg, **EXACT)


def test_ffn_moments_by_rule():
    """Net2Net replicas: gate/up rows copy unit g(j) with exp_avg / n, exp_avg_sq / n^2; down_proj columns are
    divided by n with exp_avg copied and exp_avg_sq x n^2."""
    state = trained(False)
    grown = grow_state(state, make_rules(state.config, cfg(n_inner=53), "duplicate"))
    g, n = replica_map(48, 53)
    n = n[g].float()
    for i in range(2):
        for s in ("gate_proj", "up_proj"):
            name = f"model.layers.{i}.mlp.{s}.weight"
            old, new = state.params[name], grown.params[name]
            torch.testing.assert_close(new.weight, old.weight[g], **EXACT)
            torch.testing.assert_close(new.exp_avg, old.exp_avg[g] / n[:, None], **EXACT)
            torch.testing.assert_close(new.exp_avg_sq, old.exp_avg_sq[g] / n[:, None] ** 2, **EXACT)
        name = f"model.layers.{i}.mlp.down_proj.weight"
        old, new = state.params[name], grown.params[name]
        torch.testing.assert_close(new.weight, old.weight[:, g] / n, **EXACT)
        torch.testing.assert_close(new.exp_avg, old.exp_avg[:, g], **EXACT)
        torch.testing.assert_close(new.exp_avg_sq, old.exp_avg_sq[:, g] * n**2, **EXACT)


@pytest.mark.parametrize(("n_head", "n_kv_head"), [(8, 2), (8, 4), (6, 3)])
def test_heads_moments_by_rule(n_head, n_kv_head):
    """Old query heads at llama_head_index with their rows and moments; new heads copy an old head of the group
    their key/value head copies (rows and exp_avg_sq; exp_avg 0, their gradient at growth), their o_proj columns 0
    with exp_avg 0 and exp_avg_sq the source's / s0^2; old key/value heads stay at 0..K-1, new ones copy j mod K
    (rows and exp_avg_sq; exp_avg 0)."""
    state = trained(True)
    q = 8
    target = cfg(tie_word_embeddings=True, n_head=n_head, n_kv_head=n_kv_head)
    grown = grow_state(state, make_rules(state.config, target, "duplicate"))
    index = llama_head_index(4, 2, n_head, n_kv_head)
    q_src, kv_src, is_new = head_sources(state.config, n_head, n_kv_head)
    assert q_src[index].tolist() == [0, 1, 2, 3] and not is_new[index].any() and int(is_new.sum()) == n_head - 4
    g_new = n_head // n_kv_head
    for p in range(n_head):  # a new head reads (a copy of) the key/value head its source reads
        assert kv_src[p // g_new].item() == q_src[p].item() // 2
    for i in range(2):
        pre = f"model.layers.{i}.self_attn."
        old_q, new_q = state.params[pre + "q_proj.weight"], grown.params[pre + "q_proj.weight"]
        old_o, new_o = state.params[pre + "o_proj.weight"], grown.params[pre + "o_proj.weight"]
        for p in range(n_head):
            h = q_src[p].item()
            rows, new_rows = slice(h * q, (h + 1) * q), slice(p * q, (p + 1) * q)
            z = 0.0 if is_new[p] else 1.0
            torch.testing.assert_close(new_q.weight[new_rows], old_q.weight[rows], **EXACT)
            torch.testing.assert_close(new_q.exp_avg[new_rows], z * old_q.exp_avg[rows], **EXACT)
            torch.testing.assert_close(new_q.exp_avg_sq[new_rows], old_q.exp_avg_sq[rows], **EXACT)
            torch.testing.assert_close(new_o.weight[:, new_rows], z * old_o.weight[:, rows], **EXACT)
            torch.testing.assert_close(new_o.exp_avg[:, new_rows], z * old_o.exp_avg[:, rows], **EXACT)
            v_scale = 1 / Z2 if is_new[p] else 1.0
            torch.testing.assert_close(new_o.exp_avg_sq[:, new_rows], v_scale * old_o.exp_avg_sq[:, rows], **EXACT)
            if state.config.qkv_bias:  # the bias follows its rows
                old_b, new_b = state.params[pre + "q_proj.bias"], grown.params[pre + "q_proj.bias"]
                torch.testing.assert_close(new_b.weight[new_rows], old_b.weight[rows], **EXACT)
                torch.testing.assert_close(new_b.exp_avg[new_rows], z * old_b.exp_avg[rows], **EXACT)
                torch.testing.assert_close(new_b.exp_avg_sq[new_rows], old_b.exp_avg_sq[rows], **EXACT)
        kept = (torch.arange(n_kv_head) < 2).double()[:, None, None]  # old key/value heads keep their exp_avg
        biases = ("k_proj.bias", "v_proj.bias") if state.config.qkv_bias else ()
        for s in ("k_proj.weight", "v_proj.weight", *biases):
            new, old = grown.params[pre + s], state.params[pre + s]
            for t_new, t_old, scale in zip(new, old, (1.0, kept, 1.0), strict=True):
                want = (t_old.view(2, q, -1)[kv_src] * scale).reshape(n_kv_head * q, -1)
                torch.testing.assert_close(t_new, want.to(t_old.dtype).reshape(t_new.shape), **EXACT)


def test_masked_moments_old_carried_new_zero():
    """Masked growth of every dimension: old weights and moments at their places (hidden [0, d), FFN [0, F),
    key/value heads [0, K), query heads at llama_head_index), new entries' moments 0, new gains 1 (bias_std 0),
    the copied block's moments 0; the mask spec records K."""
    state = trained(False)
    plan = make_rules(state.config, cfg(n_embd=40, n_head=6, n_kv_head=3, n_inner=50, n_layer=3), "masked")
    assert plan.masks.old_n_kv_head == 2 and plan.masks.new_layers == (2,)
    grown = grow_state(state, plan)
    q_units = (llama_head_index(4, 2, 6, 3)[:, None] * 8 + torch.arange(8)).flatten()
    places = {
        "self_attn.q_proj.weight": (q_units, torch.arange(32)),
        "self_attn.k_proj.weight": (torch.arange(16), torch.arange(32)),
        "self_attn.v_proj.weight": (torch.arange(16), torch.arange(32)),
        "self_attn.o_proj.weight": (torch.arange(32), q_units),
        "mlp.gate_proj.weight": (torch.arange(48), torch.arange(32)),
        "mlp.up_proj.weight": (torch.arange(48), torch.arange(32)),
        "mlp.down_proj.weight": (torch.arange(32), torch.arange(48)),
        "input_layernorm.weight": (torch.arange(32),),
        "post_attention_layernorm.weight": (torch.arange(32),),
    }
    if state.config.qkv_bias:
        places |= {"self_attn.q_proj.bias": (q_units,), "self_attn.k_proj.bias": (torch.arange(16),),
                   "self_attn.v_proj.bias": (torch.arange(16),)}  # fmt: skip
    names = {f"model.layers.{i}.{s}": (f"model.layers.{i}.{s}", ix) for i in range(2) for s, ix in places.items()}
    names |= {n: (n, (torch.arange(97), torch.arange(32))) for n in ("model.embed_tokens.weight", "lm_head.weight")}
    names["model.norm.weight"] = ("model.norm.weight", (torch.arange(32),))
    for name, (src, ix) in names.items():
        old, new = state.params[src], grown.params[name]
        sel = (ix[0][:, None], ix[1][None, :]) if len(ix) == 2 else ix
        is_old = torch.zeros_like(new.weight, dtype=torch.bool)
        is_old[sel] = True
        for t_new, t_old in zip(new, old, strict=True):
            torch.testing.assert_close(t_new[sel], t_old, rtol=0, atol=0)
        assert new.exp_avg[~is_old].abs().max() == 0 and new.exp_avg_sq[~is_old].abs().max() == 0, name
        if new.weight.dim() == 1:  # new gains 1, new bias entries 0 (bias_std 0)
            assert (new.weight[~is_old] == (0.0 if name.endswith("bias") else 1.0)).all(), name
        elif (~is_old).any():
            assert new.weight[~is_old].abs().max() > 0, name
    for name, new in grown.params.items():  # the gated copy of block 0 (stack order)
        if name.startswith("model.layers.2."):
            assert new.exp_avg.abs().max() == 0 and new.exp_avg_sq.abs().max() == 0


def loss64(model, x):
    """Mean CE in the model's dtype (Llama.forward's own loss is fp32)."""
    return torch.nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())


@pytest.mark.parametrize(
    ("tie", "target"),
    [
        (True, dict(n_embd=64, n_head=8, n_kv_head=4, n_inner=96)),
        (False, dict(n_embd=64, n_head=8, n_kv_head=4, n_inner=96)),
        (False, dict(n_inner=53)),
        (True, dict(n_head=8, n_kv_head=4)),
    ],
    ids=["width_tied", "width_untied", "ffn", "heads"],
)
def test_moment_rule_matches_real_gradients(tie, target):
    """exp_avg maps like the real gradient of the grown model (where momentum is carried); exp_avg_sq like the
    gradient squared / s^2, s the entry's first-update scale: 1 for copies, s0 for entries 0 at growth, 1/k for the
    tied final norm and the untied lm_head, 1/n for Net2Net down_proj columns. Heads growth's q/k/v rows of new
    heads: real gradient 0 (their o_proj columns are 0) and exp_avg 0, checked; their exp_avg_sq is the source's
    (first updates as small as the source's), not the zero gradient's square."""
    old = cfg(tie_word_embeddings=tie)
    small = random_llama(old, torch.float64)
    plan = make_rules(old, cfg(tie_word_embeddings=tie, **target), "duplicate")
    big = build_model(plan.new).double()
    apply_rules(plan, ModuleStore(small), ModuleStore(big))
    x = tokens(old, t=13)
    loss64(small, x).backward()
    loss64(big, x).backward()
    k = plan.new.n_embd // old.n_embd
    heads_grow = k == 1 and (plan.new.n_head, plan.new.n_kv_head) != (old.n_head, old.n_kv_head)
    is_new_head = head_sources(old, plan.new.n_head, plan.new.n_kv_head)[2] if heads_grow else None
    for name, rule in plan.rules.items():
        g_old, g_new = small.get_parameter(rule.source or name).grad, big.get_parameter(name).grad
        momentum = rule.exp_avg(torch.ones_like(g_old)) != 0
        s = torch.where(momentum, 1.0, ZERO_ENTRY_UPDATE).double()
        if (name == "model.norm.weight" and tie) or name == "lm_head.weight":
            s = s / k
        if name.endswith("down_proj.weight") and plan.new.ffn_dim != k * old.ffn_dim:
            g, n = replica_map(old.ffn_dim, plan.new.ffn_dim)
            s = s / n[g][None, :]
        checked = torch.ones_like(g_new, dtype=torch.bool)
        if is_new_head is not None and "_proj." in name and name.split(".")[-2] in ("q_proj", "k_proj", "v_proj"):
            new_rows = is_new_head if "q_proj" in name else torch.arange(plan.new.n_kv_head) >= old.n_kv_head
            rows = new_rows.repeat_interleave(old.head_dim)
            checked = ~(rows[:, None].expand_as(g_new) if g_new.dim() == 2 else rows)
            assert g_new[~checked].abs().max().item() == 0.0, name
            assert rule.exp_avg(g_old)[~checked].abs().max().item() == 0.0, name
        scale = g_new.abs().max().item()  # RMSNorm's statistics are fp32 even in a float64 model
        sel = momentum & checked
        torch.testing.assert_close(rule.exp_avg(g_old)[sel], g_new[sel], rtol=0, atol=1e-6 * scale)
        v_true = g_new**2 / s**2
        torch.testing.assert_close(
            rule.exp_avg_sq(g_old**2)[checked], v_true[checked], rtol=1e-5, atol=1e-6 * scale**2 / Z2
        )
        if name.endswith("gate_proj.weight") and k > 1:  # each duplicate gets exactly 1/k of the gradient
            f, d = g_old.shape
            torch.testing.assert_close(g_new[:f, :d], g_old / k, rtol=0, atol=1e-6 * scale)


@pytest.mark.parametrize("target", [dict(n_embd=40, n_head=6, n_kv_head=3, n_inner=50, n_layer=3), dict(n_head=8)])
def test_masked_gradients_into_new_units_are_zero(target):
    """At mask 0 every new entry gets exactly zero gradient; old entries of the original blocks keep the small
    model's gradient."""
    old = cfg()
    small = random_llama(old)
    plan = make_rules(old, cfg(**target), "masked", init_std=0.5, bias_std=0.5)
    big = Llama(plan.new, masks=plan.masks)
    apply_rules(plan, ModuleStore(small), ModuleStore(big))
    x = tokens(old, t=13)
    small(x[:, :-1], x[:, 1:]).backward()
    big(x[:, :-1], x[:, 1:]).backward()
    for name, rule in plan.rules.items():
        g_old, g_new = small.get_parameter(rule.source or name).grad, big.get_parameter(name).grad
        new_units = rule.exp_avg_sq(torch.ones_like(g_old)) == 0
        if new_units.any():
            assert g_new[new_units].abs().max().item() == 0.0, name
        if not rule.source and not new_units.all():
            torch.testing.assert_close(rule.exp_avg(g_old)[~new_units], g_new[~new_units], rtol=1e-4, atol=1e-6)


def test_symmetry_noise_breaks_the_copies_exactly():
    """symmetry='noise' makes the grown blocks differ from kron(P^T, W) (off-diagonal blocks non-zero, diagonal
    blocks unequal) while the logits stay (test_growth_keeps_logits) those of the small model."""
    state = trained(False)
    target = cfg(n_embd=64, n_head=8, n_kv_head=4, n_inner=96)
    grown = grow_state(state, make_rules(state.config, target, "duplicate", symmetry="noise"))
    w = grown.params["model.layers.0.mlp.up_proj.weight"].weight
    assert w[:48, 32:].abs().max() > 1e-3 and (w[:48, :32] - w[48:, 32:]).abs().max() > 1e-3


def _ffn_pairs(n_inner: int) -> list[tuple[str, list[int], list[int]]]:
    """(parameter, rows, their copies' rows) of every FFN replica: gate/up rows j >= 48 copy row g(j)."""
    g, _ = replica_map(48, n_inner)
    new = list(range(48, n_inner))
    names = [f"model.layers.{i}.mlp.{s}.weight" for i in range(2) for s in ("gate_proj", "up_proj")]
    return [(name, new, g[48:].tolist()) for name in names]


def _head_pairs(n_head: int) -> list[tuple[str, list[int], list[int]]]:
    """(q_proj, rows, rows) of every two new query heads that copy one old head (same weights at growth)."""
    q_src, _, is_new = head_sources(cfg(), n_head, 2)
    new = torch.nonzero(is_new).flatten().tolist()
    pairs = [(a, b) for a in new for b in new if a < b and q_src[a] == q_src[b]]
    assert pairs
    a = [u for h, _ in pairs for u in range(h * 8, h * 8 + 8)]
    b = [u for _, h in pairs for u in range(h * 8, h * 8 + 8)]
    return [(f"model.layers.{i}.self_attn.q_proj.weight", a, b) for i in range(2)]


SYMMETRY = {"ffn": (dict(n_inner=96), _ffn_pairs(96)), "heads": (dict(n_head=12), _head_pairs(12))}


@pytest.mark.parametrize("case", list(SYMMETRY))
def test_symmetry_noise_parts_ffn_and_head_copies(case):
    """FFN 48 -> 96 (every unit replicated) and heads 4 -> 12 at K = 2 (new heads 2 and 4 copy head 0, 3 and 5 head
    1, ...): with symmetry 'none' the plan says the copies stay identical, and after 5 AdamW steps they still are
    bit for bit; with 'noise' there is no such note, the logits stay within 1e-5 (fp32), the copies differ at growth
    and after the 5 steps."""
    target, pairs = SYMMETRY[case]
    state = trained(False)
    x = tokens(state.config)
    for symmetry in ("none", "noise"):
        plan = make_rules(state.config, cfg(**target), "duplicate", symmetry=symmetry)
        note = [n for n in plan.notes if "copies stay identical; symmetry 'noise' breaks that" in n]
        assert len(note) == (symmetry == "none") == len(plan.notes), plan.notes
        grown = grow_state(state, plan)
        assert (logits(grown, x) - logits(state, x)).abs().max().item() <= 1e-5
        model, opt, _ = to_modules(grown)
        model.train()
        for name, a, b in pairs:  # at growth: gate/up replicas are still copies (the noise is in down_proj)
            w = model.get_parameter(name)
            assert torch.equal(w[a], w[b]) == (symmetry == "none" or case == "ffn"), name
        for step in range(5):
            xb = tokens(state.config, seed=100 + step, t=16)
            opt.zero_grad()
            model(xb[:, :-1], xb[:, 1:]).backward()
            opt.step()
        for name, a, b in pairs:
            w = model.get_parameter(name).detach()
            if symmetry == "none":
                assert torch.equal(w[a], w[b]), name
            else:  # every copy has come apart
                assert (w[a] - w[b]).abs().amax(dim=1).min().item() > 1e-6, name


def test_ffn_noise_sums_to_zero_over_each_units_replicas():
    """F 48 -> 53: units 0-4 get one replica each (48-52), the others none. down_proj = W[:, g] / n + N with N's
    columns summing to 0 over each unit's replicas (to rounding), N = 0 exactly on units without replicas, every
    replicated column noisy with rms about noise_std rms(W) sqrt(1 - 1/2) (0.21 at 0.3); gate/up rows and every
    moment as without noise."""
    state = trained(False)
    target = cfg(n_inner=53)
    grown = grow_state(state, make_rules(state.config, target, "duplicate", symmetry="noise", noise_std=0.3))
    plain = grow_state(state, make_rules(state.config, target, "duplicate"))
    g, n = replica_map(48, 53)
    replicated = n[g] > 1
    for i in range(2):
        name = f"model.layers.{i}.mlp.down_proj.weight"
        w_old = state.params[name].weight.double()
        noise = grown.params[name].weight.double() - w_old[:, g] / n[g]
        sums = torch.zeros_like(w_old).index_add_(1, g, noise)
        assert sums.abs().max().item() <= 1e-6 * w_old.abs().max().item()
        assert (noise[:, ~replicated] == 0).all() and noise[:, replicated].abs().amax(dim=0).min().item() > 1e-4
        ratio = (noise[:, replicated].square().mean().sqrt() / w_old.square().mean().sqrt()).item()
        assert 0.15 < ratio < 0.27, ratio
    for name, p in grown.params.items():
        ref = plain.params[name]
        assert torch.equal(p.exp_avg, ref.exp_avg) and torch.equal(p.exp_avg_sq, ref.exp_avg_sq), name
        if not name.endswith("down_proj.weight"):
            assert torch.equal(p.weight, ref.weight), name


@pytest.mark.parametrize(("n_head", "n_kv_head"), [(12, 2), (8, 4)])
def test_heads_noise_only_on_new_heads_rows(n_head, n_kv_head):
    """symmetry 'noise' in heads growth changes only the new query heads' q_proj rows and the new key/value heads'
    k_proj/v_proj rows (every such row, by N(0, (0.3 rms(W))^2)); every other weight and every moment is as without
    noise."""
    state = trained(True)
    target = cfg(tie_word_embeddings=True, n_head=n_head, n_kv_head=n_kv_head)
    grown = grow_state(state, make_rules(state.config, target, "duplicate", symmetry="noise"))
    plain = grow_state(state, make_rules(state.config, target, "duplicate"))
    new_q = head_sources(state.config, n_head, n_kv_head)[2].repeat_interleave(8)
    new_kv = (torch.arange(n_kv_head) >= 2).repeat_interleave(8)
    for name, p in grown.params.items():
        ref = plain.params[name]
        assert torch.equal(p.exp_avg, ref.exp_avg) and torch.equal(p.exp_avg_sq, ref.exp_avg_sq), name
        fresh = (
            new_q
            if name.endswith("q_proj.weight")
            else new_kv
            if name.endswith(("k_proj.weight", "v_proj.weight"))
            else None
        )
        if fresh is None or not fresh.any():
            assert torch.equal(p.weight, ref.weight), name
            continue
        assert torch.equal(p.weight[~fresh], ref.weight[~fresh]), name
        noise = (p.weight - ref.weight)[fresh].double()
        assert noise.abs().amax(dim=1).min().item() > 1e-4, name
        ratio = (noise.square().mean().sqrt() / state.params[name].weight.double().square().mean().sqrt()).item()
        assert 0.24 < ratio < 0.36, (name, ratio)


def test_masked_ramp_ends_in_a_plain_llama():
    state = trained(True)
    grown = grow_state(state, make_rules(state.config, cfg(tie_word_embeddings=True, n_head=8), "masked"), ramp_steps=4)
    grown.adam_step += 2
    mid, _, _ = to_modules(grown)
    assert mid.growth_masks is not None and mid.growth_mask_attn.min().item() == pytest.approx(0.5)
    grown.adam_step += 2
    done, _, _ = to_modules(grown)
    assert done.growth_masks is None and type(done) is family_of(done.config).model


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_shapes_groups_and_aliases(tie):
    """param_shapes builds the Llama (a tied head listed once, as the embedding); AdamW groups put the RMSNorm gains
    without weight decay; the tied head's alias names the embedding."""
    c = cfg(tie_word_embeddings=tie)
    shapes = param_shapes(c)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (16, 32) and ("lm_head.weight" in shapes) != tie
    model = build_model(c)
    groups = make_optimizer(model, HP).param_groups
    no_decay = {id(p) for p in groups[1]["params"]}
    for name, p in model.named_parameters():
        assert (id(p) in no_decay) == name.endswith(("norm.weight", "bias")), name
    assert groups[1]["weight_decay"] == 0.0 and groups[0]["weight_decay"] == HP["weight_decay"]
    assert tied_aliases(c) == ({"lm_head.weight": "model.embed_tokens.weight"} if tie else {})
    assert tied_aliases(GPTConfig(n_layer=1, n_embd=8, n_head=2)) == {"lm_head.weight": "transformer.wte.weight"}
    target = cfg(tie_word_embeddings=tie, n_embd=64, n_head=12, n_kv_head=4, n_inner=100, n_layer=3)
    check_rules(make_rules(c, target, "duplicate"))


@pytest.mark.bad_input
@pytest.mark.parametrize("family", ["duplicate", "masked"])
@pytest.mark.parametrize(
    ("target", "match"),
    [
        (dict(n_embd=64, head_dim=16), "head_dim changes from 8 to 16.*rotary frequencies.*set head_dim=8"),
        (dict(n_kv_head=4), "n_head / n_kv_head >= 2"),  # K grows, H does not: an old group would split
        (dict(n_head=8, n_kv_head=8), "n_head / n_kv_head >= 2"),
        (dict(n_kv_head=1), "n_kv_head would shrink from 2 to 1"),
        (dict(n_layer=1), "n_layer would shrink"),
        (dict(tie_word_embeddings=True, n_layer=3), "tie_word_embeddings changes"),
        (dict(rope_theta=5e5, n_layer=3), "rope_theta changes"),
        (dict(vocab_size=100, n_layer=3), "vocab_size changes"),
        (dict(), "nothing grows"),
    ],
)
def test_llama_refusals(family, target, match):
    with pytest.raises(GrowthError, match=match):
        make_rules(cfg(), cfg(**target), family)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("target", "match"),
    [
        (dict(n_embd=40), "integer factor.*masked family"),
        (dict(n_embd=64, n_head=8, n_kv_head=4, n_inner=80), "n_inner >= 96"),
        (dict(n_embd=64, n_head=8, n_kv_head=2, n_inner=96), r"n_kv_head >= 4.*e\.g\. n_head=8, n_kv_head=4"),
    ],
)
def test_llama_duplicate_refusals(target, match):
    with pytest.raises(GrowthError, match=match):
        make_rules(cfg(), cfg(**target), "duplicate")


@pytest.mark.bad_input
@pytest.mark.parametrize("family", ["duplicate", "masked"])
def test_mixed_arch_refused(family):
    gpt = GPTConfig(n_layer=2, n_embd=32, n_head=4, n_positions=16, vocab_size=97)
    with pytest.raises(GrowthError, match="growth keeps the model family"):
        make_rules(cfg(), gpt, family)
    with pytest.raises(GrowthError, match="growth keeps the model family"):
        make_rules(gpt, cfg(), family)


@pytest.mark.parametrize("family", ["duplicate", "masked"])
@pytest.mark.parametrize("policy", [("carry_old", "zero"), ("carry", "mean"), ("reset", "zero")])
def test_optimizer_policies(family, policy):
    """Every OptimizerPolicy works on the Llama rules: 'carry_old' puts old moments unscaled at their own places
    (``Rule.place``) and zeros elsewhere, 'mean' fills fresh exp_avg_sq entries, 'reset' zeroes all; the weights
    (and so the logits) do not depend on it."""
    state = trained(False)
    target = cfg(n_embd=64, n_head=12, n_kv_head=4, n_inner=100, n_layer=3)
    plan = make_rules(state.config, target, family)
    grown = grow_state(state, plan, policy=OptimizerPolicy(*policy))
    x = tokens(state.config)
    assert (logits(grown, x) - logits(state, x)).abs().max().item() <= 1e-5
    name = "model.layers.0.mlp.gate_proj.weight"
    old, new = state.params[name], grown.params[name]
    if policy[0] == "carry_old":
        torch.testing.assert_close(new.exp_avg[:48, :32], old.exp_avg, rtol=0, atol=0)
        rest = torch.ones_like(new.exp_avg, dtype=torch.bool)
        rest[:48, :32] = False
        assert old.exp_avg.abs().max() > 0 and new.exp_avg[rest].abs().max() == 0  # nothing else carried
    elif policy[0] == "reset":
        assert all(p.exp_avg.abs().max() == 0 and p.exp_avg_sq.abs().max() == 0 for p in grown.params.values())
    else:  # fresh entries (masked: new rows and columns) start at the carried entries' mean exp_avg_sq
        fresh = fresh_entries(plan.rules[name], old.weight)
        assert fresh.any() == (family == "masked")
        if fresh.any():
            torch.testing.assert_close(new.exp_avg_sq[fresh], new.exp_avg_sq[~fresh].mean().expand(int(fresh.sum())))


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_one_adam_step_moves_width_copies_like_the_small_model(tie):
    """Width x2: every copied entry (exp_avg / 2, exp_avg_sq / 4) takes exactly the small model's AdamW update, so
    after one step the grown model still computes the small model's function once the two things a growth adds are
    reset: the zero blocks' first updates (s0, not 0) and the head's (the tied final norm's or the untied lm_head's
    exp_avg_sq x k^2 gives 1/k of the update only while the new gradient's share of v, 1 - beta2, is small). The loss
    is scaled by 1e4 and eps is 1e-14 so that Adam's eps, which the rule does not scale, plays no part (as GPT-2's
    test)."""
    hp = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-14, "weight_decay": 0.1}
    old = cfg(tie_word_embeddings=tie)
    small = random_llama(old, torch.float64).train()
    opt_s = make_optimizer(small, hp)
    for seed in range(3):  # real Adam state
        opt_s.zero_grad()
        (1e4 * loss64(small, tokens(old, t=13, seed=10 + seed))).backward()
        opt_s.step()
    plan = make_rules(old, cfg(tie_word_embeddings=tie, n_embd=64, n_head=8, n_kv_head=4, n_inner=96), "duplicate")
    big = build_model(plan.new).double().train()
    opt_b = make_optimizer(big, hp)
    apply_rules(plan, ModuleStore(small, opt_s), ModuleStore(big, opt_b, step=3))
    x = tokens(old, t=13, seed=99)
    for model, opt in ((small, opt_s), (big, opt_b)):
        opt.zero_grad()
        (1e4 * loss64(model, x)).backward()
        opt.step()
    head = "model.norm.weight" if tie else "lm_head.weight"
    with torch.no_grad():
        for name, rule in plan.rules.items():
            w_old, w_new = small.get_parameter(name), big.get_parameter(name)
            if name == head:
                w_new.copy_(rule.weight(w_old))
                continue
            carried = rule.exp_avg(torch.ones_like(w_old)) != 0
            torch.testing.assert_close(w_new[carried], rule.weight(w_old)[carried], rtol=0, atol=1e-12)
            if (~carried).any():  # the zero blocks moved, by about s0 of a copy's update
                assert w_new[~carried].abs().max().item() > 1e-4
                w_new[~carried] = 0.0
        xe = tokens(old, seed=7)
        torch.testing.assert_close(big.eval()(xe), small.eval()(xe), rtol=0, atol=1e-9)
