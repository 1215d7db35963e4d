"""Exact growth operators of the Llama-shaped families (model/llama, and model/qwen2, whose q/k/v biases every
operator here carries; DESIGN.md, "Llama growth"): the duplication family (width x k, heads at fixed n_embd, FFN,
depth) and the masked family (MSG), as RuleSets over transformers' ``LlamaForCausalLM`` / ``Qwen2ForCausalLM``
names, and ``make_rules``, the families' chain. Torch only.

Biases (``qkv_bias``): a q/k/v bias is the output-row vector of its projection, so it follows the projection's rows
in every operator (width: tiled as the row blocks; heads: gathered with the rows; masked: placed with them, new
entries N(0, bias_std)); depth copies it, FFN growth leaves it. Its Adam moments follow the same rules as the rows'
(width: the vectors' gradient / k; heads: a new head's exp_avg 0 and its source's exp_avg_sq).

Layout: every matrix is an ``nn.Linear`` weight (out, in), so GPT-2's Conv1D (in, out) map f becomes
W -> f(W^T)^T: width's kron(P, W) becomes kron(P^T, W). head_dim Q never changes (it sets the rotary frequencies);
query head p reads key/value head p // (H / K). Symbols: V vocab, L n_layer, d n_embd, H n_head, K n_kv_head,
g = H / K query heads per key/value head, Q head_dim, F n_inner.

Over 600 lines by design: a family is one operators file (the families' layout, DESIGN.md "Layers"), and the
Llama-shaped families have more operators than GPT-2 (heads and key/value heads apart from width, the FFN alone).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from growlm.growth.errors import GrowthError
from growlm.growth.ops.common import (
    NEW_LAYER_INITS,
    SYMMETRIES,
    ZERO_ENTRY_UPDATE,
    block_copy_rule,
    check_no_shrink,
    embed_at,
    layer_map,
    moment_patterns,
    ramp_options,
    replica_map,
    width_pattern,
)
from growlm.growth.ops.common import zero_sum_noise as conv_zero_sum_noise
from growlm.growth.ops.rules import (
    Map,
    Rule,
    RuleSet,
    chain,
    identity,
    kron_map,
    leading_block,
    noise_dtype,
    param_shapes,
    repeat_last,
    rms,
    seeded_normal,
)
from growlm.model.llama.config import LlamaConfig, llama_head_index
from growlm.model.masks import MaskSpec

EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
HEAD = "lm_head.weight"
NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight")
QKV_BIASES = ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias")  # with qkv_bias only
# a Llama block's parameters (model.layers.{i}.<suffix>), in named_parameters order, without the q/k/v biases
BLOCK_PARAMS = (
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)


def block_params(cfg: LlamaConfig) -> tuple[str, ...]:
    """The parameter suffixes of one block of ``cfg``: ``BLOCK_PARAMS``, with ``QKV_BIASES`` after their weights
    when the config has ``qkv_bias``."""
    out = []
    for s in BLOCK_PARAMS:
        out.append(s)
        bias = s.removesuffix(".weight") + ".bias"
        if cfg.qkv_bias and bias in QKV_BIASES:
            out.append(bias)
    return tuple(out)


ZEROED_IN_EXACT = ("self_attn.o_proj.weight", "mlp.down_proj.weight")  # a block's two residual output projections


def block_name(i: int, suffix: str) -> str:
    """The full name of block ``i``'s parameter ``suffix`` (e.g. ``model.layers.0.self_attn.q_proj.weight``)."""
    return f"model.layers.{i}.{suffix}"


def _same_names(cfg: LlamaConfig, taken: dict[str, Rule]) -> dict[str, Rule]:
    """An identity Rule for every parameter of ``cfg`` not in ``taken`` (parameters a growth leaves alone)."""
    return {
        n: Rule(weight=identity, exp_avg=identity, exp_avg_sq=identity) for n in param_shapes(cfg) if n not in taken
    }


def transposed(f: Map) -> Map:
    """The (out, in) form of a map written for (in, out) matrices: W -> f(W^T)^T."""
    return lambda w: f(w.T).T


def _plus(a: Map, b: Map) -> Map:
    """x -> a(x) + b(x)."""
    return lambda x: a(x) + b(x)


def _check_symmetry(symmetry: str, noise_std: float) -> None:
    """Raises GrowthError for a symmetry option other than ``SYMMETRIES`` or a negative noise_std."""
    if symmetry not in SYMMETRIES or noise_std < 0:
        raise GrowthError(f"symmetry={symmetry!r} must be one of {SYMMETRIES} and noise_std={noise_std} >= 0")


# ----- width x k ---------------------------------------------------------------------------------------------------


