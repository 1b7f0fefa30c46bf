"""`shiftlab sweep`: every point of a hyperparameter grid in one pass over a feature store.

    shiftlab sweep --grid tda.pos_alpha=1,2,4 --grid tda.neg_alpha=0.117,0.2 --features feats \\
        --dataset imagenet-r --data DIR --out runs/sweep

A point of a method is a method of its own in ONE run directory OUT: `tda@pos_alpha=2.0,neg_alpha=0.2`
(shiftlab.methods.catalogue.method_config.VARIANT), with its own records, summary row and, for an online method, its own
state along the one stream. Each sample's features are read from the store once (encoded into it the
first time) and shared by every point; the run is resumable, and a later sweep with more grid values adds
its new points to the same directory. OUT/sweep.md, sweep.csv and sweep.json give top-1, ECE and n per
point and method, for every point of every grid swept into OUT (the `grid` column numbers the grids
in sweep.json's `grids`, in the order they were swept); `*` marks the point with the method's own
(published) setting. sweep.json carries its own SHA-256: a damaged one is said, and the earlier
grids' points are then recovered from the run's methods (run.json) under grid "?".
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from .. import writes
from . import checks
from . import run as run_command

SWEEP_JSON = "sweep.json"
SWEEP_ADVICE = "then run the same sweep again: the points already done are kept"


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


def variant_name(method: str, fields: dict[str, Any]) -> str:
    """The run's name of `method` under one point's values: 'tda@pos_alpha=2.0,neg_alpha=0.2'."""
    from ..methods.catalogue.method_config import VARIANT
    return method + VARIANT + ",".join(f"{f}={v}" for f, v in fields.items())


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


def _defaults(cfg: Any, methods: list[str]) -> dict[str, Any]:
    """Each method's effective config under `cfg` without the grid: the base every point shares (or, without
    `--set`, the method's own), from the plan of a run of `cfg` (`engine.run_plan`)."""
    from ..engine.run_plan import resolve_plan
    plan = resolve_plan(dataclasses.replace(cfg, methods=list(methods),
                                            method_config={m: dict(cfg.method_config.get(m, {})) for m in methods}))
    return plan.method_configs()


def _config_json(config: Any) -> dict[str, Any]:
    from ..rundir.identity import jsonable
    return jsonable(dataclasses.asdict(config))


def _base_clash(out: Path, base: dict[str, Any], grid: list[tuple[str, str, list[Any]]]) -> str | None:
    """Why this sweep cannot add its points to `out`: a point already there of a swept method was run on other
    base settings (another `--set`, say) than this sweep's, so its row would sit beside the new ones as if they
    differed only by the grid. None when every field outside both points' grids agrees (or `out` is new)."""
    try:
        earlier = json.loads((out / "run.json").read_text())["methods"]
    except (OSError, ValueError, KeyError, TypeError):
        return None   # nothing to compare with (a damaged run.json is the resume check's to refuse)
    swept = {m: {f for g_m, f, _ in grid if g_m == m} for m in base}
    for variant, stored in sorted(earlier.items()) if isinstance(earlier, dict) else []:
        method, at, point = variant.partition("@")
        if not at or method not in base or not isinstance(stored, dict):
            continue
        theirs = {item.partition("=")[0] for item in point.split(",")}
        mine = _config_json(base[method])
        differ = [f"{f} {_show(stored[f])} there, {_show(mine[f])} here" for f in sorted(mine.keys() & stored.keys())
                  if f not in theirs | swept[method] and stored[f] != mine[f]]
        if differ:
            return (f"{out} holds {variant}, swept on other base settings ({'; '.join(differ)}); a new point "
                    f"beside it would differ by more than its grid values: sweep into another --out, or give the "
                    f"same --set as that sweep")
    return None


