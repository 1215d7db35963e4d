"""Check, before ``make install-offline``, that the node still has the versions its wheelhouse was collected for.

``make wheelhouse NODE_FREEZE=FILE`` pins every package of the node in the wheelhouse's ``node-constraints.txt``;
``make install-offline`` runs this file with the node's Python (``NODE_PYTHON``) first. When a package the file pins
is installed at another version, or no longer installed, pip would refuse the install with a resolver error; this
names the packages instead, in one line, and exits with status 2. It uses only the standard library and pip's own
copy of ``packaging``, so it runs on a node that has no other package.

Usage: ``python install/node_check.py WHEELHOUSE/node-constraints.txt``
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

try:
    from pip._vendor.packaging.version import InvalidVersion, Version
except ImportError:  # no pip: install-offline refuses anyway; compare the strings as written
    Version, InvalidVersion = str, ValueError


def _same(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def differences(constraints: Path) -> list[str]:
    """``"NAME installed VERSION"`` / ``"NAME missing"`` for each ``NAME==VERSION`` line of CONSTRAINTS that this
    interpreter's installed distributions do not match (names are looked up as written; pip's files are
    normalized). Blank lines and comments are skipped.

    Raises:
        OSError: CONSTRAINTS cannot be read.
    """
    out = []
    for raw in constraints.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if "==" not in line:
            continue
        name, want = (part.strip() for part in line.split("==", 1))
        try:
            have = version(name)
        except PackageNotFoundError:
            out.append(f"{name} missing (wanted {want})")
            continue
        if not _same(have, want):
            out.append(f"{name} {have} (wanted {want})")
    return out


def main(argv: list[str] | None = None) -> int:
    """0 when every pinned package is installed at its version; 2 with one line naming the others."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("node_check: give one argument, the wheelhouse's node-constraints.txt", file=sys.stderr)
        return 2
    path = Path(args[0])
    try:
        diff = differences(path)
    except OSError as e:
        print(f"make install-offline: cannot read {path} ({e.strerror}): build the wheelhouse again", file=sys.stderr)
        return 2
    if diff:
        print(f"make install-offline: this environment differs from the node the wheelhouse was collected for "
              f"({path}): {', '.join(diff)}; collect it again from this environment's "
              "`python -m pip list --format=freeze` (make wheelhouse NODE_FREEZE=FILE)", file=sys.stderr)  # fmt: skip
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