def llama_width_growth(
    old: LlamaConfig,
    factor: int,
    *,
    pattern: str = "block",
    alpha: float = 0.75,
    symmetry: str = "none",
    noise_std: float = 0.3,
    seed: int = 0,
) -> RuleSet:
    """Width x k of a Llama: n_embd d -> k d, n_head H -> k H, n_kv_head K -> k K, n_inner F -> k F, head_dim Q kept.
    Exact in eval mode (staged training's width operator, Shen et al. 2022, arXiv 2203.06211, section 3.2, with
    GPT-2's patterns: ops.common.width_pattern).

    Shapes ((out, in)): embed_tokens (V, d) -> (V, k d) = [E, ..., E]; every block matrix W (q/k/v/o, gate/up/down)
    -> kron(P^T, W), i.e. (n, m) -> (k n, k m), output copy j in row block j: copy j of the query heads holds heads
    j H + h, of the key/value heads j K + i, so query head j H + h reads key/value head (j H + h) // g = j K + h // g,
    copy j of its own key/value head (g unchanged). RMSNorm gains (d,) -> [gamma, ..., gamma]: the root mean square
    of [x, ..., x] is that of x, so every block keeps the residual stream as k equal copies. Head: tied, the final
    norm's gain becomes [gamma, ..., gamma] / k (the k-fold dot product with [E, ..., E] gives the old logit);
    untied, the final norm is tiled like the others and lm_head (V, d) -> [W / k, ..., W / k] (Net2Net's split of
    the consumer of duplicated units, Chen et al. 2016, arXiv 1511.05641, eq. 2).

    Adam (DESIGN.md, "Llama growth", which derives each): matrices by ``moment_patterns`` (gradient / k, exp_avg_sq
    also / P_ij^2; zero blocks exp_avg 0 and exp_avg_sq / ZERO_ENTRY_UPDATE^2); embedding and RMSNorm gains
    exp_avg / k, exp_avg_sq / k^2; tied final norm exp_avg kept, exp_avg_sq x k^2 (first update 1/k); untied lm_head
    likewise (its gradient is unchanged, it holds W / k). ``symmetry='noise'`` adds ``zero_sum_noise`` (still exact).

    Raises:
        GrowthError: factor < 2, a bad pattern, alpha or symmetry, or noise_std < 0.
    """
    if not isinstance(factor, int) or factor < 2:
        raise GrowthError(f"width factor={factor!r} must be an integer >= 2 (use the FFN or heads growth alone)")
    _check_symmetry(symmetry, noise_std)
    k = factor
    p = width_pattern(k, pattern, alpha)
    m_pat, v_pat = moment_patterns(p)
    e11 = torch.zeros(k, k, dtype=torch.float64)
    e11[0, 0] = 1.0
    new = replace(
        old, n_embd=k * old.n_embd, n_head=k * old.n_head, n_kv_head=k * old.n_kv_head, n_inner=k * old.n_inner
    )

    def matrix(name: str) -> Rule:
        grow = kron_map(p.T.contiguous())
        if symmetry == "noise" and noise_std > 0:
            grow = _plus(grow, transposed(conv_zero_sum_noise(k, noise_std, name, seed)))
        return Rule(
            weight=grow,
            exp_avg=kron_map(m_pat.T.contiguous()),
            exp_avg_sq=kron_map(v_pat.T.contiguous()),
            place=kron_map(e11),
        )

    def tiled(scale: float = 1.0, m_scale: float = 1.0 / k, v_scale: float = 1.0 / k**2) -> Rule:
        """[x, ..., x] along the last axis: RMSNorm gains (d,), embedding and lm_head (V, d), q/k/v biases (n,) (as
        the row blocks of kron(P^T, W): output copy j holds rows j n .. (j + 1) n - 1)."""

        def place(x: Tensor) -> Tensor:
            return leading_block((1,) * (x.dim() - 1) + (k,))(x)

        return Rule(
            weight=repeat_last(k, scale), exp_avg=repeat_last(k, m_scale), exp_avg_sq=repeat_last(k, v_scale),
            place=place,
        )  # fmt: skip

    rules: dict[str, Rule] = {EMBED: tiled()}
    for i in range(old.n_layer):
        for s in block_params(old):
            name = block_name(i, s)
            rules[name] = tiled() if s in NORMS or s in QKV_BIASES else matrix(name)
    if old.tie_word_embeddings:
        rules[FINAL_NORM] = tiled(scale=1.0 / k, m_scale=1.0, v_scale=float(k**2))
    else:
        rules[FINAL_NORM] = tiled()
        rules[HEAD] = tiled(scale=1.0 / k, m_scale=1.0, v_scale=float(k**2))
    notes = ()
    if symmetry == "none":
        notes = (f"width x{k} with pattern {pattern!r}: copies stay (nearly) identical; symmetry 'noise' breaks that",)
    return RuleSet(old=old, new=new, rules=rules, family="duplicate", exact=True, notes=notes)


