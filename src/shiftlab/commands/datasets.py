"""`shiftlab datasets [--data ROOT]`: every dataset name, its aliases and layout, whether `shiftlab
download` can fetch it, and what is found under ROOT."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("datasets", help="list dataset names, aliases, layouts, downloads and what --data holds")
    p.add_argument("--data", metavar="ROOT", help="a data root to look in (as `shiftlab run --data` reads it)")
    p.add_argument("--json", action="store_true", help="print as JSON")
    p.set_defaults(func=run)


def found_under(name: str, root: Path) -> dict | None:
    """What `shiftlab run --dataset name --data root` would read: the folder named for the dataset
    under `root` (or `root` itself when it holds the dataset), the layout found there, and its image
    count, or why it cannot be used; None when neither holds it."""
    from ..datasets.base import DatasetError
    from ..datasets.build import build_dataset, layout_of, locate
    from ..datasets.specs import DATASETS
    folder = locate(name, root)
    if DATASETS.get(name).corrupted:   # one set per corruption and severity: the corruptions found are listed
        return None if folder is None else {"folder": str(folder), "layout": "stored corrupted set"}
    try:
        ds = build_dataset(name, root)
    except (DatasetError, OSError) as exc:
        if folder is None:
            return None
        return {"folder": str(folder), "layout": layout_of(name, folder), "problem": " ".join(str(exc).split())}
    return {"folder": str(folder or ds.root), "layout": ds.found_layout, "images": len(ds)}


def dataset_rows(root: str | None) -> list[dict]:
    from ..datasets.specs import DATASETS, LAYOUTS
    rows = []
    for name in DATASETS.names():
        spec = DATASETS.get(name)
        layout = LAYOUTS[spec.layout]
        if spec.corrupted and spec.layout != "npy":
            layout = f"<corruption>/<severity 1-5>/ folders, each {layout}"
        row = {
            "name": name, "aliases": DATASETS.aliases(name)[1:], "classes": spec.num_classes,
            "layout": layout, "folders": list(spec.dirnames),
            "download": "shiftlab download" if spec.url else ("by hand (docs/DATA.md)" if spec.manual else "-"),
            **(_found_fields(found_under(name, Path(root).expanduser())) if root else {}),
        }
        if spec.corrupted and row.get("found"):
            from ..datasets.corrupted import stored_corruptions
            row["corruptions"] = stored_corruptions(Path(row["found"]), "npy" if spec.layout == "npy" else "folders")
        rows.append(row)
    return rows


def _found_fields(found: dict | None) -> dict:
    found = found or {}
    return {"found": found.get("folder"), "found_layout": found.get("layout"), "found_images": found.get("images"),
            "found_problem": found.get("problem")}


def _found_text(r: dict) -> str:
    if not r["found"]:
        return "no"
    what = (f"cannot be used: {r['found_problem']}" if r["found_problem"] is not None
            else f"{r['found_images']} images" if r["found_images"] is not None else "")
    if not what:
        return f"{r['found']} ({r['found_layout']})"
    return f"{r['found']} ({r['found_layout']}; {what})"


def run(args: argparse.Namespace) -> int:
    if args.data and not os.path.isdir(os.path.expanduser(args.data)):   # else every dataset reads "found: no"
        print(f"shiftlab datasets: error: --data {args.data}: no such folder", file=sys.stderr)
        return 2
    rows = dataset_rows(args.data)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        line = f"{r['name']:<16} {str(r['classes'] or '-'):>5} classes  download: {r['download']}"
        if args.data:
            line += f"  found: {_found_text(r)}"
        print(line)
        print(f"{'':16} layout: {r['layout']}")
        if r.get("corruptions") is not None:
            print(f"{'':16} corruptions found: {', '.join(r['corruptions']) or 'none'}")
        if r["aliases"]:
            print(f"{'':16} aliases: {', '.join(r['aliases'])}")
        if r["folders"]:
            print(f"{'':16} folder names under --data: {', '.join(r['folders'])}")
    return 0
