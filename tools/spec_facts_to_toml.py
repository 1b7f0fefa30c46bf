"""Move a method folder's facts out of its spec.py into the folder's card.toml (docs/METHOD_CARDS.md).

    PYTHONPATH=src python tools/spec_facts_to_toml.py FOLDER [FOLDER ...]   # e.g. tpt dmn_zs
    PYTHONPATH=src python tools/spec_facts_to_toml.py --all                 # every folder still declaring facts
    PYTHONPATH=src python tools/spec_facts_to_toml.py --check FOLDER        # print the card, change nothing

For each spec class of `methods/<FOLDER>/spec.py` (definition order) it writes a `[name]` table with the
facts the class body assigns (`FACTS`, `adaptive` included): the values as Python evaluates them
(comprehensions, `dict(...)` tuples and module-level source strings resolved; tuples become arrays, read
back as tuples), the comments
above and beside each assignment carried over as TOML comments. `dataset_values = settings_file(...)`
becomes the table's `settings` (the folder's settings.json, which is then deleted) and a `cupl_files`
equal to the folder's own settings is left to the card's reader. A later class that shares two or more
facts with the folder's first one `extends` it and keeps only what differs. Then it removes those
assignments, their comments and the module-level string constants no longer used from spec.py, and
points old imports (`..specs`, `..facts`) at `..catalogue`; run `ruff check --fix` after it (unused
imports). Hand-check the result: `shiftlab methods --json` before and after must be identical.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import io
import json
import math
import re
import sys
import tokenize
import tomllib
from pathlib import Path
from typing import Any

METHODS = Path(__file__).resolve().parents[1] / "src" / "shiftlab" / "methods"
FACTS = ("label", "aliases", "summary", "family", "fidelity", "bibtex", "protocols", "cupl_files", "adaptive",
         "dataset_values", "published")
EMPTY = {"label": "", "aliases": (), "summary": "", "family": "", "fidelity": "", "bibtex": "", "protocols": {},
         "cupl_files": {}, "dataset_values": {}, "published": ()}
# the shared source strings the old facts module held (shiftlab.methods.facts before the cards)
LEGACY_SOURCES = {
    "R_TPT_TABLE": "R-TPT paper (Sheng et al., CVPR 2025), its CLIP RN50 ImageNet-R table (the project's seed "
                   "leaderboard), as the project's protocol notes give it",
    "TPT_README": "github.com/azshue/TPT README.md@63ecbac, 'Main Results / Out-of-Distribution Generalization' "
                  "table (CLIP RN50)",
    "C_TPT_TABLE": "C-TPT paper (Yoon et al., ICLR 2024), CLIP RN50 ImageNet-R top-1 and ECE (20 bins), as the "
                   "project's protocol notes give them"}
BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
INLINE_WIDTH = 100
IMPORTS = {"from ..specs import": "from ..catalogue.declarations import",
           "from ..protocols import": "from ..catalogue.protocols import",
           "from ..effective import": "from ..catalogue.method_config import"}


# -- TOML writing -----------------------------------------------------------------------------------------

def key(name: str) -> str:
    return name if BARE_KEY.fullmatch(name) else json.dumps(name)


def value(v: Any) -> str:
    """`v` as an inline TOML value (one line)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")) if not math.isfinite(v) else repr(v)
    if isinstance(v, str):
        if "\n" in v:
            if "'''" in v:
                raise ValueError(f"a multi-line string with ''' in it: {v[:40]!r}")
            return "'''\n" + v + "'''"
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{key(str(k))} = {value(x)}" for k, x in v.items()) + "}" if v else "{}"
    if v is None:   # TOML has no null: a config override to None is "None", as `--set field=None` says it
        return '"None"'
    raise ValueError(f"no TOML for {type(v).__name__} {v!r}")


def _is_table(v: Any) -> bool:
    return isinstance(v, dict) and bool(v) and len(value(v)) > INLINE_WIDTH