# ----- heads at fixed n_embd ---------------------------------------------------------------------------------------


def head_sources(old: LlamaConfig, n_head: int, n_kv_head: int) -> tuple[Tensor, Tensor, Tensor]:
    """Where each head of a model with ``n_head`` query and ``n_kv_head`` key/value heads comes from.

    Returns:
        (q_src (H',) int64: the old query head each position copies; kv_src (K',) int64: the old key/value head each
        key/value position copies, j -> j mod K; is_new (H',) bool: positions that are not an old head's place).
        Old query head h sits at ``llama_head_index`` (j g' + s for group j = h // g, slot s = h % g); a new query
        head at p copies old head kv_src[p // g'] g + (p mod g') mod g, a head of the old group its key/value head
        copies, so it computes exactly what its source computes.

    Raises:
        GrowthError: n_kv_head < K or n_head / n_kv_head < g (an old group would split).
    """
    try:
        index = llama_head_index(old.n_head, old.n_kv_head, n_head, n_kv_head)
    except ValueError as e:
        kv = max(n_kv_head, old.n_kv_head)
        raise GrowthError(
            f"{e} (Llama growth keeps every old key/value group whole): e.g. n_head={old.group_size * kv}, "
            f"n_kv_head={kv}"
        ) from e
    g, g_new = old.group_size, n_head // n_kv_head
    kv_src = torch.arange(n_kv_head) % old.n_kv_head
    p = torch.arange(n_head)
    q_src = kv_src[p // g_new] * g + (p % g_new) % g
    is_new = torch.ones(n_head, dtype=torch.bool)
    is_new[index] = False
    return q_src, kv_src, is_new


def _head_units(heads: Tensor, q: int) -> Tensor:
    """The units (rows of q_proj / columns of o_proj) of ``heads`` (int64 (n,)) of head_dim ``q``: (n q,)."""
    return (heads[:, None] * q + torch.arange(q)[None, :]).flatten()


def _rows(index: Tensor) -> Map:
    """Rows gathered from their sources: x[index]."""
    return lambda x: x[index.to(x.device)]


def _rows_new_zero(index: Tensor, fresh: Tensor) -> Map:
    """Rows gathered from their sources, the rows of new heads (``fresh``) zeroed."""

    def f(x: Tensor) -> Tensor:
        y = x[index.to(x.device)]
        if not y.is_meta:
            y[fresh.to(x.device)] = 0.0
        return y

    return f


def _rows_noisy(index: Tensor, fresh: Tensor, name: str, noise_std: float, seed: int) -> Map:
    """Rows gathered from their sources, N(0, (noise_std rms(W))^2) added to the new heads' rows (``fresh``; none
    at noise_std 0), seeded by ``name`` and ``seed``."""

    def f(x: Tensor) -> Tensor:
        y = x[index.to(x.device)]
        if noise_std == 0 or y.is_meta or fresh.numel() == 0:
            return y
        z = seeded_normal((fresh.numel(), x.shape[1]), noise_std * rms(x), f"{name}/new heads", seed, x)
        y[fresh.to(x.device)] += z.to(y.dtype)
        return y

    return f


def _placed(axis: int, pos: Tensor, n: int) -> Map:
    """Old tensor's units at ``pos`` along ``axis`` (0 or 1; of new length n), zeros elsewhere."""

    def f(x: Tensor) -> Tensor:
        shape = list(x.shape)
        shape[axis] = n
        out = x.new_zeros(shape)
        if out.is_meta:
            return out
        if axis == 0:
            out[pos.to(x.device)] = x
        else:
            out[:, pos.to(x.device)] = x
        return out

    return f


def _o_map(q_rows: Tensor, new_units: Tensor, scale_new: float | None) -> Map:
    """o_proj columns gathered from their sources (``q_rows``); new heads' columns (``new_units``) zeroed (None) or
    scaled."""

    def f(x: Tensor) -> Tensor:
        y = x[:, q_rows.to(x.device)]
        if y.is_meta:
            return y
        y[:, new_units.to(x.device)] = 0.0 if scale_new is None else y[:, new_units.to(x.device)] * scale_new
        return y

    return f


def llama_heads_growth(
    old: LlamaConfig, n_head: int, n_kv_head: int, *, symmetry: str = "none", noise_std: float = 0.3, seed: int = 0
) -> RuleSet:
    """Query heads H -> H' and key/value heads K -> K' at fixed n_embd and head_dim (Llama allows H Q != d). Exact.

    Old query heads go to ``model.masks.llama_head_index`` (each keeps its key/value head), old key/value heads stay
    at 0..K-1, new key/value heads copy old ones cyclically, and every new query head copies an old head of the group
    its key/value head copies (``head_sources``), q_proj rows with it. The new heads' o_proj columns are zero, so
    they add nothing (exact), as depth growth's identity blocks: exp_avg 0 and exp_avg_sq their source columns' /
    ZERO_ENTRY_UPDATE^2 (the gradient of a zero column equals its source column's, the head computing the same
    output). The new heads' q rows and the new key/value heads' k/v rows get exp_avg 0, their gradient at growth
    (only new query heads read a new key/value head, and every new query head's o_proj columns are 0), and their
    source's exp_avg_sq, so that their first updates stay as small as their source's (DESIGN.md, "Llama growth").

    Symmetry: two new heads that copy one source (or a new head and its source, once its o_proj columns move) would
    stay equal for ever. ``symmetry='noise'`` adds N(0, (noise_std rms(W))^2) to those q rows and k/v rows (W the
    old q_proj, k_proj or v_proj; seeded by parameter name and ``seed``, the same on every rank): still exact, since
    no output reads them while their o_proj columns are 0. 'none' leaves them equal and says so in the plan's notes.

    Shapes ((out, in)): q_proj (H Q, d) -> (H' Q, d), k_proj and v_proj (K Q, d) -> (K' Q, d), o_proj (d, H Q) ->
    (d, H' Q); everything else unchanged.

    Raises:
        GrowthError: H' < H, K' < K, (H', K') = (H, K), or an old key/value group would split (H' / K' < H / K); a
            bad symmetry or noise_std < 0.
    """
    _check_symmetry(symmetry, noise_std)
    if n_head < old.n_head or n_kv_head < old.n_kv_head or (n_head, n_kv_head) == (old.n_head, old.n_kv_head):
        raise GrowthError(
            f"heads growth needs n_head >= {old.n_head} and n_kv_head >= {old.n_kv_head}, one of them larger; got "
            f"n_head={n_head}, n_kv_head={n_kv_head}"
        )
    if n_head % n_kv_head:
        raise GrowthError(f"n_head={n_head} is not a multiple of n_kv_head={n_kv_head}; choose n_kv_head dividing it")
    q_src, kv_src, is_new = head_sources(old, n_head, n_kv_head)
    new = replace(old, n_head=n_head, n_kv_head=n_kv_head)
    q = old.head_dim
    q_rows, kv_rows = _head_units(q_src, q), _head_units(kv_src, q)
    # where the old heads' units sit, in old order
    old_q_pos = _head_units(llama_head_index(old.n_head, old.n_kv_head, n_head, n_kv_head), q)
    new_units = _head_units(torch.nonzero(is_new).flatten(), q)
    new_kv_units = torch.arange(old.n_kv_head * q, n_kv_head * q)
    std = noise_std if symmetry == "noise" else 0.0  # of the new heads' q and k/v rows (0: none)
    nq, nkv = n_head * q, n_kv_head * q
    rules: dict[str, Rule] = {}
    for i in range(old.n_layer):
        name = block_name(i, "self_attn.q_proj.weight")
        rules[name] = Rule(
            weight=_rows_noisy(q_rows, new_units, name, std, seed),
            exp_avg=_rows_new_zero(q_rows, new_units),
            exp_avg_sq=_rows(q_rows),
            place=_placed(0, old_q_pos, nq),
        )
        for s in ("self_attn.k_proj.weight", "self_attn.v_proj.weight"):
            name = block_name(i, s)
            rules[name] = Rule(
                weight=_rows_noisy(kv_rows, new_kv_units, name, std, seed),
                exp_avg=_rows_new_zero(kv_rows, new_kv_units),
                exp_avg_sq=_rows(kv_rows),
                place=_placed(0, torch.arange(old.n_kv_head * q), nkv),
            )
        if old.qkv_bias:  # a bias follows its rows (copied, no noise: the rows' noise breaks the symmetry)
            rules[block_name(i, "self_attn.q_proj.bias")] = Rule(
                weight=_rows(q_rows),
                exp_avg=_rows_new_zero(q_rows, new_units),
                exp_avg_sq=_rows(q_rows),
                place=_placed(0, old_q_pos, nq),
            )
            for s in ("self_attn.k_proj.bias", "self_attn.v_proj.bias"):
                rules[block_name(i, s)] = Rule(
                    weight=_rows(kv_rows),
                    exp_avg=_rows_new_zero(kv_rows, new_kv_units),
                    exp_avg_sq=_rows(kv_rows),
                    place=_placed(0, torch.arange(old.n_kv_head * q), nkv),
                )
        rules[block_name(i, "self_attn.o_proj.weight")] = Rule(
            weight=_o_map(q_rows, new_units, None),
            exp_avg=_o_map(q_rows, new_units, None),
            exp_avg_sq=_o_map(q_rows, new_units, 1.0 / ZERO_ENTRY_UPDATE**2),
            place=_placed(1, old_q_pos, nq),
        )
    rules.update(_same_names(old, rules))
    notes = ()
    if symmetry == "none":
        notes = (
            f"heads {old.n_head} (kv {old.n_kv_head}) -> {n_head} (kv {n_kv_head}): new heads copy old ones and the "
            "copies stay identical; symmetry 'noise' breaks that",
        )
    return RuleSet(old=old, new=new, rules=rules, family="duplicate", exact=True, notes=notes)


# ----- FFN ---------------------------------------------------------------------------------------------------------


def llama_ffn_growth(
    old: LlamaConfig, n_inner: int, *, symmetry: str = "none", noise_std: float = 0.3, seed: int = 0
) -> RuleSet:
    """SwiGLU width F -> F' (any F' > F) by Net2Net replication (Chen et al. 2016, arXiv 1511.05641, section 3.1,
    eq. 2). Exact: unit j copies old unit g(j) (``ops.common.replica_map``), h_j = silu(gate_g(j) x) up_g(j) x equals
    the old unit's, and down_proj's column j is the old column g(j) divided by its replica count n(g(j)).

    Shapes ((out, in)): gate_proj and up_proj (F, d) -> (F', d) (rows copied), down_proj (d, F) -> (d, F').
    Adam (as GPT-2's ffn_growth): a replica's gradient is 1/n of the old unit's, so gate/up rows get exp_avg / n and
    exp_avg_sq / n^2; down_proj columns see the old gradient (exp_avg copied) but hold 1/n of the weight, so
    exp_avg_sq x n^2 (first update 1/n; the n replicas together move the output as the old column did).

    Symmetry: replicas with equal down_proj columns get equal gradients and stay copies for ever. ``symmetry='noise'``
    adds to down_proj (d, F') a noise N with columns N_j ~ N(0, (noise_std rms(W))^2) (W the old down_proj; seeded by
    parameter name and ``seed``) minus their mean over the replicas of one old unit: sum_{j: g(j) = u} N_j = 0 for
    every old unit u (a unit without replicas gets none), and the replicas' SwiGLU outputs are equal at growth, so the
    FFN output is unchanged (exact to rounding) while each replica now gets its own gradient. 'none' says so in the
    plan's notes.

    Raises:
        GrowthError: n_inner <= F; a bad symmetry or noise_std < 0.
    """
    _check_symmetry(symmetry, noise_std)
    f_old = old.ffn_dim
    if n_inner <= f_old:
        raise GrowthError(f"n_inner={n_inner} must exceed the current FFN width {f_old} (use a larger n_inner)")
    new = replace(old, n_inner=n_inner)
    g, n = replica_map(f_old, n_inner)
    inv = 1.0 / n[g]  # (F',)

    def rows(scale: Tensor | None) -> Map:
        def f(x: Tensor) -> Tensor:
            y = x[g.to(x.device)]
            return y if scale is None else y * scale.to(dtype=x.dtype, device=x.device)[:, None]

        return f

    def cols(scale: Tensor | None) -> Map:
        def f(x: Tensor) -> Tensor:
            y = x[:, g.to(x.device)]
            return y if scale is None else y * scale.to(dtype=x.dtype, device=x.device)

        return f

    def replica_noise(name: str) -> Map:
        """W (d, F) -> N (d, F'): zero-sum over each old unit's replicas (see the docstring)."""

        def f(x: Tensor) -> Tensor:
            if x.is_meta:
                return torch.empty(x.shape[0], n_inner, dtype=x.dtype, device="meta")
            z = seeded_normal((x.shape[0], n_inner), noise_std * rms(x), f"{name}/replicas", seed, x, noise_dtype(x))
            gi = g.to(z.device)
            mean = z.new_zeros(x.shape[0], f_old).index_add_(1, gi, z).div_(n.to(z))
            return z.sub_(mean[:, gi]).to(x.dtype)

        return f

    def pad_rows(x: Tensor) -> Tensor:
        return torch.cat([x, x.new_zeros(n_inner - f_old, *x.shape[1:])], dim=0)

    def pad_cols(x: Tensor) -> Tensor:
        return torch.cat([x, x.new_zeros(x.shape[0], n_inner - f_old)], dim=1)

    rules: dict[str, Rule] = {}
    for i in range(old.n_layer):
        for s in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):
            rules[block_name(i, s)] = Rule(
                weight=rows(None), exp_avg=rows(inv), exp_avg_sq=rows(inv**2), place=pad_rows
            )
        name = block_name(i, "mlp.down_proj.weight")
        down = cols(inv)
        if symmetry == "noise" and noise_std > 0:
            down = _plus(down, replica_noise(name))
        rules[name] = Rule(weight=down, exp_avg=cols(None), exp_avg_sq=cols(inv**-2), place=pad_cols)
    rules.update(_same_names(old, rules))
    notes = ()
    if symmetry == "none":
        notes = (f"FFN {f_old} -> {n_inner} (Net2Net replicas): copies stay identical; symmetry 'noise' breaks that",)
    return RuleSet(old=old, new=new, rules=rules, family="duplicate", exact=True, notes=notes)


