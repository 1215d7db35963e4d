"""Every import inside growlm points down its layers, no module imports itself back through others, and every
function-local import says why it is lazy (DESIGN.md, "Layers").

Read from the source with ``ast`` (module-level and function-local imports alike); nothing is imported. A module
belongs to the unit named by the longest prefix in ``LAYERS``; it may import its own unit and any unit of a lower
layer, never a unit of its own layer or a higher one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import growlm

PACKAGE = Path(growlm.__file__).resolve().parent
# unit -> layer, lowest first: an import may only point at a lower layer (or inside its own unit)
LAYERS = {
    "growlm": 0,  # the package root: version, package paths
    "growlm.model": 1,
    "growlm.runtime": 2,
    "growlm.data": 3,
    "growlm.growth": 4,  # growth/errors.py
    "growlm.growth.ops": 5,
    "growlm.growth.stages": 6,
    "growlm.growth.live": 7,
    "growlm.growth.offline": 7,
    "growlm.trainer": 8,
    # the tools on top: growlm-run, train.py, growlm-eval, growlm-bench, growlm-experiment
    "growlm.trainer.driver": 9,
    "growlm.train": 9,
    "growlm.eval": 9,  # eval/__init__.py
    "growlm.eval.metrics": 9,
    "growlm.eval.bench": 9,
    "growlm.eval.experiments": 9,
}


def _subpackages(folder: Path) -> list[Path]:
    """``folder`` and every folder below it that is a package (holds __init__.py) under a package."""
    out = [folder]
    for child in sorted(folder.iterdir()):
        if child.is_dir() and (child / "__init__.py").is_file():
            out += _subpackages(child)
    return out


SUBPACKAGES = _subpackages(PACKAGE)


def module_files() -> dict[str, Path]:
    """growlm module name -> file, for every module of the package (setup.py and tests/ are not modules)."""
    out = {"growlm": PACKAGE / "__init__.py", "growlm.train": PACKAGE / "train.py"}
    for d in SUBPACKAGES:
        if d == PACKAGE:
            continue
        for f in d.glob("*.py"):
            rel = f.relative_to(PACKAGE).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out[".".join(("growlm", *parts))] = f
    return out


def unit_of(module: str) -> str:
    """The unit of ``module``: the longest key of LAYERS that is the module or a package above it."""
    best = ""
    for unit in LAYERS:
        if (module == unit or module.startswith(unit + ".")) and len(unit) > len(best):
            best = unit
    return best


def imports_of(path: Path, module: str, known: set[str]) -> list[tuple[int, str, bool, str]]:
    """(line, imported growlm module, function-local?, source line) of every import of a growlm module in ``path``.
    ``from growlm.x import y`` counts as importing ``growlm.x.y`` when that is a module, else ``growlm.x``."""
    src = path.read_text()
    lines = src.splitlines()
    tree = ast.parse(src)
    local: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            local |= {id(n) for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom)}
    out = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package
                pkg = module.split(".")[: -node.level] if not path.name == "__init__.py" else module.split(".")
                base = ".".join([*pkg, base] if base else pkg)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for t in targets:
            if t == "growlm" or t.startswith("growlm."):
                out.append((node.lineno, t, id(node) in local, lines[node.lineno - 1]))
    return out


def test_every_module_has_a_unit_and_every_unit_exists():
    files = module_files()
    assert not [m for m in files if not unit_of(m)], "add the new package to LAYERS"
    assert not [u for u in LAYERS if u not in files], "a unit of LAYERS has no module"


def test_imports_point_down_the_layers():
    files = module_files()
    known = set(files)
    bad = []
    for module, path in sorted(files.items()):
        mine = unit_of(module)
        for line, target, _, text in imports_of(path, module, known):
            theirs = unit_of(target)
            if theirs == mine or LAYERS[theirs] < LAYERS[mine]:
                continue
            bad.append(f"{path.relative_to(PACKAGE)}:{line}: {mine} (layer {LAYERS[mine]}) imports {target} "
                       f"({theirs}, layer {LAYERS[theirs]}): {text.strip()}")  # fmt: skip
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_no_module_cycle():
    files = module_files()
    known = set(files)
    graph = {
        m: sorted({t for _, t, _, _ in imports_of(p, m, known) if t in known and t != m}) for m, p in files.items()
    }
    # parents are imported before their children: a package importing its own child is no cycle by itself
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for t in graph.get(m, []):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t) :] + [t] if t in stack else [m, t])
            elif t not in state:
                visit(t, [*stack, t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_function_local_imports_say_why():
    bad = []
    for path in sorted(module_files().values()):
        src = path.read_text()
        lines = src.splitlines()
        for node in ast.walk(ast.parse(src)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for n in ast.walk(node):
                if isinstance(n, ast.Import | ast.ImportFrom) and "# lazy:" not in lines[n.lineno - 1]:
                    bad.append(f"{path.relative_to(PACKAGE)}:{n.lineno}: {lines[n.lineno - 1].strip()}")
    assert not bad, "function-local imports without a '# lazy: <why>' comment:\n" + "\n".join(sorted(set(bad)))


@pytest.mark.parametrize("text, expected", [("growlm.growth.ops.rules", "growlm.growth.ops"),
                                            ("growlm.trainer.driver.cli", "growlm.trainer.driver"),
                                            ("growlm.train", "growlm.train"), ("growlm", "growlm")])  # fmt: skip
def test_unit_of_takes_the_longest_prefix(text, expected):
    assert unit_of(text) == expected
