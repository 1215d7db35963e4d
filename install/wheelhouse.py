"""Collect a wheelhouse for GPU nodes without internet (``make wheelhouse``; docs/install.md, its GPU section).

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

With ``--node_freeze FILE`` (``make wheelhouse NODE_FREEZE=FILE``: the node's ``pip freeze``, copied from the node)
the dependencies are resolved against the node's own versions: every package the node has is pinned to its version
(``node-constraints.txt``, written into the folder), the folder gets only what the node lacks, and
``make install-offline`` then adds packages and upgrades none. A requirement of growlm or DeepSpeed that the node's
version does not meet is refused before anything is downloaded.

Exit status 2 with one line for a bad argument or a failed pip step (pip's own output is above that line).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

REPO = Path(__file__).resolve().parents[1]
# what the node brings with its CUDA torch; never put into the wheelhouse
NODE_PROVIDED = re.compile(r"^(torch|triton|pytorch-triton(-.*)?|nvidia-(?!ml-py$).*|cuda-.*)$")  # nvidia-ml-py: pynvml
# the platform tags pip accepts for a current x86-64 Linux (manylinux 2.17 .. 2.39; pip matches each tag exactly)
X86_64_PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)] + ["manylinux2014_x86_64", "linux_x86_64"]
# written into the wheelhouse with --node_freeze: NAME==VERSION of every package the node has (make install-offline)
NODE_CONSTRAINTS = "node-constraints.txt"
FREEZE_FIX = "write the file on the node with `python -m pip list --format=freeze > node-freeze.txt`"


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


def read_freeze(path: Path) -> dict[str, str]:
    """The packages a node has, from its ``pip freeze`` (or ``pip list --format=freeze``) copied here: canonical name
    -> version as written. Blank lines and comments are skipped.

    Raises:
        WheelhouseError: the file cannot be read, holds no package, or has a line that is not ``NAME==VERSION``
            (pip freeze writes ``-e PATH`` and ``NAME @ URL`` for some installs: they give no version).
    """
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise WheelhouseError(f"--node_freeze {path}: cannot read it ({e}): {FREEZE_FIX}") from None
    node: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*(\S+)", line)
        try:
            if not m:
                raise InvalidVersion(line)
            Version(m[2])
        except InvalidVersion:
            bad = f"--node_freeze {path} line {n}: {line!r} is not NAME==VERSION"
            raise WheelhouseError(f"{bad}: {FREEZE_FIX}") from None
        node[canonicalize_name(m[1])] = m[2]
    if not node:
        raise WheelhouseError(f"--node_freeze {path}: no NAME==VERSION line in it: {FREEZE_FIX}")
    return node


def _marker_env(python_version: str | None) -> dict[str, str]:
    env = default_environment()
    if python_version:
        env.update(python_version=python_version, python_full_version=f"{python_version}.0")
    return env


def _unmet(reqs: list[Requirement], node: dict[str, str], env: dict[str, str]) -> tuple[Requirement, str] | None:
    """The first of REQS that applies under ENV and that the node's installed version fails, with that version."""
    for r in reqs:
        have = node.get(canonicalize_name(r.name))
        if have is None or (r.marker is not None and not r.marker.evaluate(env)):
            continue
        if not r.specifier.contains(Version(have), prereleases=True):
            return r, have
    return None


def check_node(wheels: list[Path], node: dict[str, str], python_version: str | None) -> None:
    """Refuse a requirement of WHEELS (growlm's, DeepSpeed's) that the version NODE has installed does not meet.

    ``node`` is ``read_freeze``'s mapping; requirement markers are evaluated for ``python_version`` (``"3.12"``;
    ``None``: this interpreter) on this platform.

    Raises:
        WheelhouseError: one line naming the package, the node's version and the requirement it fails.
    """
    for w in wheels:
        owner, own_version = w.name.split("-")[:2]
        unmet = _unmet(wheel_requirements(w), node, _marker_env(python_version))
        if unmet:
            r, have = unmet
            raise WheelhouseError(
                f"the node's {r.name} {have} does not meet {owner} {own_version}'s requirement "
                f"{r.name}{r.specifier}: upgrade {r.name} on the node and take its pip freeze again"
            )


def _pip(args: list[str], what: str, env: dict[str, str] | None = None) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", *args], env=env)
    if r.returncode != 0:
        raise WheelhouseError(f"{what} failed (pip exit status {r.returncode}; its output is above)")