# ----- depth -------------------------------------------------------------------------------------------------------


def llama_depth_growth(old: LlamaConfig, n_layer: int, *, order: str = "interleave", exact: bool = True) -> RuleSet:
    """n_layer L -> L' (any L' > L): each new block copies an old block (``Rule.source``), placed by ``order``
    (ops.common.layer_map: 'interleave' L0 L0' L1 L1' ..., 'stack' = G_stack, Du et al. 2024, arXiv 2405.15319).

    exact=True zeroes the copies' o_proj and down_proj, so every new block is x + 0 + 0 (function unchanged);
    their exp_avg is 0 and exp_avg_sq the source's / ZERO_ENTRY_UPDATE^2 (``ops.common.zero_entry_v``), the other
    copied tensors copy their Adam state, as GPT-2's depth_growth. exact=False is the plain copy (G_stack-style):
    **not** function-preserving.

    Raises:
        GrowthError: n_layer <= L, or an unknown order.
    """
    if n_layer <= old.n_layer:
        raise GrowthError(f"n_layer={n_layer} must exceed the current {old.n_layer} (depth growth only grows)")
    new = replace(old, n_layer=n_layer)
    rules: dict[str, Rule] = {}
    for i, (src, is_copy) in enumerate(layer_map(old.n_layer, n_layer, order)):
        for s in block_params(old):
            name, source = block_name(i, s), block_name(src, s)
            rules[name] = block_copy_rule(name, source, is_copy, zeroed=is_copy and exact and s in ZEROED_IN_EXACT)
    rules.update(_same_names(old, rules))
    notes = () if exact else ("depth plain copy (G_stack-style): not function-preserving",)
    return RuleSet(old=old, new=new, rules=rules, family="duplicate", exact=exact, notes=notes)


