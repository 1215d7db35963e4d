"""growlm as a user installs it on a GPU node without internet, beside the node's own packages.

The node is a new virtual environment holding torch (this environment's torch and what torch needs, linked in: the
stand-in for a node's CUDA torch, the only torch this machine installs without gigabytes of downloads) and older
releases than this environment's of packages a GPU image holds (``NODE_PACKAGES``: numpy 2.x, transformers 5.x and
what it needs, tqdm, pyyaml, psutil). ``install/wheelhouse.py --node_freeze`` (``make wheelhouse NODE_FREEZE=FILE``)
takes the node's ``pip list --format=freeze`` and collects growlm's wheel, DeepSpeed's (built from its sdist) and
only the dependencies the node lacks, resolved against the node's versions, which it pins in node-constraints.txt;
``make install-offline`` installs them with ``pip --no-index``: no version the node had changes. The installed
growlm-train then trains from another folder on the built-in corpus (package data), writing its cache under
GROWLM_CACHE and nothing into the installed package, and a representative set of growlm's unit tests
(``NODE_UNIT_TESTS``: the model, its layers, the tokenizer export through transformers, ZeRO shard files) passes
there.

pip reads no configuration file in the offline step (``PIP_CONFIG_FILE=/dev/null``), so no index or local wheel folder
of this machine can stand in for the wheelhouse.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from importlib.metadata import distribution, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

import growlm

REPO = Path(growlm.__file__).resolve().parent
# the node's packages besides torch: older releases than this environment's (transformers brings tokenizers,
# safetensors, huggingface_hub, regex, typer and pydantic at the versions pip resolves beside the linked torch)
NODE_PACKAGES = ["numpy==2.3.5", "transformers==5.14.1", "tqdm==4.67.1", "pyyaml==6.0.3", "psutil==7.1.3"]
NODE_UNIT_TESTS = ["test_layers.py", "test_model.py", "test_export_tokenizer.py", "test_zero_shards.py"]


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


def _freeze(py: Path, cwd: Path) -> dict[str, str]:
    """The environment's distributions, canonical name -> version, as ``pip list --format=freeze`` writes them."""
    out = _run([str(py), "-m", "pip", "list", "--format=freeze"], cwd, _clean_env()).stdout
    return {canonicalize_name(n): v for n, v in (line.split("==") for line in out.split())}