def _resolution(reqs: Path, constraints: Path | None, target: list[str], work: Path) -> list[dict] | None:
    """pip's ``install --dry-run --report`` of REQS into an empty ``--target`` folder under WORK: the metadata of every
    wheel an install would take. Returns None when pip finds no set of versions (its output is kept, not shown)."""
    work.mkdir(parents=True, exist_ok=True)
    report = work / "resolution.json"
    args = ["install", "-q", "--dry-run", "--ignore-installed", "--target", str(work / "target"),
            "--only-binary=:all:", *target, "--report", str(report), "-r", str(reqs)]  # fmt: skip
    if constraints is not None:
        args += ["--constraint", str(constraints)]
    r = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        work.joinpath("pip.log").write_text(r.stdout + r.stderr)
        return None
    return [i["metadata"] for i in json.loads(report.read_text())["install"]]


def resolve(
    reqs: Path,
    constraints: Path | None,
    node: dict[str, str],
    target: list[str],
    python_version: str | None,
    work: Path,
) -> dict[str, tuple[str, str]]:
    """pip's resolution of the requirements file REQS for the target (``--python-version`` / ``--platform`` options;
    ``[]``: this interpreter and machine), the node's versions fixed by the pip constraints file CONSTRAINTS (``None``:
    no node): canonical name -> (name, version) of every wheel an install would need, those the node has included.

    pip resolves as ``install --dry-run`` into an empty ``--target`` folder under WORK: this environment's packages play
    no part, and nothing is installed.

    Raises:
        WheelhouseError: no set of versions fits. When the newest version of a package the node lacks requires a
            version of one the node has (NODE: ``read_freeze``'s mapping) that the node's fails, the one line names
            both; otherwise pip's own report is printed above it.
    """
    items = _resolution(reqs, constraints, target, work / "pinned")
    if items is None:
        log = (work / "pinned" / "pip.log").read_text()
        free = _resolution(reqs, None, target, work / "free") if constraints is not None else None
        for m in free or []:
            if canonicalize_name(m["name"]) in node:
                continue
            reqs_of = [Requirement(r) for r in m.get("requires_dist") or []]
            unmet = _unmet([r for r in reqs_of if r.marker is None or "extra" not in str(r.marker)], node,
                           _marker_env(python_version))  # fmt: skip
            if unmet:
                r, have = unmet
                raise WheelhouseError(
                    f"pip finds no versions that fit the node's packages: the newest {m['name']} ({m['version']}) "
                    f"requires {r.name}{r.specifier} and the node has {r.name} {have}: upgrade {r.name} on the node "
                    "and take its pip freeze again"
                )
        sys.stderr.write(log)
        what = "resolving the dependencies" + (" against the node's versions" if constraints is not None else "")
        raise WheelhouseError(f"{what} failed (pip's report is above)")
    return {canonicalize_name(m["name"]): (m["name"], m["version"]) for m in items}