def _is_table_array(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and bool(v) and all(isinstance(x, dict) for x in v)


def table(path: str, items: dict[str, Any], comments: dict[str, list[str]] | None = None) -> list[str]:
    """`[path]` and its keys in order: a value becomes a sub-table (or an array of tables) only where every value
    after it does too, so the document keeps the dict's order (tomllib reads it back in document order)."""
    comments = comments or {}
    keys = list(items)
    split = len(keys)
    while split and (_is_table(items[keys[split - 1]]) or _is_table_array(items[keys[split - 1]])):
        split -= 1
    lines = [f"[{path}]"] if path and split else []   # a table of tables only: its header is implied
    for k in keys[:split]:
        lines += comments.get(k, []) + [f"{key(k)} = {value(items[k])}"]
    for k in keys[split:]:
        lines.append("")
        lines += comments.get(k, [])
        if _is_table_array(items[k]):
            for entry in items[k]:
                lines += [f"[[{path}.{key(k)}]]", *(f"{key(f)} = {value(x)}" for f, x in entry.items())]
        else:
            lines += table(f"{path}.{key(k)}", items[k])
        if lines[-1:] == [""]:
            lines.pop()
    return lines


# -- reading a spec.py ------------------------------------------------------------------------------------

def _comments(source: str) -> dict[int, str]:
    """Line number -> the comment on it."""
    found = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            found[tok.start[0]] = tok.string
    return found


def _fact_assignments(cls_node: ast.ClassDef) -> dict[str, ast.Assign]:
    out = {}
    for node in cls_node.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in FACTS:
            out[node.targets[0].id] = node
    return out


def _span(node: ast.stmt, lines: list[str], comments: dict[int, str]) -> tuple[int, int]:
    """The lines (1-based, inclusive) an assignment takes with the comment lines right above it."""
    start = node.lineno
    while start > 1 and lines[start - 2].strip().startswith("#"):
        start -= 1
    return start, node.end_lineno


def _call_name(node: ast.AST) -> str:
    return node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else ""


def _settings(folder: str, call: ast.Call) -> dict[str, Any]:
    """The card's `settings` table: the folder's settings.json, plus `templates_of` where the call names one."""
    data = json.loads((METHODS / folder / "settings.json").read_text(encoding="utf-8"))
    for kw in call.keywords:
        if kw.arg == "templates_of":
            data["templates_of"] = ast.literal_eval(kw.value)
    return data


def modernise_imports(path: Path) -> None:
    """Point a spec.py of the older shape at today's modules (`IMPORTS`), the shared source strings it imported
    from the old facts module (`LEGACY_SOURCES`) written out in it, so that it imports; written back only where
    something changed."""
    text = path.read_text(encoding="utf-8")

    def sources(m: re.Match) -> str:
        names = [n.strip() for n in m.group(1).strip("()").replace("\n", " ").split(",") if n.strip()]
        kept = [n for n in names if n not in LEGACY_SOURCES]
        lines = [f"from ..catalogue.cards import {', '.join(kept)}"] if kept else []
        return "\n".join(lines + [f"{n} = {LEGACY_SOURCES[n]!r}" for n in names if n in LEGACY_SOURCES])

    new = re.sub(r"^from \.\.facts import (\([^)]*\)|[\w, ]+)$", sources, text, flags=re.M)
    for old, replacement in IMPORTS.items():
        new = new.replace(old, replacement)
    if new != text:
        path.write_text(new, encoding="utf-8")


def convert(folder: str) -> tuple[str, str]:
    """(card.toml's text, spec.py's new text) for methods/<folder>/."""
    path = METHODS / folder / "spec.py"
    modernise_imports(path)
    source = path.read_text(encoding="utf-8")
    lines = source.split("\n")
    tree = ast.parse(source)
    comments = _comments(source)
    module = importlib.import_module(f"shiftlab.methods.{folder}.spec")
    cards: list[tuple[str, dict[str, Any], dict[str, list[str]]]] = []
    drop: list[tuple[int, int]] = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        assigned = _fact_assignments(node)
        cls = getattr(module, node.name)
        name = vars(cls).get("name")
        if not assigned or not name:
            continue
        facts: dict[str, Any] = {}
        notes: dict[str, list[str]] = {}
        for fact in FACTS:
            if fact not in assigned:
                continue
            stmt = assigned[fact]
            start, end = _span(stmt, lines, comments)
            drop.append((start, end))
            notes[fact] = [comments[i].rstrip() for i in range(start, end + 1) if i in comments]
            if _call_name(stmt.value) == "settings_file":
                facts["settings"] = _settings(folder, stmt.value)
                notes["settings"] = notes.pop(fact)
            elif _call_name(stmt.value) == "cupl_file_names" and ast.literal_eval(stmt.value.args[0]) == folder:
                notes.setdefault("settings", []).extend(notes.pop(fact))   # read from the settings' cupl_files
            elif fact == "adaptive":   # an Adaptive: its fields, `impl` where it has one
                facts[fact] = {k: v for k, v in dataclasses.asdict(vars(cls)[fact]).items() if v != ""}
            else:
                facts[fact] = vars(cls)[fact]
        cards.append((name, facts, notes))
    if not cards:
        raise SystemExit(f"methods/{folder}/spec.py assigns no facts: nothing to convert")
    out = [f"# The facts of methods/{folder}/ (its paper, published numbers, protocols, fidelity, cost rows):",
           "# what docs/METHOD_CARDS.md describes. Read by shiftlab.methods.catalogue.cards, without importing torch.",
           ""]
    base_name, base, _ = cards[0]
    for name, facts, notes in cards:
        if name != base_name:
            shared = [f for f in FACTS if f in base and f in facts and facts[f] == base[f]]
            if len(shared) >= 2 and ("adaptive" in facts or "adaptive" not in base):   # None has no TOML
                facts = {"extends": base_name, **{f: v for f, v in facts.items() if f not in shared},
                         **{f: EMPTY[f] for f in base if f not in facts and f in EMPTY}}
        ordered = {k: facts[k] for k in ("extends", *FACTS, "settings") if k in facts}
        out += table(key(name), ordered, notes) + [""]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(out)).rstrip("\n") + "\n"
    return text, _strip(source, lines, drop)


