"""The one reader of a transformers folder's ``config.json``, for every command that reads one (train.py
--init_from through trainer.init_from, growlm-eval through the same, growlm-prepare --tokenizer): the file read as
JSON, its ``model_type`` checked against the families (model.registry.model_type_problem), and every value its
family reads checked for kind and range by the family's adapter (``config_problem`` of model/<family>/hf.py, over
model.hf_fields) before transformers sees it. What is wrong is a ``FolderError`` whose message is the problem and
the fix of a one-line refusal; each command puts its own prefix before it (``--init_from DIR: `` or ``DIR: ``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from growlm.model.config import ModelConfig
from growlm.model.registry import Family, family_of_model_type, model_type_problem

CONFIG_FILE = "config.json"
FOLDER_FIX = "give a transformers GPT-2, Llama or Qwen 2 folder"


class FolderError(ValueError):
    """What is wrong with a transformers folder: the problem and the fix of a one-line refusal, without the
    command's prefix (e.g. ``config.json: head_dim is 15, not an even number (...); correct it in config.json``)."""


def read_config_json(path: str | Path) -> dict[str, Any]:
    """The parsed ``config.json`` of the folder ``path``, a JSON object (not yet checked against the families).

    Raises:
        FolderError: no such folder, no config.json, not UTF-8 JSON, or not a JSON object.
    """
    path = Path(path)
    if not path.is_dir():
        raise FolderError(f"no such folder; {FOLDER_FIX} ({CONFIG_FILE} + model.safetensors)")
    file = path / CONFIG_FILE
    if not file.is_file():
        raise FolderError(f"has no {CONFIG_FILE}; {FOLDER_FIX} (e.g. growlm-grow CKPT --export_hf)")
    try:
        d = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FolderError(f"{CONFIG_FILE} is not valid JSON ({e}); {FOLDER_FIX}") from None
    if not isinstance(d, dict):
        raise FolderError(model_type_problem(d))
    return d


def config_problem(d: Any) -> str | None:
    """What is wrong with a parsed config.json for growlm, as a one-line problem and fix, or None: a model type or
    architecture growlm does not read (model.registry.model_type_problem), or a value of its family's fields of the
    wrong kind or range (the adapter's ``config_problem``: types, positivity, divisibility, rotary pairs, rope
    scaling fields). What growlm's models do not compute (a rope type, biases) is left to the adapter's
    ``config_from_dict``."""
    problem = model_type_problem(d)
    if problem is not None:
        return problem
    return family_of_model_type(d["model_type"]).hf.config_problem(d)


def read_config(path: str | Path) -> tuple[dict[str, Any], Family]:
    """The checked ``config.json`` of the folder ``path`` and its family.

    Raises:
        FolderError: see ``read_config_json`` and ``config_problem``.
    """
    d = read_config_json(path)
    problem = config_problem(d)
    if problem is not None:
        raise FolderError(problem)
    return d, family_of_model_type(d["model_type"])


def config_vocab_size(path: str | Path) -> int | None:
    """The ``vocab_size`` of the folder ``path``'s config.json (the rows of its embedding), checked with every other
    value of its family (``config_problem``), for growlm-prepare --tokenizer; None when the folder has no
    config.json (a tokenizer's own folder), when it describes a model type growlm does not read (any folder's
    tokenizer may make a token folder), or when it names no vocab_size.

    Raises:
        FolderError: config.json is not JSON, or a value of a family growlm reads is malformed.
    """
    if not (Path(path) / CONFIG_FILE).is_file():
        return None
    d = read_config_json(path)
    if model_type_problem(d) is not None:
        return None
    problem = config_problem(d)
    if problem is not None:
        raise FolderError(problem)
    return d.get("vocab_size")


def model_config(path: str | Path) -> ModelConfig:
    """The growlm model shape of the folder ``path``'s config.json (checked by ``read_config``), converted by its
    family's adapter (``config_from_dict``: transformers' own config class, then growlm's). Call inside
    runtime.quiet.quiet_transformers where transformers' warnings must not reach the user.

    Raises:
        FolderError: see ``read_config``; a variant growlm's model does not implement (the adapter's
            ``from_hf_config``: another activation, a rope type, biases, a sliding window); or anything else
            transformers' own config refuses, in one line.
    """
    d, fam = read_config(path)
    try:
        return fam.hf.config_from_dict(d)
    except (TypeError, ValueError, KeyError, ArithmeticError) as e:
        raise FolderError(f"{CONFIG_FILE}: {' '.join(str(e).split())}") from None
    except Exception as e:  # huggingface_hub's strict-dataclass errors: transformers' own validators
        if not type(e).__module__.startswith("huggingface_hub"):
            raise
        raise FolderError(
            f"{CONFIG_FILE}: transformers cannot read it ({' '.join(str(e).split())}); correct it in {CONFIG_FILE}"
        ) from None
