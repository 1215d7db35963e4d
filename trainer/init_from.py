"""``train.py --init_from DIR``: start a fresh run from a ``transformers`` folder of a family growlm builds
(model.registry): a GPT-2 (``GPT2LMHeadModel``; a ``growlm-grow --export_hf`` export or any GPT-2 saved with
``save_pretrained``), a Llama (``LlamaForCausalLM``: SmolLM, TinyLlama, Llama 3.x shapes) or a Qwen 2 / 2.5
(``Qwen2ForCausalLM``); docs/models.md.

What is taken from the folder: the model shape (``config.json``: its ``model_type`` picks the family, whose adapter
``model/<family>/hf.py`` converts it; any other type is refused), the weights
(``model.safetensors``, or the shards a ``model.safetensors.index.json`` lists; a ``pytorch_model.bin`` is a pickle,
which growlm never unpickles from a foreign folder) and, when present, the tokenizer (``tokenizer.json``), which must
encode text as the training data's tokenizer does. What is not: optimizer state (Adam starts at step 0, the LR
schedule at its start), data position, RNG.

Everything the folder can get wrong is checked by ``open_init_from`` before any rank starts (the safetensors headers
give every tensor's name and shape without reading it). ``load_weights`` then writes the weights into the freshly
built engine, at any ZeRO stage and precision: into the fp32 MASTER weights the optimizer steps (ZeRO-1/2/3 and
DeepSpeed's bf16 optimizer through ``deepspeed.utils.safe_set_full_fp32_param``: each rank keeps only its own
partition; ZeRO stage 0 through the fp16/bf16 wrapper's master tensors), then copies the masters into the working
copies the forward pass uses (growth.live.grow.refresh_working_copies). Loading into the module before
``deepspeed.initialize`` would not do: the engine casts the module to bf16/fp16 first and builds its masters from the
rounded values (DESIGN.md, "Checkpoint failure kinds: stale fp32 master").
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from growlm.data import tokenizer as tok
from growlm.growth.live.grow import refresh_working_copies
from growlm.growth.ops.rules import param_shapes
from growlm.growth.stages.plan import StageList
from growlm.model.config import ModelConfig, from_preset
from growlm.model.hf_folder import FolderError, model_config
from growlm.model.registry import family as model_family
from growlm.model.weight_files import safetensors_problem, tensors_differ
from growlm.runtime import run_state
from growlm.runtime.quiet import quiet_transformers
from growlm.trainer.errors import UsageError
from growlm.trainer.plan_checks import SHAPE_FLAGS, shape_flag, shape_of

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"  # a sharded folder: {"weight_map": {tensor name: shard file}}
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
# buffers some transformers versions save: GPT-2's causal masks, Llama's rotary inverse frequencies
UNUSED_TENSORS = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")
TIED_HEAD = "lm_head.weight"  # tied to the token embedding: GPT-2 always, Llama when tie_word_embeddings
TOKENIZER_PROBE = "Hello world, it's 2024!\n\tÜnïcödé — “quotes” <|endoftext|> 12345 growlm"


@dataclass(frozen=True)
class InitFolder:
    """A checked ``--init_from`` folder.

    Attributes:
        path: the folder.
        config: the model shape of its config.json, GPTConfig or LlamaConfig (dropout: ``--dropout`` if given, else
            the folder's).
        weights: its model.safetensors, or its model.safetensors.index.json when sharded.
        sha256: the weights' sha256 (hex): of model.safetensors, or of the shard files' bytes one after the other in
            file-name order.
        keys: growlm parameter name -> tensor name in the file (``transformer.`` prefix present or not).
        tokenizer: its tokenizer (data.tokenizer.Tokenizer), or None when the folder has no tokenizer.json.
        files: tensor name -> the safetensors file holding it (``weights`` itself unless sharded).
    """

    path: Path
    config: ModelConfig
    weights: Path
    sha256: str
    keys: dict[str, str]
    tokenizer: Any
    files: dict[str, Path]

    @property
    def identity(self) -> run_state.InitSource:
        """What RunState records of the folder (path, weights sha256, tokenizer name)."""
        name = self.tokenizer.name if self.tokenizer is not None else None
        return run_state.InitSource(path=str(self.path), weights_sha256=self.sha256, tokenizer=name)


def _fail(path: Path, problem: str) -> UsageError:
    return UsageError(f"--init_from {path}: {problem}")


def read_config(path: Path) -> ModelConfig:
    """The model shape of the ``config.json`` in ``path``, read by the one reader of transformers folders'
    configs (model.hf_folder.model_config: every value checked, then the adapter of the family its
    ``model_type`` names converts it: a GPTConfig for "gpt2", a LlamaConfig for "llama", a Qwen2Config for "qwen2").

    Raises:
        FolderError: no such folder, no config.json, not JSON, another model_type or architecture
            (model.registry.model_type_problem), a malformed value (a string for a number, zero heads, an odd
            head_dim, hidden_size not divisible by the heads, a rope factor that is not a number; the adapter's
            ``config_problem``), or a variant growlm's model does not implement (GPT-2: another activation, untied
            head; Llama: a rope scaling other than "linear" and "llama3", biases, another activation; Qwen 2:
            sliding-window attention).
    """
    with quiet_transformers():
        return model_config(path)


def weight_files(path: Path, arch: str) -> tuple[Path, list[Path], dict[str, str] | None]:
    """The folder's safetensors files: (what names them: model.safetensors or the index, the files, the index's
    tensor name -> file name map or None). Each file is checked whole (``model.weight_files.safetensors_problem``).

    Raises:
        FolderError: weights only as a pickle (pytorch_model.bin) or none at all; an index that is not JSON or has no
            weight_map, or names a shard that is missing; a truncated or damaged file.
    """
    index = path / WEIGHTS_INDEX
    weight_map = None
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise TypeError("weight_map is not a {tensor: file} object")
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise FolderError(
                f"{WEIGHTS_INDEX} is not a safetensors index ({e}); copy the whole folder again"
            ) from None
        names = sorted(set(weight_map.values()))
        bad = [n for n in names if Path(n).name != n or not (path / n).is_file()]
        if bad:
            raise FolderError(
                f"{WEIGHTS_INDEX} lists {bad[0]}, which is not in the folder; copy the whole folder again"
            )
        files, named_by = [path / n for n in names], index
    elif (path / WEIGHTS_FILE).is_file():
        files, named_by = [path / WEIGHTS_FILE], path / WEIGHTS_FILE
    else:
        pickles = [n for n in PICKLE_WEIGHTS if (path / n).is_file()]
        cls = model_family(arch).hf_class
        why = (
            f"holds its weights only as {pickles[0]}, a pickle, which growlm does not load from a foreign folder "
            f"(it can run code); convert it to {WEIGHTS_FILE} where you trust it: "
            f"{cls}.from_pretrained(DIR).save_pretrained(DIR, safe_serialization=True)"
            if pickles
            else f"has no {WEIGHTS_FILE} (nor {WEIGHTS_INDEX}); other weight formats are not read"
        )
        raise FolderError(why)
    for f in files:
        try:
            problem = safetensors_problem(f)
        except OSError as e:
            problem = f"cannot be read ({e.strerror or e})"
        if problem is not None:
            raise FolderError(f"{f.name} {problem}; export the model again or copy the whole file again")
    return named_by, files, weight_map


def map_tensors(files: list[Path], cfg: ModelConfig, weight_map: dict[str, str] | None = None):
    """Match the tensors of the safetensors ``files`` (read from their headers only) to the parameters of
    ``build_model(cfg)`` (growth.ops.rules.param_shapes).

    Returns:
        (growlm parameter name -> tensor name, tensor name -> the file holding it).

    Raises:
        FolderError: a file is not readable safetensors, a tensor is not where the index says, a parameter is
            missing or has another shape, the files hold tensors the model does not have, or a tied Llama's
            ``lm_head.weight`` differs from its embedding (``check_tied_head``).
    """
    shapes, where = {}, {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for k in f.keys():  # noqa: SIM118 (not a dict)
                    shapes[k], where[k] = tuple(f.get_slice(k).get_shape()), file
        except (SafetensorError, OSError) as e:
            raise FolderError(f"{file.name} is not a readable safetensors file ({e})") from None
    if weight_map is not None:
        astray = [k for k, n in weight_map.items() if where.get(k) is None or where[k].name != n]
        if astray:
            raise FolderError(f"{WEIGHTS_INDEX} says {astray[0]} is in {weight_map[astray[0]]}, but it is not there")
    keys, missing, wrong, matched = {}, [], [], set()
    for name, shape in param_shapes(cfg).items():
        key = next((k for k in (name, name.removeprefix("transformer.")) if k in shapes), None)
        if key is None:
            missing.append(name)
            continue
        matched.add(key)  # a tensor of the wrong shape is named once, as that, not also as unexpected
        if shapes[key] != shape:
            wrong.append(f"{key} {shapes[key]} (config.json says {shape})")
        else:
            keys[name] = key
    tied = cfg.tied_head
    extra = [k for k in shapes if k not in matched and not (tied and k == TIED_HEAD) and not k.endswith(UNUSED_TENSORS)]
    if missing or wrong or extra:
        names = WEIGHTS_FILE if weight_map is None else "the shards of " + WEIGHTS_INDEX
        found = "; ".join(
            f"{what} {items[:3]}" + (f" and {len(items) - 3} more" if len(items) > 3 else "")
            for what, items in (("missing", missing), ("wrong shapes", wrong), ("unexpected", extra))
            if items
        )
        raise FolderError(
            f"{names} does not hold the {model_family(cfg).name} of its config.json ({cfg.shape_str()}): {found}; "
            "the two describe different models: put the config.json these weights were saved with beside them"
        )
    check_tied_head(cfg, keys, where)  # the headers just read: no file opened twice
    return keys, {k: where[k] for k in keys.values()}


def check_tied_head(cfg: ModelConfig, keys: dict[str, str], where: dict[str, Path]) -> None:
    """Refuse a folder whose config.json ties the LM head to the token embedding (``tie_word_embeddings``)
    but whose weights hold an ``lm_head.weight`` with other values: growlm would drop that head, and transformers'
    versions differ in which of the two they use, so the model is not what the folder says. Compares the two
    tensors a block of rows at a time (``model.weight_files.tensors_differ``).

    ``keys``: growlm parameter name -> tensor name; ``where``: every tensor's file, as ``map_tensors`` read them.

    Raises:
        FolderError: the two differ; names the tensors and the fix.
    """
    if not cfg.tied_head:
        return
    embed = keys.get(cfg.embedding_name)
    if TIED_HEAD not in where or embed is None:
        return
    if tensors_differ((where[embed], embed), (where[TIED_HEAD], TIED_HEAD)):
        raise FolderError(
            f"config.json sets tie_word_embeddings: true, but {TIED_HEAD} differs from {embed}: the folder holds an "
            "LM head of its own; set tie_word_embeddings: false in config.json to keep it, or remove it to tie them",
        )


@dataclass(frozen=True)
class HFFolder:
    """A transformers folder whose config.json and weights were checked against each other (``read_folder``).

    Attributes:
        config: the model shape of its config.json (``read_config``).
        weights: its model.safetensors, or its model.safetensors.index.json when sharded.
        files: the safetensors files, in file-name order.
        keys: growlm parameter name -> tensor name in the files.
        where: tensor name -> the safetensors file holding it, for every tensor of ``keys``.
    """

    config: ModelConfig
    weights: Path
    files: list[Path]
    keys: dict[str, str]
    where: dict[str, Path]


def check_weights(path: Path, cfg: ModelConfig) -> HFFolder:
    """The folder ``path``'s weights checked against its config.json's shape ``cfg`` (``weight_files``, then
    ``map_tensors``: every parameter there with its shape, no tensor the model lacks, a tied head not a head of its
    own), from the safetensors headers; builds no model. One check for train.py --init_from and growlm-eval.

    Raises:
        FolderError: see ``weight_files`` and ``map_tensors``.
    """
    weights, files, weight_map = weight_files(path, cfg.arch)
    keys, where = map_tensors(files, cfg, weight_map)
    return HFFolder(cfg, weights, files, keys, where)


def read_folder(path: Path) -> HFFolder:
    """A transformers folder checked whole, config.json (``read_config``) and weights (``check_weights``), before
    any model is built: what growlm-eval scores is what train.py --init_from would train.

    Raises:
        FolderError: see ``read_config`` and ``check_weights``; the message is the problem and its fix, without a
            command's prefix.
    """
    return check_weights(path, read_config(path))


def check_flags(args: argparse.Namespace, path: Path, cfg: ModelConfig) -> None:
    """Refuse --resume and shape flags that disagree with the folder's config.json (equal values are harmless).

    Raises:
        UsageError: --resume given, or --preset / --n_* naming another shape.
    """
    if args.resume:
        raise UsageError(
            "--init_from and --resume are mutually exclusive: --init_from starts a fresh run from a transformers "
            "folder, --resume continues a growlm checkpoint (which records its --init_from); give one"
        )
    folder = {**shape_of(cfg), "n_inner": cfg.ffn_dim}
    given = {k: getattr(args, k) for k in SHAPE_FLAGS if getattr(args, k, None) is not None}
    conflicts = [shape_flag(k, v, with_value=True) for k, v in given.items() if v != folder.get(k)]
    if args.preset is not None:
        try:
            preset = from_preset(args.preset)
        except ValueError as e:
            raise UsageError(str(e)) from None
        if {**shape_of(preset), "n_inner": preset.ffn_dim} != folder:
            conflicts.insert(0, f"--preset {args.preset} ({preset.shape_str()})")
    if conflicts:
        raise _fail(
            path, f"the model shape comes from its config.json ({cfg.shape_str()}); drop {', '.join(conflicts)}"
        )


def open_init_from(args: argparse.Namespace) -> InitFolder | None:
    """Check the ``--init_from`` folder and the flags given with it; None without --init_from. Reads config.json,
    the safetensors headers, the tokenizer files and (for their sha256) the weight files; builds no model.

    Raises:
        UsageError: ``--init_from DIR: `` and the problem of read_config, check_weights (weight_files, map_tensors)
            or check_flags; a tokenizer.json that does not load or has more tokens than vocab_size (it is not the
            model's).
    """

    if not args.init_from:
        return None
    path = Path(args.init_from)
    try:
        cfg = read_config(path)
        check_flags(args, path, cfg)
        folder = check_weights(path, cfg)
        tokenizer = tok.from_hf_dir(path)
    except (FolderError, tok.TokenizerError) as e:
        raise _fail(path, str(e)) from None
    if tokenizer is not None and tokenizer.vocab_size > cfg.vocab_size:
        raise _fail(
            path,
            f"its tokenizer has {tokenizer.vocab_size} tokens, more than vocab_size {cfg.vocab_size} in config.json: "
            "it is not this model's tokenizer; put the model's own tokenizer.json beside it",
        )
    if args.dropout is not None:
        cfg = replace(cfg, dropout=args.dropout)
    return InitFolder(path, cfg, folder.weights, _sha256(folder.files), folder.keys, tokenizer, folder.where)


def _sha256(files: list[Path]) -> str:
    """sha256 (hex) of the files' bytes, one after the other in the order given."""
    h = hashlib.sha256()
    for path in files:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):  # noqa: B023 (used at once)
                h.update(block)
    return h.hexdigest()