# ----- the duplication chain ---------------------------------------------------------------------------------------


def check_llama_duplicate_target(old: LlamaConfig, new: LlamaConfig) -> int:
    """The width factor k = new.n_embd / old.n_embd (1 if unchanged) of a Llama duplication growth.

    Raises:
        GrowthError: another family, a shrink or a kept field changed (``check_no_shrink``: head_dim among them), a
            non-integer factor, or heads the chain cannot reach exactly: width x k makes (k H, k K) heads, and the
            heads growth needs n_kv_head >= k K and n_head / n_kv_head >= H / K.
    """
    check_no_shrink(old, new)
    if new.n_embd % old.n_embd:
        raise GrowthError(
            f"duplication grows n_embd by an integer factor; {old.n_embd} -> {new.n_embd} is not one: "
            f"set n_embd to a multiple of {old.n_embd}, or use the masked family for any size"
        )
    k = new.n_embd // old.n_embd
    kh, kk = k * old.n_head, k * old.n_kv_head
    if new.n_kv_head < kk or new.group_size < old.group_size:
        kv = max(new.n_kv_head, kk)
        raise GrowthError(
            f"heads {new.n_head} (kv {new.n_kv_head}) cannot be reached exactly from {old.n_head} (kv "
            f"{old.n_kv_head}, {old.group_size} per group)"
            + (f" after width x{k} ({kh} heads, kv {kk})" if k > 1 else "")
            + f": every old key/value group must stay whole, so set n_kv_head >= {kk} and n_head = a multiple of "
            f"n_kv_head with n_head / n_kv_head >= {old.group_size} (e.g. n_head={old.group_size * kv}, n_kv_head={kv})"
        )
    if new.ffn_dim < k * old.ffn_dim:
        raise GrowthError(
            f"width x{k} makes the FFN {k * old.ffn_dim} wide, more than the target's {new.ffn_dim}; "
            f"set n_inner >= {k * old.ffn_dim}"
        )
    return k


