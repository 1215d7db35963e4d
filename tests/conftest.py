"""Shared fixtures. Tests import helpers from this folder (``dist_utils``) and the project from the repo root."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
for p in (str(REPO), str(Path(__file__).resolve().parent)):
    if p not in sys.path:
        sys.path.insert(0, p)


@pytest.fixture(scope="session")
def builtin_data() -> Path:
    """The built-in corpus as a prepared token folder (prepared once, ~8 s, then reused)."""
    from data.prepare import ensure_builtin_prepared

    return ensure_builtin_prepared()
