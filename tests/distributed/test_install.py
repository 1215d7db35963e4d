"""growlm as a user installs it: a wheel built from the repository holds only the ``growlm`` package (and its
dist-info) at its top level, and a non-editable install of it into a new virtual environment runs growlm-train from
another folder on the built-in corpus (package data), writing its cache under GROWLM_CACHE and nothing into the
installed package.

The new environment borrows the test environment's dependencies (torch, DeepSpeed, ...) through a .pth file, so
only growlm itself is installed (``--no-deps --no-index``); the wheel is built without build isolation.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import growlm

REPO = Path(growlm.__file__).resolve().parent


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600):
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, (cmd, r.stdout[-3000:], r.stderr[-3000:])
    return r


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of a copy of the repository's files (setuptools' build/ folder then stays out of the clone)."""
    out, src = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("src") / "growlm"
    skip = shutil.ignore_patterns(".git", ".venv", "runs", "build", "*.egg-info", "__pycache__", ".*_cache", "cache")
    shutil.copytree(REPO, src, ignore=skip, symlinks=True)
    _run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q", "-w", str(out)],
         cwd=out)  # fmt: skip
    (whl,) = out.glob("growlm-*.whl")
    return whl


def test_the_wheel_holds_only_the_growlm_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"growlm", f"growlm-{growlm.__version__}.dist-info"}
    for data in ("growlm/ds_configs/zero2_fp32.json", "growlm/data/gpt2_bpe/vocab.bpe",
                 "growlm/data/corpus/MANIFEST.json", "growlm/growth/plans/tiny_msg.yaml", "growlm/train.py",
                 "growlm/trainer/cli.py"):  # fmt: skip
        assert data in names, data
    assert not [n for n in names if n.startswith(("growlm/tests/", "growlm/eval/results/", "growlm/setup.py"))]


def test_a_non_editable_install_trains_from_another_folder(wheel, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    py = venv / "bin" / "python"
    site = Path(
        _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path).stdout.strip()
    )
    (site / "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], cwd=tmp_path)
    installed = site / "growlm"
    where = _run([str(py), "-c", "import growlm; print(growlm.PACKAGE_DIR)"], tmp_path).stdout.strip()
    assert Path(where) == installed.resolve()  # the installed package, not the clone
    before = _files(installed)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PYTHONPATH")}
    env.update(GROWLM_CACHE=str(tmp_path / "cache"), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(__import__("dist_utils").free_port()))  # fmt: skip
    helptext = _run([str(venv / "bin" / "growlm-train"), "--help"], work, env).stdout
    assert "(default: 200)" in helptext and "zero2_bf16.json" in helptext  # the packaged config is the default
    _run([str(venv / "bin" / "growlm-train"), "--preset", "tiny", "--seq_len", "32", "--max_steps", "2",
          "--no_final_eval", "--log_interval", "1", "--ds_config", str(installed / "ds_configs" / "zero1_fp32.json"),
          "--out_dir", "run"], work, env)  # fmt: skip
    assert (work / "run" / "checkpoints" / "global_step2" / "growlm_state.json").is_file()
    assert (tmp_path / "cache" / "builtin" / "meta.json").is_file()  # the built-in corpus, prepared into the cache
    assert _files(installed) == before  # nothing written into the installed package