def llama_duplicate_growth(old: LlamaConfig, new: LlamaConfig, **options: Any) -> RuleSet:
    """The duplication-family plan from ``old`` to ``new`` (Llama): width x k (if n_embd grows), then heads (if H or
    K grows beyond k H, k K), then FFN (if F grows beyond k F), then depth, composed per parameter
    (``rules.compose``). Options as ``growth.ops.make_rules``'s duplicate family: pattern and alpha go to the width
    step, symmetry, noise_std and seed to the width, heads and FFN steps (each breaks its own copies' symmetry).

    Raises:
        GrowthError: see ``check_llama_duplicate_target``, or nothing grows.
    """
    k = check_llama_duplicate_target(old, new)
    plans: list[RuleSet] = []
    cfg = old
    sym_opts = {o: options[o] for o in ("symmetry", "noise_std", "seed") if o in options}
    if k > 1:
        width_opts = {o: options[o] for o in ("pattern", "alpha") if o in options} | sym_opts
        plans.append(llama_width_growth(cfg, k, **width_opts))
        cfg = plans[-1].new
    if (new.n_head, new.n_kv_head) != (cfg.n_head, cfg.n_kv_head):
        plans.append(llama_heads_growth(cfg, new.n_head, new.n_kv_head, **sym_opts))
        cfg = plans[-1].new
    if new.ffn_dim > cfg.ffn_dim:
        plans.append(llama_ffn_growth(cfg, new.ffn_dim, **sym_opts))
        cfg = plans[-1].new
    if new.n_layer > cfg.n_layer:
        plans.append(
            llama_depth_growth(
                cfg, new.n_layer, order=options.get("layer_order", "interleave"), exact=options.get("exact", True)
            )
        )
    return chain(plans, new)


