"""install/wheelhouse.py's command line, its reading of a node's pip freeze and its checks against the node's versions,
install/node_check.py, and the Makefile's wheelhouse and install-offline parameters (the real build and offline install
run in tests/distributed/test_install.py)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NODE_FREEZE = REPO / "tests" / "fixtures" / "node_freeze_torch211.txt"  # a managed GPU image: torch 2.11.0, CUDA 13


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "install" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def wheelhouse():
    return _load("wheelhouse")


@pytest.fixture(scope="module")
def node_check():
    return _load("node_check")


def _wheel(folder: Path, name: str, version: str, *requires: str) -> Path:
    whl = folder / f"{name}-{version}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr(f"{name}-{version}.dist-info/METADATA", meta)
    return whl


def test_target_python_and_platform_reach_pip(wheelhouse, monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(wheelhouse, "build", lambda *a: calls.append(a) or [])
    assert wheelhouse.main(["--out", str(tmp_path), "--python_version", "3.12", "--deepspeed", "0.19.8"]) == 0
    assert calls[-1] == (tmp_path, "3.12", wheelhouse.X86_64_PLATFORMS, "0.19.8", None)  # manylinux 2.17 .. 2.39
    assert "manylinux_2_28_x86_64" in wheelhouse.X86_64_PLATFORMS
    argv = ["--out", str(tmp_path), "--python_version", "3.12", "--platform", "manylinux_2_28_x86_64"]
    assert wheelhouse.main(argv) == 0
    assert calls[-1][1:3] == ("3.12", ["manylinux_2_28_x86_64"])
    assert wheelhouse.main(["--out", str(tmp_path)]) == 0
    assert calls[-1][1:3] == (None, [])  # this interpreter and machine


def test_dependencies_leave_out_torch_and_cuda_but_keep_pynvml(wheelhouse, tmp_path):
    whl = _wheel(tmp_path, "pkg", "1.0", "torch>=2.5", "nvidia-cublas-cu12", "nvidia-ml-py", "triton", "hjson",
                 "pytest; extra == 'dev'", "numpy>=1.24; python_version >= '3.9'")  # fmt: skip
    assert wheelhouse.dependency_lines([whl]) == ["nvidia-ml-py", "hjson", 'numpy>=1.24; python_version >= "3.9"']


def test_make_passes_the_parameters():
    r = subprocess.run(["make", "-n", "-s", "wheelhouse", "WHEELHOUSE=/w", "PY_VERSION=3.12",
                        "PLATFORM=manylinux_2_28_x86_64 manylinux2014_x86_64"], cwd=REPO, capture_output=True,
                       text=True)  # fmt: skip
    cmd = r.stdout.replace("\\\n", " ")  # make -n echoes the recipe's continuation lines as written
    line = next(ln for ln in cmd.splitlines() if "install/wheelhouse.py" in ln)
    assert line.split("install/wheelhouse.py", 1)[1].split() == [
        "--out", "/w", "--python_version", "3.12", "--platform", "manylinux_2_28_x86_64", "--platform",
        "manylinux2014_x86_64",
    ]  # fmt: skip


def test_node_freeze_reaches_the_build_and_a_node_deepspeed_is_not_built(wheelhouse, monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(wheelhouse, "build", lambda *a: calls.append(a) or [])
    assert wheelhouse.main(["--out", str(tmp_path), "--deepspeed", "0.19.8", "--node_freeze", str(NODE_FREEZE)]) == 0
    out, python_version, platforms, ds, node = calls[-1]
    assert (python_version, platforms, ds) == (None, [], "0.19.8")
    assert len(node) == 75 and node["torch"] == "2.11.0" and node["numpy"] == "2.3.5" and node["pyyaml"] == "6.0.3"
    assert node["transformers"].startswith("5.") and node["nvidia-cudnn-cu13"] == "9.19.0.56"
    assert not {"deepspeed", "datasets", "hjson", "growlm"} & set(node)  # what the node lacks
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("# a node with DeepSpeed\ntorch==2.11.0+cu130\nDeepSpeed==0.19.5\n\n")
    assert wheelhouse.main(["--out", str(tmp_path), "--node_freeze", str(freeze)]) == 0
    assert calls[-1][3:] == (None, {"torch": "2.11.0+cu130", "deepspeed": "0.19.5"})  # the node's DeepSpeed stays


@pytest.mark.parametrize(
    "text, problem",
    [
        ("numpy==2.3.5\n-e /src/pkg\n", "line 2: '-e /src/pkg' is not NAME==VERSION"),
        ("torch @ file:///wheels/torch-2.11.0-cp311-linux_x86_64.whl\n", "line 1: 'torch @ file:"),
        ("numpy>=2\n", "line 1: 'numpy>=2' is not NAME==VERSION"),
        ("numpy==two\n", "line 1: 'numpy==two' is not NAME==VERSION"),
        ("# nothing\n\n", "no NAME==VERSION line in it"),
    ],
)
def test_a_freeze_without_versions_is_refused_in_one_line(wheelhouse, tmp_path, capsys, text, problem):
    freeze = tmp_path / "freeze.txt"
    freeze.write_text(text)
    assert wheelhouse.main(["--out", str(tmp_path / "w"), "--node_freeze", str(freeze)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and problem in err
    assert err.startswith("wheelhouse: error: --node_freeze ")
    assert err.rstrip().endswith("on the node with `python -m pip list --format=freeze > node-freeze.txt`")
    assert not (tmp_path / "w").exists()


def test_a_missing_freeze_file_is_refused(wheelhouse, tmp_path, capsys):
    assert wheelhouse.main(["--out", str(tmp_path / "w"), "--node_freeze", str(tmp_path / "none.txt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "none.txt: cannot read it" in err and "No such file" in err


def test_a_requirement_the_node_fails_is_named_with_the_node_version(wheelhouse, tmp_path):
    whl = _wheel(tmp_path, "growlm", "0.2.0", "torch>=2.11", "numpy>=1.24", "oldlib<1; python_version < '3.0'",
                 "pytest>=99; extra == 'dev'", "hjson")  # fmt: skip
    node = wheelhouse.read_freeze(NODE_FREEZE)
    wheelhouse.check_node([whl], node, None)  # torch 2.11.0, numpy 2.3.5: met; hjson: not on the node
    wheelhouse.check_node([whl], {**node, "torch": "2.11.0+cu130", "oldlib": "2.0", "pytest": "8.0"}, "3.12")
    with pytest.raises(wheelhouse.WheelhouseError) as e:
        wheelhouse.check_node([whl], {**node, "numpy": "1.23.5"}, "3.12")
    assert str(e.value) == (
        "the node's numpy 1.23.5 does not meet growlm 0.2.0's requirement numpy>=1.24: upgrade numpy on the node and "
        "take its pip freeze again"
    )
    with pytest.raises(wheelhouse.WheelhouseError, match=r"the node's torch 2\.10\.0 does not meet .* torch>=2\.11"):
        wheelhouse.check_node([whl], {**node, "torch": "2.10.0"}, None)


def test_a_conflict_below_growlm_names_the_package_and_both_versions(wheelhouse, monkeypatch, tmp_path):
    # the node's versions pinned: no resolution; unpinned, the newest datasets asks for a newer pyarrow than the node's
    free = [{"name": "datasets", "version": "5.2.0", "requires_dist": ["pyarrow>=24.0.0", "xxhash",
                                                                        "pytest; extra == 'tests'"]},
            {"name": "pyarrow", "version": "26.0.1", "requires_dist": ["numpy>=9"]}]  # fmt: skip
    monkeypatch.setattr(wheelhouse, "_resolution", lambda reqs, constraints, *a: free if constraints is None else None)
    (tmp_path / "pinned").mkdir()
    (tmp_path / "pinned" / "pip.log").write_text("ERROR: ResolutionImpossible\n")
    node = {"pyarrow": "22.0.0", "numpy": "2.3.5"}
    with pytest.raises(wheelhouse.WheelhouseError) as e:
        wheelhouse.resolve(Path("reqs"), Path("pins"), node, [], None, tmp_path)
    assert str(e.value) == (
        "pip finds no versions that fit the node's packages: the newest datasets (5.2.0) requires pyarrow>=24.0.0 and "
        "the node has pyarrow 22.0.0: upgrade pyarrow on the node and take its pip freeze again"
    )  # pyarrow's own numpy>=9 is not looked at: the node keeps its pyarrow
    monkeypatch.setattr(wheelhouse, "_resolution", lambda *a: None)
    with pytest.raises(wheelhouse.WheelhouseError, match=r"against the node's versions failed \(pip's report"):
        wheelhouse.resolve(Path("reqs"), Path("pins"), node, [], None, tmp_path)
    monkeypatch.setattr(wheelhouse, "_resolution", lambda *a: free)
    assert wheelhouse.resolve(Path("reqs"), None, {}, [], None, tmp_path) == {
        "datasets": ("datasets", "5.2.0"),
        "pyarrow": ("pyarrow", "26.0.1"),
    }


def test_node_check_names_each_package_not_at_its_pinned_version(node_check, tmp_path, capsys):
    pins = tmp_path / "node-constraints.txt"
    here = version("pytest")
    pins.write_text(f"pytest=={here}\nPyYAML=={version('pyyaml')}\n")
    assert node_check.main([str(pins)]) == 0
    pins.write_text(f"pytest=={here}\nnumpy==0.0.1\nno-such-dist==1.0\n# comment\n")
    assert node_check.differences(pins) == [
        f"numpy {version('numpy')} (wanted 0.0.1)",
        "no-such-dist missing (wanted 1.0)",
    ]
    assert node_check.main([str(pins)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("make install-offline: this environment differs from the node")
    assert "numpy 0.0.1" not in err and "no-such-dist missing" in err
    assert node_check.main([str(tmp_path / "none.txt")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert node_check.main([]) == 2


def test_make_passes_the_node_freeze():
    r = subprocess.run(["make", "-n", "-s", "wheelhouse", "WHEELHOUSE=/w", "NODE_FREEZE=/f/node-freeze.txt"], cwd=REPO,
                       capture_output=True, text=True)  # fmt: skip
    line = next(ln for ln in r.stdout.replace("\\\n", " ").splitlines() if "install/wheelhouse.py" in ln)
    assert line.split("install/wheelhouse.py", 1)[1].split() == ["--out", "/w", "--node_freeze", "/f/node-freeze.txt"]


def test_every_wheelhouse_flag_and_make_variable_is_used_by_a_test(wheelhouse):
    tests = "\n".join(p.read_text() for p in (REPO / "tests").rglob("test_*.py"))
    flags = [o for a in wheelhouse.build_parser()._actions for o in a.option_strings if o not in ("-h", "--help")]
    assert "--node_freeze" in flags
    assert not [f for f in flags if not re.search(re.escape(f) + r"(?![\w-])", tests)]
    make = (REPO / "Makefile").read_text()
    recipes = make[make.index("\nwheelhouse:") : make.index("\nclean:")]
    variables = sorted(set(re.findall(r"\$\((WHEELHOUSE|NODE_[A-Z_]+|PY_VERSION|PLATFORM)\)", recipes)))
    assert variables == ["NODE_FREEZE", "NODE_PYTHON", "PLATFORM", "PY_VERSION", "WHEELHOUSE"]
    assert not [v for v in variables if f"{v}=" not in tests]
