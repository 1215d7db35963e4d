"""Collect a wheelhouse for GPU nodes without internet (``make wheelhouse``; the README's "GPU nodes without internet").

Run on a machine with a package index, from a clone. The folder gets

- growlm's wheel, built from the clone;
- DeepSpeed's wheel, built here from its source distribution (DeepSpeed publishes no wheel). It is built without
  torch and without compiled ops, so it is pure Python and fits any node: DeepSpeed compiles the ops it needs just in
  time on the node, with the node's own nvcc and ninja;
- a wheel of every other dependency of the two, for the target Python version and platform, resolved by pip
  (``pip download --only-binary=:all:``).

torch and the CUDA libraries (``nvidia-*``, ``triton``) are left out: the node keeps its own CUDA torch.
``make install-offline WHEELHOUSE=DIR`` installs from the folder with ``pip --no-index`` and replaces nothing the
environment already has at a compatible version.

Exit status 2 with one line for a bad argument or a failed pip step (pip's own output is above that line).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
# what the node brings with its CUDA torch; never put into the wheelhouse
NODE_PROVIDED = re.compile(r"^(torch|triton|pytorch-triton(-.*)?|nvidia-(?!ml-py$).*|cuda-.*)$")  # nvidia-ml-py: pynvml
# the platform tags pip accepts for a current x86-64 Linux (manylinux 2.17 .. 2.39; pip matches each tag exactly)
X86_64_PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)] + ["manylinux2014_x86_64", "linux_x86_64"]


class WheelhouseError(Exception):
    """A step of the wheelhouse build failed; the message names it and the fix."""


def wheel_requirements(wheel: Path) -> list[Requirement]:
    """The ``Requires-Dist`` entries of a wheel's METADATA that apply without extras.

    Raises:
        WheelhouseError: the file is not a wheel with a METADATA file.
    """
    try:
        with zipfile.ZipFile(wheel) as zf:
            (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
            text = zf.read(meta).decode()
    except (zipfile.BadZipFile, ValueError) as e:
        raise WheelhouseError(f"{wheel}: not a wheel with one METADATA file ({e})") from None
    reqs = [Requirement(r) for r in Parser().parsestr(text).get_all("Requires-Dist") or []]
    return [r for r in reqs if r.marker is None or "extra" not in str(r.marker)]


def dependency_lines(wheels: list[Path]) -> list[str]:
    """The requirement lines for pip download: the wheels' own requirements, less the wheels themselves and what the
    node provides (torch, triton, the CUDA libraries). Markers stay, so pip evaluates them for the target Python."""
    own = {canonicalize_name(w.name.split("-")[0]) for w in wheels}
    lines: list[str] = []
    for w in wheels:
        for r in wheel_requirements(w):
            name = canonicalize_name(r.name)
            if name not in own and not NODE_PROVIDED.match(name) and str(r) not in lines:
                lines.append(str(r))
    return lines


def _pip(args: list[str], what: str, env: dict[str, str] | None = None) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", *args], env=env)
    if r.returncode != 0:
        raise WheelhouseError(f"{what} failed (pip exit status {r.returncode}; its output is above)")


def build(out: Path, python_version: str | None, platforms: list[str], deepspeed: str) -> list[Path]:
    """Fill OUT with the wheelhouse; returns its wheels.

    ``python_version`` (``"3.12"``) and ``platforms`` select the dependency wheels for another interpreter or machine;
    ``None`` and ``[]`` mean this one. ``deepspeed`` is the DeepSpeed version whose source distribution is built.

    Raises:
        WheelhouseError: a pip step failed, or a wheel the node provides (torch, CUDA) ended up in the folder.
    """
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("growlm-*.whl"), *out.glob("deepspeed-*.whl")]:  # one version of each: pip refuses two
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="growlm-wheel-") as tmp:
        # growlm: from a copy of the clone (setuptools' build/ folder stays out of it, and no stale file of an
        # earlier build gets in), with this environment's setuptools (no index needed for the build itself)
        src = Path(tmp) / "src" / "growlm"
        patterns = shutil.ignore_patterns(".git", ".venv", "runs", "build", "*.egg-info", "__pycache__", ".*_cache")

        def skip(folder: str, names: list[str]) -> set[str]:  # also the wheelhouse itself, when it is in the clone
            return set(patterns(folder, names)) | {n for n in names if (Path(folder) / n).resolve() == out.resolve()}

        shutil.copytree(REPO, src, ignore=skip, symlinks=True)
        _pip(["wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp, str(src)], "building growlm's wheel")
        # DeepSpeed: its sdist, built in an isolated environment without torch -> a pure-Python wheel, no ops
        env = dict(os.environ, DS_BUILD_OPS="0")
        _pip(["wheel", "--no-deps", "--no-binary", "deepspeed", "-q", "-w", tmp, f"deepspeed=={deepspeed}"],
             f"building DeepSpeed {deepspeed}'s wheel from its source distribution", env)  # fmt: skip
        own = sorted(Path(tmp).glob("*.whl"))
        for w in own:
            (out / w.name).write_bytes(w.read_bytes())
    own = [out / w.name for w in own]
    reqs = out / "requirements.txt"
    reqs.write_text("\n".join(dependency_lines(own)) + "\n")
    target: list[str] = []
    if python_version:
        target += ["--python-version", python_version, "--implementation", "cp"]
    for p in platforms:
        target += ["--platform", p]
    _pip(["download", "-q", "--only-binary=:all:", *target, "-d", str(out), "-r", str(reqs)],
         "downloading the dependencies' wheels")  # fmt: skip
    wheels = sorted(out.glob("*.whl"))
    bad = [w.name for w in wheels if NODE_PROVIDED.match(canonicalize_name(w.name.split("-")[0]))]
    if bad:
        raise WheelhouseError(f"the wheelhouse holds what the node provides: {', '.join(bad)}; remove them")
    return wheels


def main(argv: list[str] | None = None) -> int:
    """The command line (``--out``, ``--python_version``, ``--platform``, ``--deepspeed``): 0 when the wheelhouse is
    complete, 2 with one line for a bad argument or a failed pip step."""
    p = argparse.ArgumentParser(
        prog="install/wheelhouse.py",
        description="Collect wheels of growlm, DeepSpeed and their dependencies (not torch, not CUDA) for an offline "
        "install with `make install-offline WHEELHOUSE=DIR`.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--out", type=Path, required=True, help="the wheelhouse folder (created; wheels are added)")
    p.add_argument("--python_version", default=None,
                   help="the nodes' Python, for example 3.12 (default: this interpreter's; then the dependency wheels "
                   "are this machine's too, unless --platform is given)")  # fmt: skip
    p.add_argument("--platform", action="append", default=None,
                   help="a platform tag of the nodes, repeatable (default with --python_version: manylinux_2_17 .. "
                   "_2_39 x86_64)")  # fmt: skip
    p.add_argument("--deepspeed", default=None, help="DeepSpeed version to build (default: this environment's)")
    args = p.parse_args(argv)
    try:
        from importlib.metadata import PackageNotFoundError, version

        try:
            ds = args.deepspeed or version("deepspeed")
        except PackageNotFoundError:
            raise WheelhouseError("DeepSpeed is not installed here: pass --deepspeed VERSION") from None
        if args.python_version and not re.fullmatch(r"3\.\d+", args.python_version):
            raise WheelhouseError(f"--python_version {args.python_version}: give MAJOR.MINOR, for example 3.12")
        platforms = args.platform if args.platform is not None else (X86_64_PLATFORMS if args.python_version else [])
        wheels = build(args.out, args.python_version, platforms, ds)
    except WheelhouseError as e:
        print(f"wheelhouse: error: {e}", file=sys.stderr)
        return 2
    size = sum(w.stat().st_size for w in wheels) / 2**20
    print(f"wheelhouse: {len(wheels)} wheels, {size:.0f} MiB in {args.out} (no torch, no CUDA libraries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