def check_plan_start(src: InitFolder, growth: StageList, plan_path: str) -> ModelConfig:
    """The run's starting shape with --growth_plan: the loaded model, which must be the plan's ``start``.

    Raises:
        UsageError: the shapes differ (both named).
    """
    if shape_of(growth.start) != shape_of(src.config):
        raise UsageError(
            f"--init_from {src.path} holds a {src.config.shape_str()} model but --growth_plan {plan_path} starts at "
            f"{growth.start.shape_str()}; use a plan whose 'start' is the loaded model's shape"
        )
    return src.config


def check_data_tokenizer(src: InitFolder, data_dir: Path) -> None:
    """Refuse training data made with another tokenizer than the folder's (when the folder has one): the model
    would read other tokens than it learned. Compared by encoding a probe text with both.

    Raises:
        UsageError: the two tokenizers encode the probe text differently, or the data's tokenizer is unknown.
    """

    if src.tokenizer is None:
        return
    try:
        data_tok = tok.from_data_dir(data_dir)
    except tok.TokenizerError as e:
        raise UsageError(f"--data {data_dir}: {e}") from None
    same = data_tok.encode(TOKENIZER_PROBE) == src.tokenizer.encode(TOKENIZER_PROBE)
    if not same or data_tok.eot_token_id != src.tokenizer.eot_token_id:
        raise UsageError(
            f"--data {data_dir} was tokenized with {data_tok.name}, which encodes text differently from the "
            f"tokenizer of --init_from {src.path}; train on data tokenized with the model's tokenizer"
        )


