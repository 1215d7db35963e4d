"""Test-only hold points: make "killed while it writes" deterministic for the crash-safety tests.

A crash test (tests/distributed/test_crash_safety.py) needs a process to be killed at an exact moment, e.g. after a
checkpoint's temporary folder is written and before it is renamed into place. The writers call ``hold_point(name)``
at such moments. It does nothing unless the environment variable ``GROWLM_TEST_HOLD_AT`` equals ``name``; then it
writes an empty marker file ``<name>.<pid>`` into the folder named by ``GROWLM_TEST_HOLD_DIR`` and sleeps until the
process is killed, so the test can wait for the marker and ``kill -9`` the process by its PID.

Points (``name``): ``checkpoint.commit:<tag>`` (runtime.checkpoint.save: every rank has written ``.tmp-<tag>``,
growlm_state.json and the manifest included; rank 0, before the rename and the ``latest`` update),
``checkpoint.written:<tag>`` (runtime.checkpoint.save: this rank has written its files into ``.tmp-<tag>``, before
the barrier that ends the writing; every rank), ``grow.commit`` (growth.offline.pipeline.grow_checkpoint: converted
and grown tensors written in the temporary output, before growlm_state.json, the manifest, ``latest`` and the
rename), ``live.applied`` (growth.live.grow.grow_engine: every parameter written into the new engine, old engine
not yet destroyed; every rank), ``train.step:<N>`` (trainer.run.train: step N done and logged, before its validation
and save; every rank), ``tokens.finish`` (data.tokens.TokenFolderWriter: the token folder complete in
``.tmp-<name>``, before the rename; growlm-prepare and the small-vocabulary builder), ``train.stopped:<N>``
(trainer.run.stop_before_stage: the stop checkpoint at step N saved, its "stop" record not yet logged; every rank),
``driver.launched:<K>`` (growlm-run, trainer.driver.phases: the
driver itself, right after starting segment K's job).

Nobody sets these variables in normal use; no other code reads them. Standard library only.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

HOLD_AT_ENV = "GROWLM_TEST_HOLD_AT"
HOLD_DIR_ENV = "GROWLM_TEST_HOLD_DIR"


def hold_point(name: str) -> None:
    """Block forever at point ``name`` when ``GROWLM_TEST_HOLD_AT`` equals it (after writing the marker file
    ``$GROWLM_TEST_HOLD_DIR/<name>.<pid>``, ``:`` replaced by ``_``); return at once otherwise."""
    if os.environ.get(HOLD_AT_ENV) != name:
        return
    folder = Path(os.environ.get(HOLD_DIR_ENV, "."))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name.replace(':', '_')}.{os.getpid()}").touch()
    while True:  # until SIGKILL
        time.sleep(3600)