def build(
    out: Path,
    python_version: str | None,
    platforms: list[str],
    deepspeed: str | None,
    node: dict[str, str] | None = None,
) -> list[Path]:
    """Fill OUT with the wheelhouse; returns its wheels.

    ``python_version`` (``"3.12"``) and ``platforms`` select the dependency wheels for another interpreter or machine;
    ``None`` and ``[]`` mean this one. ``deepspeed`` is the DeepSpeed version whose source distribution is built
    (``None``: none, the node has DeepSpeed). ``node`` (``read_freeze``'s mapping, or ``None``) is what the node has:
    the dependencies are then resolved with those versions fixed, only the others are downloaded, and the pins go
    to OUT/node-constraints.txt for ``make install-offline``.

    Raises:
        WheelhouseError: a requirement of growlm or DeepSpeed that the node's version does not meet (before anything
            is downloaded), a pip step failed, or a wheel the node provides (torch, CUDA) would end up in the folder.
    """
    with tempfile.TemporaryDirectory(prefix="growlm-wheel-") as tmp:
        # growlm: from a copy of the clone (setuptools' build/ folder stays out of it, and no stale file of an
        # earlier build gets in), with this environment's setuptools (no index needed for the build itself)
        src = Path(tmp) / "src" / "growlm"
        wheels_dir = Path(tmp) / "wheels"
        patterns = shutil.ignore_patterns(".git", ".venv", "runs", "build", "*.egg-info", "__pycache__", ".*_cache")

        def skip(folder: str, names: list[str]) -> set[str]:  # also the wheelhouse itself, when it is in the clone
            return set(patterns(folder, names)) | {n for n in names if (Path(folder) / n).resolve() == out.resolve()}

        shutil.copytree(REPO, src, ignore=skip, symlinks=True)
        _pip(["wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels_dir), str(src)],
             "building growlm's wheel")  # fmt: skip
        if node is not None:  # refused before DeepSpeed's build and any download
            check_node(sorted(wheels_dir.glob("*.whl")), node, python_version)
        if deepspeed is not None:
            # DeepSpeed: its sdist, built in an isolated environment without torch -> a pure-Python wheel, no ops
            env = dict(os.environ, DS_BUILD_OPS="0")
            _pip(["wheel", "--no-deps", "--no-binary", "deepspeed", "-q", "-w", str(wheels_dir),
                  f"deepspeed=={deepspeed}"],
                 f"building DeepSpeed {deepspeed}'s wheel from its source distribution", env)  # fmt: skip
        own = sorted(wheels_dir.glob("*.whl"))
        if node is not None:
            check_node(own, node, python_version)
        own_names = {canonicalize_name(w.name.split("-")[0]) for w in own}
        reqs = Path(tmp) / "requirements.txt"
        reqs.write_text("\n".join(dependency_lines(own)) + "\n")
        constraints = None
        if node is not None:
            constraints = Path(tmp) / NODE_CONSTRAINTS
            constraints.write_text("".join(f"{k}=={v}\n" for k, v in sorted(node.items()) if k not in own_names))
        target: list[str] = []
        if python_version:
            target += ["--python-version", python_version, "--implementation", "cp"]
        for p in platforms:
            target += ["--platform", p]
        needed = resolve(reqs, constraints, node or {}, target, python_version, Path(tmp))
        fetch = {k: nv for k, nv in needed.items() if k not in (node or {}) and k not in own_names}
        bad = sorted(nv[0] for k, nv in fetch.items() if NODE_PROVIDED.match(k))
        if bad:
            raise WheelhouseError(
                f"the dependencies need {', '.join(bad)}, which the node provides with its CUDA torch: install torch "
                "on the node first and pass its pip freeze (--node_freeze)"
            )
        # OUT changes only now, once everything fits
        out.mkdir(parents=True, exist_ok=True)
        for old in [*out.glob("growlm-*.whl"), *out.glob("deepspeed-*.whl"), out / NODE_CONSTRAINTS]:
            old.unlink(missing_ok=True)  # one version of each (pip refuses two); no other node's pins
        for f in [*own, reqs]:
            shutil.copyfile(f, out / f.name)
        if fetch:
            _pip(["download", "-q", "--no-deps", "--only-binary=:all:", *target, "-d", str(out),
                  *(f"{n}=={v}" for n, v in fetch.values())], "downloading the dependencies' wheels")  # fmt: skip
        if constraints is not None:  # last: install-offline reads it as the mark of a complete node wheelhouse
            shutil.copyfile(constraints, out / NODE_CONSTRAINTS)
    wheels = sorted(out.glob("*.whl"))
    bad = [w.name for w in wheels if NODE_PROVIDED.match(canonicalize_name(w.name.split("-")[0]))]
    if bad:
        raise WheelhouseError(f"the wheelhouse holds what the node provides: {', '.join(bad)}; remove them")
    return wheels


def build_parser() -> argparse.ArgumentParser:
    """The command line: ``--out``, ``--python_version``, ``--platform``, ``--deepspeed``, ``--node_freeze``."""
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
    p.add_argument("--node_freeze", type=Path, default=None,
                   help="the node's `pip freeze` (a file copied from the node): collect only what the node lacks, "
                   "resolved against the node's versions, which are pinned in OUT/node-constraints.txt so that "
                   "make install-offline upgrades nothing (default: collect every dependency)")  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    """The command line (``build_parser``): 0 when the wheelhouse is complete, 2 with one line for a bad argument, a
    requirement the node's version does not meet, or a failed pip step."""
    args = build_parser().parse_args(argv)
    try:
        from importlib.metadata import PackageNotFoundError, version

        if args.python_version and not re.fullmatch(r"3\.\d+", args.python_version):
            raise WheelhouseError(f"--python_version {args.python_version}: give MAJOR.MINOR, for example 3.12")
        node = read_freeze(args.node_freeze) if args.node_freeze is not None else None
        if node is not None and "deepspeed" in node:
            ds = None  # the node's own DeepSpeed stays (growlm's requirement on it is checked)
        else:
            try:
                ds = args.deepspeed or version("deepspeed")
            except PackageNotFoundError:
                raise WheelhouseError("DeepSpeed is not installed here: pass --deepspeed VERSION") from None
        platforms = args.platform if args.platform is not None else (X86_64_PLATFORMS if args.python_version else [])
        wheels = build(args.out, args.python_version, platforms, ds, node)
    except WheelhouseError as e:
        print(f"wheelhouse: error: {e}", file=sys.stderr)
        return 2
    size = sum(w.stat().st_size for w in wheels) / 2**20
    what = "no torch, no CUDA libraries"
    if node is not None:
        what = f"what the node lacks; its {len(node)} packages pinned in {NODE_CONSTRAINTS}"
    print(f"wheelhouse: {len(wheels)} wheels, {size:.1f} MiB in {args.out} ({what})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
