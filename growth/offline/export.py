"""Export a growlm checkpoint to a self-sufficient transformers folder (``growlm-grow CKPT --export_hf DIR``) of its
family: ``config.json`` + ``generation_config.json`` + ``model.safetensors``, which
``transformers.GPT2LMHeadModel.from_pretrained(DIR)`` (GPT-2), ``LlamaForCausalLM.from_pretrained(DIR)`` (Llama, tied
or untied head) or ``Qwen2ForCausalLM.from_pretrained(DIR)`` (Qwen 2; ``AutoModelForCausalLM`` picks each) loads,
and the model's own tokenizer (``tokenizer.json`` + ``tokenizer_config.json`` + ``special_tokens_map.json``,
``transformers.AutoTokenizer.from_pretrained(DIR)``), so ``growlm-eval DIR`` scores it as it scores the checkpoint.

The tokenizer is the one of the token folder the run trained on (the checkpoint's RunState ``data``, whose
meta.json says GPT-2 BPE or names a trained tokenizer.json), or the ``--tokenizer`` given; when the checkpoint cannot
say (no folder recorded, the folder gone or rebuilt), the export is refused with a message naming ``--tokenizer``.

The weights are the fp32 masters of any ZeRO stage 1-3 checkpoint at any world size (growth.offline.weights, the one
checkpoint-weights reader); the transformers naming and layout are the family adapter's (model/<family>/hf.py). The
tokenizer's end-of-text id is written as the config's (and generation config's) eos_token_id; its bos_token_id is the
bos token the token folder records (growlm-prepare --tokenizer of a model folder, e.g. TinyLlama's ``<s>``), else the
end-of-text id too (GPT-2 BPE and small-vocabulary data). The tokenizer files name the same bos/eos/unk tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from growlm.data import tokenizer as tok
from growlm.growth.offline.pipeline import Source, check_output, check_overlap, one_writer
from growlm.growth.offline.weights import fp32_model
from growlm.model.registry import family
from growlm.runtime import atomic
from growlm.runtime.atomic import atomic_dir
from growlm.runtime.checkpoint import CheckpointError
from growlm.runtime.quiet import quiet_transformers

EXPORT_MARKER = "growlm_export.json"  # written into every export: what --overwrite may replace
EXPORT_FORMAT = "growlm-hf-export-v1"
EXPORT_FILES = frozenset(
    {"config.json", "generation_config.json", "model.safetensors", EXPORT_MARKER, *tok.HF_TOKENIZER_FILES}
)


def check_replaceable(out: Path) -> None:
    """Refuse to let ``--overwrite`` replace ``out`` unless growlm-grow wrote it: an empty folder, or an export
    (its ``EXPORT_MARKER``) holding nothing but the files an export writes. Nothing else is deleted: not a user's
    folder, a downloaded model, or an export a user has added files to (the rule: runtime.atomic.check_replaceable).

    Raises:
        CheckpointError: ``out`` is a file or a link, or a folder that is not (only) a growlm export.
    """
    atomic.check_replaceable(
        out,
        what="a growlm export",
        marker=EXPORT_MARKER,
        owned=lambda entry: entry.name in EXPORT_FILES,
        foreign="files an export does not write",
        fix="choose another --export_hf folder, or move it away yourself",
        error=CheckpointError,
    )


def model_tokenizer(src: Source, spec: str | None = None) -> tok.Tokenizer:
    """The tokenizer ``src`` was trained with, by the one policy (data.tokenizer.model_tokenizer): ``spec``
    (``--tokenizer``) if given, else the one of the token folder its RunState names.

    Raises:
        CheckpointError: no ``spec`` and the checkpoint cannot say (the message names ``--tokenizer``), the tokenizer
            cannot be loaded, or it has more tokens than the model's vocab_size.
    """
    own = lambda: tok.from_run_data(src.state.data.dir, src.state.data.train_sha256)  # noqa: E731
    try:
        return tok.model_tokenizer(spec, own, src.config.vocab_size, str(src.tag_dir))
    except tok.TokenizerError as e:
        raise CheckpointError(str(e)) from None


def export_hf(
    src: Source,
    out: Path,
    *,
    tokenizer: str | None = None,
    overwrite: bool = False,
    log: Any = print,
) -> Path:
    """Write ``config.json`` + ``model.safetensors`` of ``src``'s fp32 weights, the model's tokenizer files
    (``model_tokenizer(src, tokenizer)``) and ``EXPORT_MARKER`` into ``out``, atomically, every file with the
    umask's mode.

    Raises:
        CheckpointError: the output exists (without ``overwrite``; with it, unless growlm wrote it:
            ``check_replaceable``) or overlaps the input; the checkpoint's growth masks are still ramping (a masked
            model is not a transformers model); its tokenizer is unknown or does not fit; another process is writing
            ``out`` (its writer lock: refused before ``out`` is looked at, nothing touched).
    """

    step, masks = src.state.global_step, src.state.growth_masks
    if masks is not None and masks.value(step) < 1.0:
        raise CheckpointError(
            f"{src.tag_dir} still has growth masks ramping (value {masks.value(step):.3f} at step {step}, 1 at step "
            f"{masks.end_step()}); a masked model is not a transformers {family(src.config).hf_class}: export a "
            f"checkpoint from step >= {masks.end_step()}"
        )
    t = model_tokenizer(src, tokenizer)  # before any work: an unknown tokenizer is refused at once
    check_overlap(out, src)  # before the lock: its file goes beside out
    with one_writer(out, "--export_hf"):  # a second export of the same folder is refused, nothing touched
        check_output(out, src, overwrite, replaceable=check_replaceable)  # an export's own marker, not growlm-grow's
        _write(src, out, t, overwrite)
    log(
        f"growlm-grow: exported {src.tag_dir} ({src.config.shape_str()}) to {out} (transformers "
        f"{family(src.config).hf_class}, tokenizer {t.name})"
    )
    return out


def to_transformers(model: Any, eot_token_id: int, bos_token_id: int | None = None) -> Any:
    """The transformers model of ``model``'s family holding its fp32 weights (its adapter's ``to_hf``:
    ``GPT2LMHeadModel``, ``LlamaForCausalLM``, ``Qwen2ForCausalLM``), with ``eot_token_id`` as eos token id and
    ``bos_token_id`` (None: ``eot_token_id``) as bos token id, in its config and generation config.

    Raises:
        ValueError: the model still carries growth masks.
    """
    bos = eot_token_id if bos_token_id is None else bos_token_id
    return family(model.config).hf.to_hf(model, bos_token_id=bos, eos_token_id=eot_token_id)


def _write(src: Source, out: Path, t: tok.Tokenizer, overwrite: bool) -> None:
    """Build the export of ``src`` with tokenizer ``t`` in a temporary folder and rename it to ``out``."""
    step = src.state.global_step
    with atomic_dir(out, overwrite=overwrite) as tmp:
        model = fp32_model(src)  # masks done ramping (checked above): a plain GPT-2 or Llama
        bos = t.special("bos_token")  # the token folder's record (a model folder's bos), else end-of-text
        hf = to_transformers(model, t.eot_token_id, None if bos is None else bos[1])
        with quiet_transformers():  # transformers' "Writing model shards" bar: growlm-grow says what it wrote
            hf.save_pretrained(str(tmp), safe_serialization=True)
        written = json.loads((tmp / "config.json").read_text(encoding="utf-8"))
        fixed = family(model.config).hf.config_json(written, model.config)  # e.g. transformers 4's rope_theta
        if fixed != written:
            atomic.write_json(tmp / "config.json", fixed, overwrite=True)
        t.save_hf(tmp, model_max_length=src.config.n_positions)
        marker = {"format": EXPORT_FORMAT, "source": src.tag_dir.name, "step": step, "shape": src.config.shape_str(),
                  "tokenizer": t.name}  # fmt: skip
        (tmp / EXPORT_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
