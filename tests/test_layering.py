"""The package's import graph: no circles (function-level and TYPE_CHECKING imports included) and no
import from a lower layer into a higher one, against the layer order docs/ARCHITECTURE.md declares.

Every `import` and `from ... import` statement anywhere in a module counts (at the top, inside a
function, under `if TYPE_CHECKING:`): each is a dependency someone reading or moving the module must
know about. `from pkg import name` depends on `pkg.name` when that is a module, else on `pkg` (its
`__init__`); the implicit execution of a parent package's `__init__` is not counted.
"""
from __future__ import annotations

import ast
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


def graph() -> dict[str, list[tuple[str, int]]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def declared_layers() -> list[list[str]]:
    """The layers of docs/ARCHITECTURE.md's ```layers block, lowest first (the block lists them top down)."""
    block = re.search(r"```layers\n(.*?)```", ARCHITECTURE.read_text(), re.S)
    assert block, f"{ARCHITECTURE} has no ```layers block"
    rows = [line.split("#")[0].split() for line in block.group(1).splitlines()]
    return [row for row in rows if row][::-1]


def layer_of(module: str, layers: list[list[str]]) -> int:
    """A module's layer: that of its sub-package (shiftlab.engine.step -> engine) or of its own name
    (shiftlab.registry -> registry); the package root is `shiftlab`."""
    parts = module.split(".")
    key = parts[1] if len(parts) > 1 else "shiftlab"
    for i, row in enumerate(layers):
        if key in row:
            return i
    raise AssertionError(f"{module}: {key!r} is in no layer of docs/ARCHITECTURE.md's ```layers block")


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


def test_no_module_imports_from_a_higher_layer():
    layers = declared_layers()
    upward = []
    for module, targets in graph().items():
        mine = layer_of(module, layers)
        for target, line in targets:
            theirs = layer_of(target, layers)
            if theirs > mine:
                upward.append(f"{module} (layer {mine}) imports {target} (layer {theirs}) at line {line}")
    assert not upward, "imports from a lower layer into a higher one:\n" + "\n".join(upward)


def test_every_package_and_root_module_has_a_layer():
    layers = declared_layers()
    for module in modules():
        layer_of(module, layers)


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
