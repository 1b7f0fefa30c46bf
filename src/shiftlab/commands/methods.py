"""`shiftlab methods`: the registered methods, their defaults, and what each protocol runs.

It reads the method catalogue (shiftlab.methods.catalogue.listing: every method folder's spec.py and card),
so it imports no torch."""
from __future__ import annotations

import argparse
import json

from ..methods.catalogue import listing as catalogue
from . import checks


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("methods", help="list registered methods, their defaults and both protocols' recipes")
    p.add_argument("names", nargs="*", type=checks.listed_method_names, metavar="METHOD",
                   help="only these methods (names or comma-separated lists; default: every one)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print as JSON")
    out.add_argument("--table", action="store_true",
                     help="print the methods table (markdown, each name linking its folder's README.md)")
    out.add_argument("--bibtex", action="store_true", help="print every method's citation as BibTeX (cite the "
                                                           "methods you report; CITATION.cff cites shiftlab)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    named = {n for names in args.names for n in names}
    wanted = None if not named or "all" in named else named
    if args.bibtex:
        from .citations import print_bibtex
        return print_bibtex(None if wanted is None else sorted(wanted))
    rows = [r for r in catalogue.entries() if wanted is None or r["name"] in wanted]
    if args.table:
        print(catalogue.readme_table(rows))
        return 0
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    for block, label in catalogue.BLOCKS.items():
        members = [r for r in rows if r["block"] == block]
        if members:
            print(f"\n== {label}" if block != catalogue.SINGLE_IMAGE else f"== {label}")
            _print_rows(members)
    refused = {n: why for n, why in catalogue.refused().items() if wanted is None or n in wanted}
    if refused:
        print(("\n" if rows else "") + "== registered, not runnable on CLIP here")
        for name, reason in refused.items():
            print(f"{name:<16} {'refused':<9} {reason}")
    print("\nprecision 'auto' follows `shiftlab run --precision` (fp16 autocast on CUDA, float32 on CPU); "
          "'fp16-pure' is the model itself in float16 on CUDA (the authors' clip.load), float32 on CPU.")
    return 0


def _print_rows(rows: list[dict]) -> None:
    """Each method's lines: name, kind, summary; defaults; both protocols' recipes; published numbers (said
    as transductive where the method reads other test images)."""
    for r in rows:
        print(f"{r['name']:<16} {r['kind']:<9} {r['summary']}")
        defaults = {k: v for k, v in r["defaults"].items() if k not in ("views", "precision")}
        if defaults:
            print(" " * 27 + ", ".join(f"{k}={v}" for k, v in defaults.items()))
        for protocol, p in r["protocols"].items():
            extra = "".join(f", {k}={v}" for k, v in p["sets"].items())
            print(" " * 27 + f"{protocol + ':':<13} {p['views_text']}; precision {p['precision']}; "
                  f"text {p['text_head']}{extra}")
        if r["paper_datasets"]:
            print(" " * 27 + f"per dataset:  {len(r['paper_datasets'])} datasets get their values from the "
                  "authors' code under paper")
        if r["published"]:
            said = "" if r["block"] == catalogue.SINGLE_IMAGE else f", {r['block']}"
            print(" " * 27 + "published:    " + "; ".join(
                f"{p['value']} {p['metric']} ({p['dataset']}, {p['backbone']}, {p['protocol']}{said})"
                for p in r["published"]))
