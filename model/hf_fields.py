"""The kinds of value a transformers ``config.json`` field may hold, and the one-line problem of a value of another
kind. Each family's adapter (model/<family>/hf.py) names its fields and their kinds (``CONFIG_FIELDS``) and checks
what follows from them (``config_problem``: divisibility, rotary pairs); model.hf_folder reads the file and asks the
adapter of its family. Every malformed value is found here, before transformers sees it: transformers' own
configs raise their own exceptions for them (a ZeroDivisionError, huggingface_hub's strict-dataclass errors) or,
worse, take them (a rope ``factor`` of "8" divides a tensor by a string only in the forward pass).

Kinds (JSON values; ``true`` / ``false`` are never numbers):

    count            a positive integer
    count or null    a positive integer, or null (transformers derives it)
    number           a positive finite number (an integer or a float)
    number or null   a positive finite number, or null
    fraction         a finite number in [0, 1) (a dropout probability)
    fraction or null a fraction, or null (no dropout)
    boolean          true or false
    text             a string
    object or null   a JSON object (its own fields are the adapter's to check), or null
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

KINDS = {
    "count": "a positive integer",
    "count or null": "a positive integer or null",
    "number": "a positive number",
    "number or null": "a positive number or null",
    "fraction": "a number in [0, 1)",
    "fraction or null": "a number in [0, 1) or null",
    "boolean": "true or false",
    "text": "a string",
    "object or null": "a JSON object or null",
}
FIX = "correct it in config.json"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _fits(value: Any, kind: str) -> bool:
    """Whether ``value`` (parsed JSON) is of ``kind`` (a key of ``KINDS``)."""
    if value is None and kind.endswith(" or null"):
        return True
    base = kind.removesuffix(" or null")
    if base == "count":
        return isinstance(value, int) and not isinstance(value, bool) and value > 0
    if base == "number":
        return _is_number(value) and value > 0
    if base == "fraction":
        return _is_number(value) and 0 <= value < 1
    if base == "boolean":
        return isinstance(value, bool)
    if base == "text":
        return isinstance(value, str)
    if base == "object":
        return isinstance(value, dict)
    raise ValueError(f"unknown config.json field kind {kind!r}; kinds are {sorted(KINDS)}")


def value_problem(name: str, value: Any, kind: str) -> str | None:
    """The one-line problem of ``value``, the field ``name`` of a config.json (dotted inside an object:
    "rope_scaling.factor"), when it is not of ``kind`` (a key of ``KINDS``), else None. E.g. ``config.json:
    vocab_size is "300", not a positive integer (a JSON number, without quotes); correct it in config.json``.

    Raises:
        ValueError: ``kind`` is not a known kind (a bug of the adapter that names it).
    """
    if _fits(value, kind):
        return None
    shown = json.dumps(value, allow_nan=True)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    hint = ""
    if isinstance(value, str) and not kind.startswith(("text", "object")):
        hint = " (a JSON number, without quotes)" if kind != "boolean" else " (JSON true or false, without quotes)"
    return f"config.json: {name} is {shown}, not {KINDS[kind]}{hint}; {FIX}"


def fields_problem(d: Mapping[str, Any], fields: Mapping[str, str], prefix: str = "") -> str | None:
    """The problem of the first field of ``fields`` (name -> kind) that ``d`` holds with a value of another kind,
    else None (absent fields are transformers' defaults). ``prefix``: the object's name for messages
    ("rope_scaling.")."""
    for name, kind in fields.items():
        if name in d:
            problem = value_problem(prefix + name, d[name], kind)
            if problem is not None:
                return problem
    return None