def stage0_masters(engine: Any) -> dict[int, torch.Tensor]:
    """ZeRO stage 0 in fp16/bf16: module parameter id -> the fp32 master tensor the optimizer steps (a view into
    FP16_Optimizer's flat master, or FP16_UnfusedOptimizer's per-parameter master). Empty for fp32."""
    opt, masters = engine.optimizer, {}
    if hasattr(opt, "fp16_groups") and hasattr(opt, "fp32_groups_flat"):  # fused: one flat master per group
        for lp_group, flat in zip(opt.fp16_groups, opt.fp32_groups_flat, strict=True):
            offset = 0
            for lp in lp_group:
                masters[id(lp)] = flat.data.narrow(0, offset, lp.numel()).view(lp.shape)
                offset += lp.numel()
    elif hasattr(opt, "fp16_groups") and hasattr(opt, "fp32_groups"):  # unfused: one master per parameter
        for lp_group, master_group in zip(opt.fp16_groups, opt.fp32_groups, strict=True):
            masters.update({id(lp): mp.data for lp, mp in zip(lp_group, master_group, strict=True)})
    return masters


def load_weights(engine: Any, src: InitFolder) -> None:
    """Write the folder's weights (as fp32) into ``engine``'s fp32 master weights and working copies; a collective
    (every rank, same order). Call on a freshly built engine, before its first step: Adam state stays unmade
    (step 0) and the LR schedule untouched.

    ZeRO-1/2/3 and DeepSpeed's bf16 optimizer: ``safe_set_full_fp32_param`` (each rank writes its own partition of
    the master), then the masters are copied into the working parameters (growth.live.grow.refresh_working_copies).
    ZeRO stage 0: the module parameter is the master (fp32) or has one (fp16/bf16 wrappers); both are written.
    """
    import deepspeed.utils as dsu  # lazy: deepspeed picks its accelerator at import

    masters = stage0_masters(engine)
    with contextlib.ExitStack() as stack, torch.no_grad():
        opened = {f: stack.enter_context(safe_open(str(f), framework="pt")) for f in sorted(set(src.files.values()))}
        for name, p in engine.module.named_parameters():  # the same order on every rank
            key = src.keys[name]
            w = opened[src.files[key]].get_tensor(key).float()
            if hasattr(p, "ds_id") or hasattr(p, "_hp_mapping"):
                dsu.safe_set_full_fp32_param(p, w.to(p.device))
            else:
                if id(p) in masters:
                    masters[id(p)].copy_(w)
                p.copy_(w)  # the working copy: the master rounded to the parameter's dtype
    refresh_working_copies(engine)
