"""growlm as a user installs it on a GPU node without internet: ``install/wheelhouse.py`` (``make wheelhouse``) collects
growlm's wheel, DeepSpeed's (built from its sdist) and every other dependency except torch; ``make install-offline``
installs them with ``pip --no-index`` into a new virtual environment that holds only torch (this environment's torch
and what torch needs, linked in: the stand-in for a node's CUDA torch), replacing nothing; the installed growlm-train
then trains from another folder on the built-in corpus (package data), writing its cache under GROWLM_CACHE and
nothing into the installed package.

pip reads no configuration file in the offline step (``PIP_CONFIG_FILE=/dev/null``), so no index or local wheel folder
of this machine can stand in for the wheelhouse.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from importlib.metadata import distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import growlm

REPO = Path(growlm.__file__).resolve().parent


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 900, rc: int = 0):
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == rc, (cmd, r.stdout[-3000:], r.stderr[-3000:])
    return r


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if "__pycache__" not in p.parts}


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env.pop("PYTHONPATH", None)
    env.update(extra)
    return env


def link_torch_only(site: Path) -> set[str]:
    """Link this environment's torch and the distributions torch requires (recursively) into SITE, a new
    environment's site-packages; returns their canonical names."""
    todo, seen = ["torch"], set()
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        dist = distribution(name)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
        for top in {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            if not (site / top).exists():
                (site / top).symlink_to(Path(str(dist.locate_file(top))))
    return seen


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheelhouse")
    _run([sys.executable, str(REPO / "install" / "wheelhouse.py"), "--out", str(out)], cwd=out)
    return out


def test_the_wheelhouse_holds_growlm_and_a_pure_python_deepspeed_and_no_torch(wheelhouse):
    names = sorted(p.name for p in wheelhouse.glob("*.whl"))
    (whl,) = [n for n in names if n.startswith("growlm-")]
    (ds,) = [n for n in names if n.startswith("deepspeed-")]
    assert ds.endswith("-py3-none-any.whl")  # no compiled op: DeepSpeed builds them just in time on the node
    assert not [n for n in names if n.split("-")[0].lower() in ("torch", "triton") or n.startswith("nvidia_cu")]
    for needed in ("transformers", "datasets", "hjson", "pydantic", "safetensors", "tensorboard", "scipy"):
        assert any(n.lower().startswith(needed + "-") for n in names), needed
    reqs = (wheelhouse / "requirements.txt").read_text().split()
    assert "hjson" in reqs and not [r for r in reqs if r.startswith(("torch", "deepspeed", "growlm"))]
    files = zipfile.ZipFile(wheelhouse / whl).namelist()
    assert {n.split("/")[0] for n in files} == {"growlm", f"growlm-{growlm.__version__}.dist-info"}
    for data in ("growlm/ds_configs/zero2_fp32.json", "growlm/data/gpt2_bpe/vocab.bpe",
                 "growlm/data/corpus/MANIFEST.json", "growlm/growth/plans/tiny_msg.yaml", "growlm/train.py",
                 "growlm/trainer/cli.py"):  # fmt: skip
        assert data in files, data
    assert not [n for n in files if n.startswith(("growlm/tests/", "growlm/eval/results/", "growlm/setup.py"))]
    assert not [n for n in files if n.startswith("growlm/install/")]  # the wheelhouse builder stays in the clone


def test_wheelhouse_refuses_a_bad_python_version(tmp_path):
    r = _run([sys.executable, str(REPO / "install" / "wheelhouse.py"), "--out", str(tmp_path / "w"),
              "--python_version", "3"], cwd=tmp_path, rc=2)  # fmt: skip
    assert r.stderr.strip() == "wheelhouse: error: --python_version 3: give MAJOR.MINOR, for example 3.12"
    assert not (tmp_path / "w").exists()


def test_an_offline_install_beside_torch_trains_from_another_folder(wheelhouse, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    py = venv / "bin" / "python"
    site = Path(
        _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path).stdout.strip()
    )
    offline = ["make", "-s", "-C", str(REPO), "install-offline", f"WHEELHOUSE={wheelhouse}", f"NODE_PYTHON={py}"]
    env = _clean_env()
    # refusals first: an environment without torch, a folder without the wheels; nothing is installed
    r = _run(offline, tmp_path, env, rc=2)
    assert "has no torch: install the node's CUDA torch first" in r.stdout + r.stderr
    r = _run([*offline[:-2], f"WHEELHOUSE={tmp_path}", f"NODE_PYTHON={py}"], tmp_path, env, rc=2)
    assert "no growlm wheel in WHEELHOUSE=" in r.stdout + r.stderr
    linked = link_torch_only(site)
    assert {"torch", "sympy", "filelock"} <= linked and "deepspeed" not in linked
    torch_dir = next(site.glob("torch-*.dist-info"))

    r = _run(offline, tmp_path, env)
    assert "keeping torch" in r.stdout
    assert torch_dir.is_symlink() and (site / "torch").is_symlink()  # torch (and what it needs) never replaced
    _run([str(py), "-m", "pip", "check"], tmp_path, env)  # every requirement met from the wheelhouse

    def others() -> dict[str, int]:  # every installed distribution but growlm, by its metadata's mtime
        return {d.name: d.stat().st_mtime_ns for d in site.glob("*.dist-info") if not d.name.startswith("growlm-")}

    before_again = others()
    init = site / "growlm" / "__init__.py"
    init.write_text(init.read_text() + "STALE = True  # an older build of the same version\n")
    _run(offline, tmp_path, env)  # again: growlm itself is reinstalled (a rebuilt wheel of the same version) ...
    assert "STALE" not in init.read_text()
    assert others() == before_again  # ... and nothing else is touched
    installed = site / "growlm"
    code = "import growlm, deepspeed; print('where', growlm.PACKAGE_DIR, deepspeed.__file__)"
    where = _run([str(py), "-c", code], tmp_path, _clean_env(DS_ACCELERATOR="cpu")).stdout.splitlines()
    _, pkg, ds = next(line for line in where if line.startswith("where ")).split()
    assert Path(pkg) == installed.resolve() and Path(ds).is_relative_to(site)  # the installed packages, not the clone
    before = _files(installed)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = _clean_env(
        GROWLM_CACHE=str(tmp_path / "cache"),
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(__import__("dist_utils").free_port()),
        TORCH_EXTENSIONS_DIR=str(tmp_path / "ops"),
    )  # an op DeepSpeed builds goes here, not into the test environment's cache
    helptext = _run([str(venv / "bin" / "growlm-train"), "--help"], work, env).stdout
    assert "(default: 200)" in helptext and "zero2_bf16.json" in helptext  # the packaged config is the default
    r = _run([str(venv / "bin" / "growlm-train"), "--preset", "tiny", "--seq_len", "32", "--max_steps", "2",
              "--no_final_eval", "--log_interval", "1", "--ds_config",
              str(installed / "ds_configs" / "zero1_fp32.json"), "--out_dir", "run"], work, env)  # fmt: skip
    assert (work / "run" / "checkpoints" / "global_step2" / "growlm_state.json").is_file()
    assert "shm_comm" not in r.stdout + r.stderr  # DeepSpeed's CPU shared-memory op: never built (runtime.dist) ...
    assert not list((tmp_path / "ops").glob("*shm*"))  # ... and nothing compiled for it
    assert (tmp_path / "cache" / "builtin" / "meta.json").is_file()  # the built-in corpus, prepared into the cache
    assert _files(installed) == before  # nothing written into the installed package