class Node:
    """The stand-in GPU node: a virtual environment (``venv``, ``py``, ``site``) and its pip freeze file."""

    def __init__(self, root: Path):
        self.venv = root / "node"
        self.py = self.venv / "bin" / "python"
        _run([sys.executable, "-m", "venv", str(self.venv)], cwd=root)
        self.site = Path(_run([str(self.py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              root).stdout.strip())  # fmt: skip
        self.linked = link_torch_only(self.site)
        keep = root / "keep.txt"  # the linked torch and what it needs stay as they are
        keep.write_text("".join(f"{k}=={v}\n" for k, v in _freeze(self.py, root).items()))
        _run(
            [str(self.py), "-m", "pip", "install", "-q", "--constraint", str(keep), *NODE_PACKAGES], root, _clean_env()
        )
        self.freeze = root / "node-freeze.txt"
        self.freeze.write_text(_run([str(self.py), "-m", "pip", "list", "--format=freeze"], root, _clean_env()).stdout)


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Node:
    return Node(tmp_path_factory.mktemp("node"))


@pytest.fixture(scope="module")
def wheelhouse(node, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheelhouse")
    r = _run([sys.executable, str(REPO / "install" / "wheelhouse.py"), "--out", str(out), "--node_freeze",
              str(node.freeze)], cwd=out)  # fmt: skip
    assert "what the node lacks" in r.stdout
    return out


def _offline(wheelhouse: Path, py: Path) -> list[str]:
    return ["make", "-s", "-C", str(REPO), "install-offline", f"WHEELHOUSE={wheelhouse}", f"NODE_PYTHON={py}"]


@pytest.fixture(scope="module")
def installed(node, wheelhouse, tmp_path_factory) -> tuple[dict[str, str], dict[str, str], str]:
    """make install-offline into the node: its freeze before and after, and make's output."""
    cwd = tmp_path_factory.mktemp("install")
    before = _freeze(node.py, cwd)
    r = _run(_offline(wheelhouse, node.py), cwd, _clean_env())
    return before, _freeze(node.py, cwd), r.stdout


def test_the_wheelhouse_holds_what_the_node_lacks_and_pins_what_it_has(node, wheelhouse):
    names = sorted(p.name for p in wheelhouse.glob("*.whl"))
    (whl,) = [n for n in names if n.startswith("growlm-")]
    (ds,) = [n for n in names if n.startswith("deepspeed-")]
    assert ds.endswith("-py3-none-any.whl")  # no compiled op: DeepSpeed builds them just in time on the node
    assert not [n for n in names if n.split("-")[0].lower() in ("torch", "triton") or n.startswith("nvidia_cu")]
    held = {canonicalize_name(n.split("-")[0]) for n in names}
    for needed in ("datasets", "hjson", "tensorboard", "scipy", "tiktoken", "matplotlib"):
        assert needed in held, needed
    pins = node.freeze.read_text().split()
    on_node = {canonicalize_name(line.split("==")[0]) for line in pins}
    assert {"numpy", "transformers", "tokenizers", "safetensors", "tqdm", "pyyaml", "psutil", "torch"} <= on_node
    assert not held & on_node  # nothing the node has is collected again
    constraints = (wheelhouse / "node-constraints.txt").read_text().split()
    assert "numpy==2.3.5" in constraints and "transformers==5.14.1" in constraints
    assert len(constraints) == len(pins) and {c.split("==")[0] for c in constraints} == on_node
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


def test_wheelhouse_refuses_a_node_whose_version_growlm_cannot_use(node, tmp_path):
    freeze = tmp_path / "freeze.txt"
    freeze.write_text(node.freeze.read_text().replace("numpy==2.3.5", "numpy==1.23.5"))
    r = _run([sys.executable, str(REPO / "install" / "wheelhouse.py"), "--out", str(tmp_path / "w"), "--node_freeze",
              str(freeze)], cwd=tmp_path, rc=2)  # fmt: skip
    assert r.stderr.splitlines()[-1] == (
        f"wheelhouse: error: the node's numpy 1.23.5 does not meet growlm {growlm.__version__}'s requirement "
        "numpy>=1.24: upgrade numpy on the node and take its pip freeze again"
    )
    assert not (tmp_path / "w").exists()  # refused before anything is downloaded


def test_install_offline_refuses_before_changing_anything(node, wheelhouse, tmp_path):
    env = _clean_env()
    before = _freeze(node.py, tmp_path)
    bare = tmp_path / "bare"  # an environment without torch
    _run([sys.executable, "-m", "venv", "--without-pip", str(bare)], cwd=tmp_path)
    r = _run(_offline(wheelhouse, bare / "bin" / "python"), tmp_path, env, rc=2)
    assert "has no torch: install the node's CUDA torch first" in r.stdout + r.stderr
    r = _run(_offline(tmp_path, node.py), tmp_path, env, rc=2)
    assert "no growlm wheel in WHEELHOUSE=" in r.stdout + r.stderr
    other = tmp_path / "other-node"  # the wheelhouse of a node whose numpy is 2.3.4
    other.mkdir()
    for w in wheelhouse.glob("*.whl"):
        (other / w.name).symlink_to(w)
    pins = (wheelhouse / "node-constraints.txt").read_text()
    (other / "node-constraints.txt").write_text(pins.replace("numpy==2.3.5", "numpy==2.3.4"))
    r = _run(_offline(other, node.py), tmp_path, env, rc=2)
    assert "this environment differs from the node the wheelhouse was collected for" in r.stderr
    assert "numpy 2.3.5 (wanted 2.3.4)" in r.stderr and "keeping" not in r.stdout
    assert _freeze(node.py, tmp_path) == before


def test_install_offline_adds_packages_and_changes_no_installed_version(node, installed):
    before, after, out = installed
    assert {"torch", "numpy", "transformers", "tokenizers", "tqdm", "pyyaml", "psutil"} <= set(before)
    assert Version(before["numpy"]) < Version(version("numpy"))  # older than this environment's: nothing upgraded
    assert Version(before["transformers"]) < Version(version("transformers"))
    assert {k: after.get(k) for k in before} == before  # every package the node had, at its version
    assert {"growlm", "deepspeed", "datasets", "hjson", "tensorboard", "scipy"} <= set(after) - set(before)
    assert f"keeping the node's {len(before)} packages at their versions" in out
    assert f"keeping torch {before['torch']}" in out
    torch_dir = next(node.site.glob("torch-*.dist-info"))
    assert torch_dir.is_symlink() and (node.site / "torch").is_symlink()  # torch (and what it needs) never replaced
    _run([str(node.py), "-m", "pip", "check"], node.venv, _clean_env())  # every requirement met


def test_an_offline_install_beside_the_node_trains_from_another_folder(node, wheelhouse, installed, tmp_path):
    py, site, venv = node.py, node.site, node.venv

    def others() -> dict[str, int]:  # every installed distribution but growlm, by its metadata's mtime
        return {d.name: d.stat().st_mtime_ns for d in site.glob("*.dist-info") if not d.name.startswith("growlm-")}

    before_again = others()
    init = site / "growlm" / "__init__.py"
    init.write_text(init.read_text() + "STALE = True  # an older build of the same version\n")
    _run(_offline(wheelhouse, py), tmp_path, _clean_env())  # again: growlm itself is reinstalled (a rebuilt wheel
    assert "STALE" not in init.read_text()  # of the same version) ...
    assert others() == before_again  # ... and nothing else is touched
    installed_pkg = site / "growlm"
    code = "import growlm, deepspeed; print('where', growlm.PACKAGE_DIR, deepspeed.__file__)"
    where = _run([str(py), "-c", code], tmp_path, _clean_env(DS_ACCELERATOR="cpu")).stdout.splitlines()
    _, pkg, ds = next(line for line in where if line.startswith("where ")).split()
    assert Path(pkg) == installed_pkg.resolve() and Path(ds).is_relative_to(site)  # the installed packages
    before = _files(installed_pkg)
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
              str(installed_pkg / "ds_configs" / "zero1_fp32.json"), "--out_dir", "run"], work, env)  # fmt: skip
    assert (work / "run" / "checkpoints" / "global_step2" / "growlm_state.json").is_file()
    assert "shm_comm" not in r.stdout + r.stderr  # DeepSpeed's CPU shared-memory op: never built (runtime.dist) ...
    assert not list((tmp_path / "ops").glob("*shm*"))  # ... and nothing compiled for it
    assert (tmp_path / "cache" / "builtin" / "meta.json").is_file()  # the built-in corpus, prepared into the cache
    assert _files(installed_pkg) == before  # nothing written into the installed package


def test_growlm_unit_tests_pass_on_the_node(node, installed, tmp_path):
    _, after, _ = installed
    keep = tmp_path / "keep.txt"  # pytest and hypothesis join the node; nothing there changes
    keep.write_text("".join(f"{k}=={v}\n" for k, v in after.items()))
    _run([str(node.py), "-m", "pip", "install", "-q", "--constraint", str(keep), "pytest", "hypothesis"], tmp_path,
         _clean_env())  # fmt: skip
    assert {k: v for k, v in _freeze(node.py, tmp_path).items() if k in after} == after
    env = _clean_env(GROWLM_TEST_FORK="0", GROWLM_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    code = "import growlm, numpy, torch; print('on', growlm.PACKAGE_DIR, numpy.__version__, torch.__version__)"
    line = next(ln for ln in _run([str(node.py), "-c", code], tmp_path, env).stdout.splitlines() if ln[:3] == "on ")
    assert line.split()[1:] == [str((node.site / "growlm").resolve()), after["numpy"], torch_version(node)]
    tests = [str(REPO / "tests" / "unit" / t) for t in NODE_UNIT_TESTS]
    r = _run([str(node.py), "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], REPO, env)
    assert re.search(r"^(\d+) passed", r.stdout.splitlines()[-1]), r.stdout[-2000:]
    assert " failed" not in r.stdout.splitlines()[-1] and " error" not in r.stdout.splitlines()[-1]


def torch_version(node: Node) -> str:
    return _run([str(node.py), "-c", "import torch; print(torch.__version__)"], node.venv, _clean_env()).stdout.strip()
