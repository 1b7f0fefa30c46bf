"""`shiftlab methods`: the registered methods with their defaults."""
from __future__ import annotations

import dataclasses
import json


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("methods", help="list registered methods and their config defaults")
    p.add_argument("--json", action="store_true", help="print as JSON")
    p.set_defaults(func=run)


def method_table() -> list[dict]:
    from ..methods import get_method_class, list_methods
    rows = []
    for name in list_methods():
        cls = get_method_class(name)
        defaults = {f.name: f.default for f in dataclasses.fields(cls.config_class)
                    if f.default is not dataclasses.MISSING}
        rows.append({"name": name, "episodic": cls.episodic, "uses_views": cls.needs_views,
                     "summary": cls.summary, "defaults": defaults})
    return rows


def run(args) -> int:
    rows = method_table()
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    for r in rows:
        kind = "episodic" if r["episodic"] else "online"
        print(f"{r['name']:<16} {kind:<9} {r['summary']}")
        if r["defaults"]:
            print(" " * 27 + ", ".join(f"{k}={v}" for k, v in r["defaults"].items()))
    return 0
