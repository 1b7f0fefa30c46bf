"""`shiftlab datasets [--data ROOT]`: every dataset name, its aliases and layout, whether `shiftlab
download` can fetch it, and what is found under ROOT."""
from __future__ import annotations

import argparse
import json
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
    folder = locate(name, root)
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
        rows.append({
            "name": name, "aliases": DATASETS.aliases(name)[1:], "classes": spec.num_classes,
            "layout": LAYOUTS[spec.layout], "folders": list(spec.dirnames),
            "download": "shiftlab download" if spec.url else ("by hand (docs/DATA.md)" if spec.manual else "-"),
            **(_found_fields(found_under(name, Path(root).expanduser())) if root else {}),
        })
    return rows


def _found_fields(found: dict | None) -> dict:
    found = found or {}
    return {"found": found.get("folder"), "found_layout": found.get("layout"), "found_images": found.get("images"),
            "found_problem": found.get("problem")}


def _found_text(r: dict) -> str:
    if not r["found"]:
        return "no"
    what = (f"{r['found_images']} images" if r["found_problem"] is None
            else f"cannot be used: {r['found_problem']}")
    return f"{r['found']} ({r['found_layout']}; {what})"


def run(args: argparse.Namespace) -> int:
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
        if r["aliases"]:
            print(f"{'':16} aliases: {', '.join(r['aliases'])}")
        if r["folders"]:
            print(f"{'':16} folder names under --data: {', '.join(r['folders'])}")
    return 0
