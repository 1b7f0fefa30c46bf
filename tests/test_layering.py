"""The package's import graph: no circles (function-level and TYPE_CHECKING imports included), and every
import between top-level packages along an edge that docs/ARCHITECTURE.md's ```dependencies block
declares (per package, the packages it may import: a graph without circles, not one total order).

Every `import` and `from ... import` statement anywhere in a module counts (at the top, inside a
function, under `if TYPE_CHECKING:`): each is a dependency someone reading or moving the module must
know about. `from pkg import name` depends on `pkg.name` when that is a module, else on `pkg` (its
`__init__`); the implicit execution of a parent package's `__init__` is not counted.
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "shiftlab"
ARCHITECTURE = REPO / "docs" / "ARCHITECTURE.md"


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """The package modules `name` imports, with the line of each import."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((sub if sub in known else target, node.lineno))
    return [(t, line) for t, line in found if t in known and t != name]


@functools.cache   # one parse of the package for every test of this module
def graph() -> dict[str, list[tuple[str, int]]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def declared_dependencies(text: str | None = None) -> dict[str, set[str]]:
    """docs/ARCHITECTURE.md's ```dependencies block: `package: the packages it may import  # why` per line;
    a line starting with spaces and `#` continues the comment."""
    text = ARCHITECTURE.read_text() if text is None else text
    block = re.search(r"```dependencies\n(.*?)```", text, re.S)
    assert block, f"{ARCHITECTURE} has no ```dependencies block"
    declared: dict[str, set[str]] = {}
    for line in block.group(1).splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        package, colon, targets = line.partition(":")
        assert colon, f"```dependencies: expected 'package: dependencies', got {line!r}"
        assert package.strip() not in declared, f"```dependencies: {package.strip()} has two lines"
        declared[package.strip()] = set(targets.split())
    return declared


def package_of(module: str) -> str:
    """A module's top-level package: shiftlab.engine.step -> engine, shiftlab.methods.tpt.spec -> methods,
    a root module its own name (shiftlab.registry -> registry); the package root is `shiftlab`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "shiftlab"


def undeclared_imports(edges: dict[str, list[tuple[str, int]]], declared: dict[str, set[str]]) -> list[str]:
    """Each import between two top-level packages that the declared graph has no edge for."""
    found = []
    for module, targets in edges.items():
        mine = package_of(module)
        for target, line in targets:
            theirs = package_of(target)
            if theirs != mine and theirs not in declared.get(mine, set()):
                found.append(f"{module} imports {target} at line {line}: {mine} does not declare {theirs}")
    return found


def cycles(edges: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w, _ in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_circles():
    found = cycles(graph())
    assert not found, "import circles (function-level imports included):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_every_import_between_packages_is_a_declared_dependency():
    found = undeclared_imports(graph(), declared_dependencies())
    assert not found, "imports the ```dependencies block of docs/ARCHITECTURE.md does not declare:\n" + "\n".join(found)


def test_the_declared_dependencies_have_no_circles_and_name_real_packages():
    declared = declared_dependencies()
    packages = {package_of(m) for m in modules()}
    named = set(declared) | {t for targets in declared.values() for t in targets}
    assert named <= packages, f"```dependencies names no such package: {sorted(named - packages)}"
    edges = {p: [(t, 0) for t in sorted(targets)] for p, targets in declared.items()}
    assert not cycles(edges), f"the declared dependencies have circles: {cycles(edges)}"


def test_every_package_and_root_module_has_a_line():
    missing = sorted({package_of(m) for m in modules()} - set(declared_dependencies()))
    assert not missing, f"packages without a line in docs/ARCHITECTURE.md's ```dependencies block: {missing}"


def test_a_downward_import_that_is_not_declared_is_found():
    # the old total order let any lower layer be imported (rundir -> attacks passed unseen); now only edges
    declared = declared_dependencies("```dependencies\nrundir: views  # why\n          # more why\nviews:\n```")
    assert declared == {"rundir": {"views"}, "views": set()}
    edges = {"shiftlab.rundir.identity": [("shiftlab.attacks.base", 42), ("shiftlab.views.recipe", 3)],
             "shiftlab.methods.tpt.spec": [("shiftlab.methods.base", 1)]}   # inside one package: always allowed
    assert undeclared_imports(edges, declared) == [
        "shiftlab.rundir.identity imports shiftlab.attacks.base at line 42: rundir does not declare attacks"]


@pytest.mark.parametrize("source, expected", [
    ("from . import b\n", ["p.b"]),                      # a sibling module
    ("from .b import f\n", ["p.b"]),
    ("def f():\n    from ..q import g\n", ["q"]),        # function-level, into another package's __init__
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import T\n", ["p.b"]),
])
def test_imports_are_found_wherever_they_are(tmp_path, source, expected):
    path = tmp_path / "a.py"
    path.write_text(source)
    known = {"p": tmp_path, "p.a": path, "p.b": tmp_path, "q": tmp_path}
    assert [t for t, _ in imports("p.a", path, known)] == expected


def test_a_circle_is_found():
    edges = {"a": [("b", 1)], "b": [("c", 1)], "c": [("a", 1)], "d": [("a", 1)]}
    assert cycles(edges) == [["a", "b", "c"]]


def method_folder(module: str) -> str | None:
    """The method folder a module lies in (shiftlab.methods.tpt.method -> tpt); None outside one (the methods
    package's own modules, its shared folders such as methods/common/, the other packages)."""
    from shiftlab.methods.catalogue.declarations import SHARED_FOLDERS
    parts = module.split(".")
    if len(parts) < 4 or parts[:2] != ["shiftlab", "methods"] or parts[2] in SHARED_FOLDERS:
        return None
    return parts[2]


def imports_between_method_folders(edges: dict[str, list[tuple[str, int]]]) -> list[str]:
    """Each import from one method's folder into another's: what two methods share lives in methods/common/."""
    found = []
    for module, targets in edges.items():
        mine = method_folder(module)
        for target, line in targets:
            theirs = method_folder(target)
            if mine and theirs and theirs != mine:
                found.append(f"{module} imports {target} at line {line}: move what {mine} and {theirs} share "
                             "into methods/common/")
    return list(dict.fromkeys(found))     # one line per import statement (it may name several things)


def test_no_method_folder_imports_another():
    found = imports_between_method_folders(graph())
    assert not found, "method folders importing each other:\n" + "\n".join(found)


def test_an_import_between_method_folders_is_found():
    edges = {"shiftlab.methods.tipple.method": [("shiftlab.methods.tpt.method", 22),
                                                ("shiftlab.methods.common.prompt_tuning", 23),
                                                ("shiftlab.methods.tipple.spec", 24), ("shiftlab.methods.base", 25)],
             "shiftlab.methods.base": [("shiftlab.methods.catalogue.declarations", 1)],
             "shiftlab.methods.common.tda_cache": [("shiftlab.methods.base", 3)]}
    assert imports_between_method_folders(edges) == [
        "shiftlab.methods.tipple.method imports shiftlab.methods.tpt.method at line 22: move what tipple and tpt "
        "share into methods/common/"]
