"""`--pretrained` judged before torch is imported: the tags open_clip lists for each architecture, read from its
pretrained.py with `ast` (running it would import torch), and the loader's refusal of a tag it does not list."""
from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
import os
import sys
from pathlib import Path

__all__ = ["pretrained_tags", "unknown_pretrained"]


def pretrained_tags(model: str) -> list[str] | None:
    """The pretrained tags open_clip lists for `model` (`open_clip.list_pretrained_tags_by_model`), read from
    its pretrained.py without running it (no torch import); None when that file cannot be read so (the loader
    then judges the tag). Once open_clip is imported its own list answers."""
    if "open_clip" in sys.modules:
        import open_clip
        return list(open_clip.list_pretrained_tags_by_model(model))
    table = _pretrained_table()
    return None if table is None else list(table.get(model, {}))


@functools.cache
def _pretrained_table() -> dict[str, dict[str, bool]] | None:
    """open_clip's _PRETRAINED as {model: {tag: quick_gelu}}, with its '-quickgelu' entries, read with `ast`."""
    spec = importlib.util.find_spec("open_clip")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    try:
        tree = ast.parse(Path(locations[0], "pretrained.py").read_text(encoding="utf-8"))
    except (IndexError, OSError, SyntaxError, ValueError):
        return None

    def tags(node: ast.expr, named: dict[str, dict[str, bool]]) -> dict[str, bool] | None:
        if isinstance(node, ast.Name):
            return named.get(node.id)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
            return {kw.arg: any(k.arg == "quick_gelu" and isinstance(k.value, ast.Constant) and k.value.value is True
                                for k in getattr(kw.value, "keywords", []))
                    for kw in node.keywords if kw.arg is not None}
        if isinstance(node, ast.Dict):
            return {k.value: False for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        return None

    named: dict[str, dict[str, bool]] = {}
    table: dict[str, dict[str, bool]] | None = None
    for stmt in tree.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            continue
        target = stmt.targets[0].id
        if target == "_PRETRAINED" and isinstance(stmt.value, ast.Dict):
            table = {}
            for key, value in zip(stmt.value.keys, stmt.value.values):
                found = tags(value, named)
                if not (isinstance(key, ast.Constant) and isinstance(key.value, str)) or found is None:
                    return None   # a form this reader does not know: the loader judges
                table[key.value] = found
        else:
            found = tags(stmt.value, named)
            if found is not None:
                named[target] = found
    if table is None:
        return None
    quick = {f"{m}-quickgelu": {t: True for t, q in tags_.items() if q} for m, tags_ in table.items()}
    table.update({m: t for m, t in quick.items() if t})
    return table


def unknown_pretrained(model: str, pretrained: str | None) -> str | None:
    """--pretrained as the loader (`models.loader`) refuses it, said before torch is imported, or None: a tag
    open_clip does not list for `model` that is no file either. Random weights, file:, hf-hub: and a file that
    exists are the loader's to judge."""
    text = str(pretrained or "none")
    if text.lower() in ("none", "random") or text.startswith(("hf-hub:", "file:")) or Path(text).expanduser().is_file():
        return None
    tags = pretrained_tags(model)
    if tags is None or text in tags:
        return None
    if os.sep in text or Path(text).suffix:
        return (f"checkpoint file {Path(text).expanduser()} does not exist (and {text!r} is not a pretrained tag "
                f"of {model})")
    close = difflib.get_close_matches(text, tags, n=3, cutoff=0.6)
    guess = f" (did you mean {' or '.join(close)}?)" if close else ""
    return (f"unknown pretrained tag {text!r} for model {model!r}{guess}; known tags: {', '.join(tags) or 'none'}; "
            "a checkpoint file must exist (write file:PATH to say so), use hf-hub:ORG/REPO, or none for random weights")