def _show(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def run(args: argparse.Namespace) -> int:
    methods = list(dict.fromkeys(g[0] for g in args.grid))
    if args.suite or args.datasets or args.attack != "none":
        print("shiftlab sweep: error: a sweep reads one --dataset's clean features (no --suite, no --attack)",
              file=sys.stderr)
        return 2
    args.methods = methods
    code, problems = run_command.refusal(args)   # the flags and --data before torch is imported
    if code:
        for problem in problems:
            print(f"shiftlab sweep: error: {problem}", file=sys.stderr)
        return code
    from ..engine.loop import run as run_engine
    from ..engine.prepare import CannotStart
    from ..engine.run_plan import resolve_plan
    from ..methods.base import get_method_class
    pixels = [m for m in methods if get_method_class(m).spec.needs_pixels]
    if pixels:
        print(f"shiftlab sweep: error: {', '.join(pixels)} need pixels (not only view features), so a grid over "
              "them cannot be read from a feature store; run them with `shiftlab run --set`", file=sys.stderr)
        return 2
    try:
        cfg, model, datasets = run_command.prepare(args, command="shiftlab sweep")
    except CannotStart as exc:
        for problem in exc.problems:
            print(f"shiftlab sweep: error: {problem}", file=sys.stderr)
        return 1
    points = grid_points(args.grid)
    clash = _base_clash(Path(cfg.out), _defaults(cfg, methods), args.grid)
    if clash:
        print(f"shiftlab sweep: error: {clash}", file=sys.stderr)
        return 2
    variants: dict[str, dict[str, Any]] = {}   # the run's method name -> its config (one per method and point)
    for point in points:
        for m, fields in point.items():
            variants[variant_name(m, fields)] = dict(cfg.method_config.get(m, {})) | fields
    out = Path(cfg.out)
    try:   # the run's plan: every point's configs, resolved once, handed to the run and read for the table
        plan = resolve_plan(dataclasses.replace(cfg, methods=list(variants), method_config=variants, resume=True))
        summary = run_engine(plan.config, model=model, dataset=datasets[args.dataset], plan=plan)
    except (FileExistsError, KeyError, TypeError, ValueError) as exc:
        print(f"shiftlab sweep: error: {run_command.one_line(exc)}", file=sys.stderr)
        return 2
    if not summary:   # torchrun: ranks other than 0 leave the table to rank 0
        return 0
    own = _defaults(dataclasses.replace(cfg, method_config={}), methods)   # the method's own setting, no --set
    grids, rows = _earlier(out)
    this = [list(g) for g in args.grid]
    if this not in grids:
        grids.append(this)
    number = grids.index(this) + 1
    by_key = {(r["point"], r["variant"]): r for r in rows}
    for point in points:
        # `*` only where the point's whole config is the method's own: its grid values and the base (--set) alike
        published = all(_config_json(plan.method_configs()[variant_name(m, fields)]) == _config_json(own[m])
                        for m, fields in point.items())
        for m, fields in point.items():
            row = by_key.setdefault((point_label(point), variant_name(m, fields)),
                                    {"point": point_label(point), "published": published, "method": m,
                                     "variant": variant_name(m, fields), "grids": []})
            row["grids"] = sorted(set(row.get("grids", [])) | {number}, key=str)
    rows = list(by_key.values())
    for row in rows:   # every point's numbers from the run directory's records as they are now
        s = summary["methods"].get(row["variant"], {})
        row.update(top1=s.get("top1"), ece=s.get("ece"), n=s.get("n"))
    body = {"grid": this, "grids": grids, "rows": rows}
    writes.write_file(out / SWEEP_JSON, json.dumps(body | {"sha256": _digest(body)}, indent=1), SWEEP_ADVICE)
    _write_table(out, rows)
    return 0


def _digest(body: dict) -> str:
    import hashlib
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _earlier(out: Path) -> tuple[list, list[dict]]:
    """The grids and rows of the sweeps already in `out` (sweep.json, checked against its SHA-256); when
    it is damaged, the points are recovered from run.json's methods (`tda@pos_alpha=2.0`) under grid "?"."""
    path = out / SWEEP_JSON
    if not path.is_file():
        return [], []
    try:
        data = json.loads(path.read_text())
        body = {k: v for k, v in data.items() if k != "sha256"}
        if data.get("sha256") != _digest(body):
            raise ValueError("its SHA-256 does not match")
        return list(data["grids"]), [dict(r) for r in data["rows"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"shiftlab sweep: warning: {path} cannot be trusted ({exc}); the earlier points are taken from "
              "run.json's methods", file=sys.stderr)
    try:
        methods = json.loads((out / "run.json").read_text())["methods"]
    except (OSError, ValueError, KeyError, TypeError):
        return [], []
    rows = []
    for variant in sorted(v for v in methods if "@" in v):
        method, _, fields = variant.partition("@")
        rows.append({"point": ",".join(f"{method}.{f}" for f in fields.split(",")), "published": False,
                     "method": method, "variant": variant, "grids": ["?"]})
    return [], rows


def _write_table(out: Path, rows: list[dict[str, Any]]) -> None:
    def num(v: Any) -> str:
        return "-" if v is None else f"{v:.2f}"
    lines = ["| point | method | top-1 | ECE | n | grid |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['point']}{' *' if r['published'] else ''} | {r['method']} | {num(r['top1'])} | "
              f"{num(r['ece'])} | {r['n']} | {','.join(map(str, r['grids']))} |" for r in rows]
    lines.append("\n`*`: the method's own (published) setting; grid: which sweep(s) of this directory ran the "
                 "point (sweep.json's `grids`, in order).")
    md = "\n".join(lines) + "\n"
    writes.write_file(out / "sweep.md", md, SWEEP_ADVICE)
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]) if rows else ["point"])
    writer.writeheader()
    writer.writerows([r | {"grids": " ".join(map(str, r["grids"]))} for r in rows])
    writes.write_file(out / "sweep.csv", buffer.getvalue(), SWEEP_ADVICE)
    print(md, end="")