# ----- masked family -----------------------------------------------------------------------------------------------


def _masked_axes(suffix: str) -> tuple[str | None, ...]:
    """Per axis of a parameter: h hidden, q query-head units, kv key/value units, f FFN, None unchanged (an RMSNorm
    gain is (h,))."""
    return {
        EMBED: (None, "h"),
        HEAD: (None, "h"),
        "self_attn.q_proj.weight": ("q", "h"),
        "self_attn.q_proj.bias": ("q",),
        "self_attn.k_proj.bias": ("kv",),
        "self_attn.v_proj.bias": ("kv",),
        "self_attn.k_proj.weight": ("kv", "h"),
        "self_attn.v_proj.weight": ("kv", "h"),
        "self_attn.o_proj.weight": ("h", "q"),
        "mlp.gate_proj.weight": ("f", "h"),
        "mlp.up_proj.weight": ("f", "h"),
        "mlp.down_proj.weight": ("h", "f"),
    }.get(suffix, ("h",))  # RMSNorm gains


@dataclass(frozen=True)
class _MaskedCtx:
    """What every parameter's rule of one masked Llama growth shares."""

    index: dict[str, Tensor]  # axis kind -> positions of the old entries in the grown axis
    sizes: dict[str, int]  # axis kind -> grown length
    init_std: float
    bias_std: float
    seed: int
    new_layers: str


def _masked_rule(ctx: _MaskedCtx, new_name: str, old_name: str, suffix: str, is_new_block: bool) -> Rule:
    """The Rule of grown parameter ``new_name`` (from ``old_name``; ``suffix`` names its kind)."""
    kinds = _masked_axes(suffix)
    is_gain = suffix.endswith("norm.weight")

    def new_shape(x: Tensor) -> tuple[int, ...]:
        return tuple(x.shape[ax] if kd is None else ctx.sizes[kd] for ax, kd in enumerate(kinds))

    def fill(x: Tensor) -> Tensor:
        if is_gain:
            return 1.0 + seeded_normal(new_shape(x), ctx.bias_std, new_name, ctx.seed, x)
        std = ctx.bias_std if suffix.endswith(".bias") else ctx.init_std
        return seeded_normal(new_shape(x), std, new_name, ctx.seed, x)

    def zero_fill(x: Tensor) -> Tensor:
        return x.new_zeros(new_shape(x))

    def at_old(base: Map) -> Map:
        def f(x: Tensor) -> Tensor:
            index = tuple(torch.arange(x.shape[ax]) if kd is None else ctx.index[kd] for ax, kd in enumerate(kinds))
            return embed_at(index, None, base)(x)

        return f

    if is_new_block and ctx.new_layers == "fresh":
        return Rule(weight=fill, exp_avg=zero_fill, exp_avg_sq=zero_fill, source=old_name, place=zero_fill)
    if is_new_block:  # a gated copy: weights copied (+ new entries), Adam state zero (its gradient is 0 at gate 0)
        return Rule(weight=at_old(fill), exp_avg=zero_fill, exp_avg_sq=zero_fill, source=old_name, place=zero_fill)
    carried = at_old(zero_fill)
    return Rule(
        weight=at_old(fill),
        exp_avg=carried,
        exp_avg_sq=carried,
        source=None if old_name == new_name else old_name,
        place=carried,
    )


