"""Every test file has a basename of its own: pytest imports tests/unit and tests/distributed as top-level modules
(rootdir-relative, no packages), so two files of one name in two folders fail collection with "import file
mismatch"."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_basename():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert not [n for n, count in names.items() if count > 1], sorted(n for n, c in names.items() if c > 1)
