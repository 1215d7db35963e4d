"""install/wheelhouse.py's command line and the Makefile's wheelhouse parameters (the real build and offline install
run in tests/distributed/test_install.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheelhouse():
    spec = importlib.util.spec_from_file_location("wheelhouse", REPO / "install" / "wheelhouse.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_target_python_and_platform_reach_pip(wheelhouse, monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(wheelhouse, "build", lambda *a: calls.append(a) or [])
    assert wheelhouse.main(["--out", str(tmp_path), "--python_version", "3.12", "--deepspeed", "0.19.8"]) == 0
    assert calls[-1] == (tmp_path, "3.12", wheelhouse.X86_64_PLATFORMS, "0.19.8")  # manylinux 2.17 .. 2.39
    assert "manylinux_2_28_x86_64" in wheelhouse.X86_64_PLATFORMS
    argv = ["--out", str(tmp_path), "--python_version", "3.12", "--platform", "manylinux_2_28_x86_64"]
    assert wheelhouse.main(argv) == 0
    assert calls[-1][1:3] == ("3.12", ["manylinux_2_28_x86_64"])
    assert wheelhouse.main(["--out", str(tmp_path)]) == 0
    assert calls[-1][1:3] == (None, [])  # this interpreter and machine


def test_dependencies_leave_out_torch_and_cuda_but_keep_pynvml(wheelhouse, tmp_path):
    whl = tmp_path / "pkg-1.0-py3-none-any.whl"
    meta = "Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n" + "".join(
        f"Requires-Dist: {r}\n"
        for r in ("torch>=2.5", "nvidia-cublas-cu12", "nvidia-ml-py", "triton", "hjson", "pytest; extra == 'dev'",
                  "numpy>=1.24; python_version >= '3.9'")
    )  # fmt: skip
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("pkg-1.0.dist-info/METADATA", meta)
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