def llama_masked_growth(
    old: LlamaConfig,
    new: LlamaConfig,
    *,
    layer_order: str = "stack",
    new_layers: str = "copy",
    init_std: float = 0.02,
    bias_std: float = 0.0,
    seed: int = 0,
    ramp_steps: int | None = None,
    ramp_frac: float | None = None,
    start_step: int = 0,
) -> RuleSet:
    """MSG (Yao et al. 2023, arXiv 2305.02869, sections 3-4) for a Llama: any of n_layer, n_embd, n_head, n_kv_head,
    n_inner larger or equal, head_dim kept; exact whatever the new weights are, through the model's masks.

    Old entries sit at the leading positions: hidden dims [0, d), FFN units [0, F), key/value heads [0, K), query
    heads at ``llama_head_index`` (each keeps its key/value head; new key/value heads serve new query heads only).
    Shapes ((out, in)): embed_tokens and lm_head (V, d) -> (V, d'); q_proj (H Q, d) -> (H' Q, d'); k_proj, v_proj
    (K Q, d) -> (K' Q, d'); o_proj (d, H Q) -> (d', H' Q); gate/up (F, d) -> (F', d'); down (d, F) -> (d', F').
    New entries N(0, init_std), new RMSNorm gains 1 + N(0, bias_std), new q/k/v bias entries N(0, bias_std), seeded
    by parameter name and ``seed``. New blocks: gated copies (``new_layers='copy'``, placed by ``layer_order``) or
    fresh random blocks. Adam: old entries carried unscaled at their positions, new entries and new blocks zero.
    Ramp options as ops.gpt2.masked_growth. The plan's ``masks`` (``MaskSpec(..., old_n_kv_head=K)``) go on the
    grown model.

    Raises:
        GrowthError: another family; a dimension shrinks or a kept field (head_dim, rope_theta, rms_norm_eps,
            tie_word_embeddings, vocab_size, n_positions) changes; an old key/value group would split (K' < K or
            H' / K' < H / K); an unknown layer order or new-layer init; nothing grows; bad ramp options.
    """
    check_no_shrink(old, new)
    if new_layers not in NEW_LAYER_INITS:
        raise GrowthError(f"unknown new_layers={new_layers!r}; use one of {NEW_LAYER_INITS}")
    shape = ("n_layer", "n_embd", "n_head", "n_kv_head", "n_inner")
    if all(getattr(old, f) == getattr(new, f) for f in shape):
        raise GrowthError(f"nothing grows: target {new.shape_str()} equals the current shape; change the target")
    head_sources(old, new.n_head, new.n_kv_head)  # refuses a split group, naming the fix
    ramp_steps, ramp_frac = ramp_options(ramp_steps, ramp_frac)
    lmap = layer_map(old.n_layer, new.n_layer, layer_order)
    q = old.head_dim
    heads = llama_head_index(old.n_head, old.n_kv_head, new.n_head, new.n_kv_head)
    ctx = _MaskedCtx(
        index={
            "h": torch.arange(old.n_embd),
            "q": _head_units(heads, q),
            "kv": torch.arange(old.n_kv_head * q),
            "f": torch.arange(old.ffn_dim),
        },
        sizes={"h": new.n_embd, "q": new.n_head * q, "kv": new.n_kv_head * q, "f": new.ffn_dim},
        init_std=init_std,
        bias_std=bias_std,
        seed=seed,
        new_layers=new_layers,
    )
    rules: dict[str, Rule] = {EMBED: _masked_rule(ctx, EMBED, EMBED, EMBED, False)}
    for i, (src, is_copy) in enumerate(lmap):
        for s in block_params(old):
            rules[block_name(i, s)] = _masked_rule(ctx, block_name(i, s), block_name(src, s), s, is_copy)
    rules[FINAL_NORM] = _masked_rule(ctx, FINAL_NORM, FINAL_NORM, FINAL_NORM, False)
    if not old.tie_word_embeddings:
        rules[HEAD] = _masked_rule(ctx, HEAD, HEAD, HEAD, False)
    spec = MaskSpec(
        old_n_embd=old.n_embd,
        old_n_head=old.n_head,
        old_head_dim=q,
        old_ffn_dim=old.ffn_dim,
        new_layers=tuple(i for i, (_, is_copy) in enumerate(lmap) if is_copy),
        start_step=start_step,
        ramp_steps=ramp_steps,
        old_n_kv_head=old.n_kv_head,
    )
    return RuleSet(old=old, new=new, rules=rules, family="masked", exact=True, masks=spec, ramp_frac=ramp_frac)


def make_rules(old: LlamaConfig, new: LlamaConfig, family: str, **options: Any) -> RuleSet:
    """The growth plan from ``old`` to ``new`` of a Llama-shaped model (``growth.ops.make_rules`` checked the family
    and options): 'masked' is ``llama_masked_growth``, 'duplicate' ``llama_duplicate_growth``.

    Raises:
        GrowthError: a target the family cannot reach (see each operator).
    """
    if family == "masked":
        return llama_masked_growth(old, new, **options)
    return llama_duplicate_growth(old, new, **options)
