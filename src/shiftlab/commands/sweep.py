"""`shiftlab sweep`: every point of a hyperparameter grid from a feature store, one record set per point.

    shiftlab sweep --grid tda.pos_alpha=1,2,4 --grid tda.neg_alpha=0.117,0.2 --features feats \\
        --dataset imagenet-r --data DIR --out runs/sweep

Each point is a resumable run directory OUT/points/<point>; the first point encodes into the store
what it lacks, every later one reads it (no decoding). OUT/sweep.md and sweep.csv give top-1, ECE
and n per point and method; `*` marks the point with the method's own (published) setting.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import json
import re
import sys
from pathlib import Path
from typing import Any

from . import checks
from . import run as run_command


def grid_arg(text: str) -> tuple[str, str, list[Any]]:
    """'tda.pos_alpha=1,2,4' -> ('tda', 'pos_alpha', [1, 2, 4]), each value checked as --set checks it."""
    key, sep, raw = text.partition("=")
    values = [v.strip() for v in raw.split(",") if v.strip()]
    if not sep or not values:
        raise argparse.ArgumentTypeError(f"expected METHOD.FIELD=V1,V2,... (e.g. tda.pos_alpha=1,2,4), got {text!r}")
    parsed = [checks.method_override(f"{key}={v}") for v in values]
    return parsed[0][0], parsed[0][1], [p[2] for p in parsed]


def grid_points(grids: list[tuple[str, str, list[Any]]]) -> list[dict[str, dict[str, Any]]]:
    """Every combination of the grids' values, as method configs ({'tda': {'pos_alpha': 2}})."""
    points = []
    for values in itertools.product(*(g[2] for g in grids)):
        point: dict[str, dict[str, Any]] = {}
        for (method, name, _), value in zip(grids, values):
            point.setdefault(method, {})[name] = value
        points.append(point)
    return points


def point_label(point: dict[str, dict[str, Any]]) -> str:
    return ",".join(f"{m}.{f}={v}" for m, cfg in point.items() for f, v in cfg.items())


def point_dir(point: dict[str, dict[str, Any]]) -> str:
    return re.sub(r"[^A-Za-z0-9._=,-]", "_", point_label(point))


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("sweep", help="a hyperparameter grid from a feature store, one record set per point",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    run_command.add_run_arguments(p)
    p.add_argument("--grid", type=grid_arg, action="append", required=True, metavar="METHOD.FIELD=V1,V2,...",
                   help="a grid axis (repeatable: the grid is every combination)")
    for action in p._actions:
        if action.dest == "features":
            action.required = True
    p.set_defaults(func=run)


def _defaults(args: argparse.Namespace, methods: list[str]) -> dict[str, Any]:
    from ..datasets.specs import DATASETS
    from ..methods.base import effective_config
    canonical = DATASETS.canonical(args.dataset) if args.dataset in DATASETS else None
    run_views = ({"n_views": args.views} if args.views is not None else {}) | ({"augmix": True} if args.augmix else {})
    return {m: effective_config(m, args.protocol, canonical, args.precision, run_views) for m in methods}


def run(args: argparse.Namespace) -> int:
    from ..engine.loop import run as run_engine
    from ..methods.base import get_method_class
    methods = list(dict.fromkeys(g[0] for g in args.grid))
    pixels = [m for m in methods if get_method_class(m).needs_pixels]
    if pixels:
        print(f"shiftlab sweep: error: {', '.join(pixels)} need pixels (not only view features), so a grid over "
              "them cannot be read from a feature store; run them with `shiftlab run --set`", file=sys.stderr)
        return 2
    if args.suite or args.datasets or args.attack != "none":
        print("shiftlab sweep: error: a sweep reads one --dataset's clean features (no --suite, no --attack)",
              file=sys.stderr)
        return 2
    args.methods = methods
    problem = run_command.check_combination(args)
    if problem:
        print(f"shiftlab sweep: error: {problem}", file=sys.stderr)
        return 2
    try:
        cfg, model, datasets = run_command.prepare(args)
    except run_command.CannotStart as exc:
        for problem in exc.problems:
            print(f"shiftlab sweep: error: {problem}", file=sys.stderr)
        return 1
    defaults = _defaults(args, methods)
    out = Path(cfg.out)
    rows = []
    for point in grid_points(args.grid):
        config = {m: dict(cfg.method_config.get(m, {})) | point.get(m, {}) for m in methods}
        try:
            run_engine(dataclasses.replace(cfg, methods=list(methods), method_config=config, resume=True,
                                           out=str(out / "points" / point_dir(point)), progress=False),
                       model=model, dataset=datasets[args.dataset])
        except (FileExistsError, KeyError, TypeError, ValueError) as exc:
            print(f"shiftlab sweep: error: {point_label(point)}: {run_command.one_line(exc)}", file=sys.stderr)
            return 2
        summary = json.loads((out / "points" / point_dir(point) / "summary.json").read_text())
        published = all(getattr(defaults[m], f) == v for m, c in point.items() for f, v in c.items())
        for m in methods:
            s = summary["methods"].get(m, {})
            rows.append({"point": point_label(point), "published": published, "method": m,
                         "top1": s.get("top1"), "ece": s.get("ece"), "n": s.get("n")})
    _write_table(out, rows)
    return 0


def _write_table(out: Path, rows: list[dict[str, Any]]) -> None:
    def num(v: Any) -> str:
        return "-" if v is None else f"{v:.2f}"
    lines = ["| point | method | top-1 | ECE | n |", "|---|---|---|---|---|"]
    lines += [f"| {r['point']}{' *' if r['published'] else ''} | {r['method']} | {num(r['top1'])} | "
              f"{num(r['ece'])} | {r['n']} |" for r in rows]
    lines.append("\n`*`: the method's own (published) setting.")
    md = "\n".join(lines) + "\n"
    (out / "sweep.md").write_text(md)
    with open(out / "sweep.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["point"])
        writer.writeheader()
        writer.writerows(rows)
    print(md, end="")
