"""Shared fixtures and the test kinds.

``tests/unit/`` holds fast tests that start no process (``pytest -m "not dist"`` runs only these, in about 2.5
minutes on 2 cores); ``tests/distributed/`` holds tests that start real runs (train.py, growlm-grow, 2 ranks over
gloo on loopback), marked ``dist`` here by folder. Tests import helpers from this folder (``dist_utils``,
``growth_helpers``) and the project as the installed package ``growlm`` (``pip install -e .``). Ranks started through
``growlm.runtime.launch.launch_ranks`` are forked from ``rank_server.py`` (imports done once) unless GROWLM_TEST_FORK=0.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)


@pytest.fixture(scope="session")
def builtin_data() -> Path:
    """The built-in corpus as a prepared token folder (prepared once, ~8 s, then reused)."""
    from growlm.data.prepare import ensure_builtin_prepared

    return ensure_builtin_prepared()


@pytest.fixture(scope="session")
def small_vocab_data() -> Path:
    """The built-in corpus tokenized with a ByteLevel BPE of ``dist_utils.SMALL_VOCAB`` tokens (data.small_vocab),
    prepared once into growlm's cache (~20 s; growlm-experiment's default token folder, so shared with it). Tests whose
    tokenizer does not matter train on it with ``--vocab_size SMALL_VOCAB``: a tiny model's step is then about 20x
    cheaper than at GPT-2's 50,257 tokens when bf16 is emulated (no AVX512-BF16/AMX), the LM head being most of it."""
    from dist_utils import SMALL_DATA, SMALL_VOCAB

    from growlm.data.small_vocab import ensure_small_vocab

    return ensure_small_vocab(SMALL_DATA, SMALL_VOCAB)  # pytest-xdist workers: one prepares, the other waits


def pytest_configure(config: pytest.Config) -> None:
    """Ranks started through ``growlm.runtime.launch.launch_ranks`` in this process are forked from the tests' fork
    server (rank_server.py: torch, DeepSpeed and growlm imported once) unless GROWLM_TEST_FORK=0."""
    if os.environ.get("GROWLM_TEST_FORK", "1") != "0":
        import rank_server

        from growlm.runtime import launch

        launch.start_rank = rank_server.make_start_rank(launch.start_rank)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test under tests/distributed/ with ``dist`` (multi-process or whole-run tests)."""
    dist_dir = Path(__file__).resolve().parent / "distributed"
    for item in items:
        if dist_dir in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.dist)
