"""`shiftlab methods --bibtex`: every method's citation as BibTeX, each entry printed once (a .bib file takes
each key once) under a comment naming the methods that cite it.

A method's citation is its spec's own `bibtex` string (methods/<name>/spec.py, the authors' own BibTeX where
their README gives one): never inherited, so a family's variants each cite their paper. Specs are torch-free.
"""
from __future__ import annotations

import re

from ..methods.catalogue import listing as catalogue


def bibtex(name: str) -> str:
    """Method `name`'s citation (one or more BibTeX entries), '' when its spec declares none."""
    from ..methods.catalogue.declarations import spec
    return str(vars(spec(name)).get("bibtex", "") or "")   # its own, never a family's inherited one


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


def print_bibtex(names: list[str] | None = None) -> int:
    """Every method's citation, or those of `names`."""
    print(render(catalogue.names() if names is None else names))
    return 0