def _strip(source: str, lines: list[str], drop: list[tuple[int, int]]) -> str:
    gone = {i for start, end in drop for i in range(start, end + 1)}
    kept = [line for i, line in enumerate(lines, 1) if i not in gone]
    text = "\n".join(kept)
    for old, new in IMPORTS.items():
        text = text.replace(old, new)
    # the old shape's boilerplate sentence ("Its spec: config, capabilities and facts, ..."): card.toml says it now
    old = r"\n\nIts spec: config, capabilities and facts, without torch \(the code: method.py\)\."
    text = re.sub(old + r"(?=\"\"\")", "", re.sub(old + " ", "\n\n", text))
    def one_line(m: re.Match) -> str:   # `from x import (\n    A,\n    B,\n)` on one line where it fits
        line = m.group(1) + ", ".join(n.strip() for n in m.group(2).split(",") if n.strip())
        return line if len(line) <= 120 else m.group(0)
    text = re.sub(r"^(from [\w.]+ import )\(\n((?:    \w+,\n)+)\)", one_line, text, flags=re.M)
    # module-level string constants (sources) no longer read anywhere in the module
    tree = ast.parse(text)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    text_lines = text.split("\n")
    unused = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id not in used and node.targets[0].id not in ("__all__",) \
                and isinstance(node.value, (ast.Constant, ast.JoinedStr, ast.BinOp, ast.Tuple)) \
                and all(isinstance(c, ast.Constant) and isinstance(c.value, str)
                        for c in ast.walk(node.value) if isinstance(c, ast.Constant)):
            start = node.lineno
            while start > 1 and text_lines[start - 2].strip().startswith("#"):
                start -= 1
            unused.update(range(start, node.end_lineno + 1))
    text = "\n".join(line for i, line in enumerate(text_lines, 1) if i not in unused)
    return re.sub(r"\n{3,}(?=\S)", lambda m: "\n\n\n" if m.group(0).count("\n") > 3 else m.group(0), text)


def declares_facts(folder: str) -> bool:
    tree = ast.parse((METHODS / folder / "spec.py").read_text(encoding="utf-8"))
    return any(_fact_assignments(n) for n in tree.body if isinstance(n, ast.ClassDef))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*")
    parser.add_argument("--all", action="store_true", help="every method folder whose spec.py still declares facts")
    parser.add_argument("--check", action="store_true", help="print the cards; change no file")
    args = parser.parse_args(argv)
    folders = args.folders or []
    if args.all:
        folders += sorted(p.parent.name for p in METHODS.glob("*/spec.py") if declares_facts(p.parent.name))
    folded: list[Path] = []
    for folder in folders:
        if (METHODS / folder / "card.toml").exists():
            raise SystemExit(f"methods/{folder}/card.toml exists already: merge by hand")
        card, spec = convert(folder)
        if args.check:
            print(card)
            continue
        (METHODS / folder / "card.toml").write_text(card, encoding="utf-8")
        (METHODS / folder / "spec.py").write_text(spec, encoding="utf-8")
        print(f"methods/{folder}: card.toml written, spec.py stripped")
        if "settings" in tomllib.loads(card).get(folder, {}):
            folded.append(METHODS / folder / "settings.json")
    for path in folded:   # last: another folder's spec may read it (templates_of) until its card exists
        path.unlink()
        print(f"{path.relative_to(METHODS.parents[1])}: folded into its card.toml, removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
