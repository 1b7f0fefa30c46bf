"""`shiftlab methods --bibtex`: every method's citation as BibTeX, each entry printed once (a .bib file takes
each key once) under a comment naming the methods that cite it.

The citations are data (shiftlab/data/citations.json: BibTeX lines per method, from the authors' READMEs
where they give one); a method that declares a `bibtex` string fact of its own (its spec's, once every method
has one) is read first. No torch: the file is JSON and a spec is torch-free.
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from .. import catalogue

PATH = Path(__file__).resolve().parents[1] / "data" / "citations.json"


@functools.cache
def _file() -> dict[str, list[str]]:
    return {k: v for k, v in json.loads(PATH.read_text(encoding="utf-8")).items() if not k.startswith("_")}


def _declared(name: str) -> str:
    """The method's own `bibtex` fact, '' where it declares none (or no torch-free spec exists yet)."""
    # the method folders' torch-free specs, where they exist (importing the method package before them
    # imports torch)
    if not (PATH.parents[1] / "methods" / "specs.py").is_file():
        return ""
    from ..methods.specs import spec
    return str(vars(spec(name)).get("bibtex", "") or "")   # its own, never a family's inherited one


def bibtex(name: str) -> str:
    """Method `name`'s citation (one or more BibTeX entries), '' when none is known."""
    return _declared(name) or "\n".join(_file().get(name, []))


def split_entries(text: str) -> list[str]:
    """'@a{...}\\n@b{...}' -> the entries, each from its '@' line."""
    starts = [m.start() for m in re.finditer(r"^@", text, re.M)]
    return [text[a:b].strip() for a, b in zip(starts, starts[1:] + [len(text)])]


def render(names: list[str]) -> str:
    """Each distinct entry once, under '% <the methods citing it>'; then the methods that cite nothing."""
    cited: dict[str, list[str]] = {}
    uncited = []
    for name in names:
        entries = split_entries(bibtex(name))
        if not entries:
            uncited.append(name)
        for entry in entries:
            cited.setdefault(entry, []).append(name)
    blocks = [f"% {', '.join(methods)}\n{entry}" for entry, methods in cited.items()]
    if uncited:
        blocks.append(f"% no citation known for: {', '.join(uncited)}")
    return "\n\n".join(blocks)


def print_bibtex() -> int:
    print(render(catalogue.names()))
    return 0
