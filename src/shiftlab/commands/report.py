"""`shiftlab report RUN_DIR [RUN_DIR ...] --out REPORT_DIR`: one static HTML page over runs."""
from __future__ import annotations

import argparse
import os
import sys

from . import checks


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "report", help="HTML report (plots, paired comparison) over one or more run directories",
        description="Build a self-contained HTML report (report.html, PNGs, metrics.csv, paired.csv) "
                    "from run directories. Metrics are recomputed from each run's records.jsonl. "
                    "See docs/REPORTS.md.")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (hold records.jsonl)")
    p.add_argument("--out", required=True, metavar="REPORT_DIR", help="where to write the report")
    p.add_argument("--compare", action="append", default=[], metavar="A,B",
                   help="also compare method A with B on paired samples (repeatable); a name is a "
                        "method key as shown in the report, or a method name")
    p.add_argument("--pairs", choices=("reference", "all"), default="reference",
                   help="which method pairs to compare per dataset and setting: each method against "
                        "--reference (default), or all pairs; p-values are Holm-corrected per dataset and setting")
    p.add_argument("--reference", default="zeroshot", metavar="METHOD",
                   help="the method every other one is compared with (default zeroshot)")
    p.add_argument("--bootstrap", type=int, default=2000, metavar="N",
                   help="paired bootstrap resamples for the 95%% interval (default 2000)")
    p.add_argument("--seed", type=checks.int_in(0, 2 ** 64 - 1), default=0, help="bootstrap seed (default 0)")
    p.add_argument("--title", default=None, help="page title")
    p.add_argument("--figure-format", type=_formats, default=["png"], metavar="FMT",
                   help="also write every figure as pdf and/or svg beside its png (comma-separated, e.g. pdf,svg; "
                        "the page inlines the pngs)")
    p.set_defaults(func=run)
    return p


FIGURE_FORMATS = ("png", "pdf", "svg")   # report.plots.FIGURE_FORMATS, without importing the plots here


def _formats(text: str) -> list[str]:
    formats = [f.strip().lower().lstrip(".") for f in str(text).split(",") if f.strip()]
    unknown = [f for f in formats if f not in FIGURE_FORMATS]
    if unknown or not formats:
        raise argparse.ArgumentTypeError(f"unknown figure format {', '.join(unknown) or repr(text)}; choose from "
                                         f"{', '.join(FIGURE_FORMATS)} (comma-separated for several)")
    return list(dict.fromkeys(formats))


def run(args: argparse.Namespace) -> int:
    try:
        import matplotlib  # noqa: F401  (the optional extra shiftlab[report])
    except ImportError:
        print("shiftlab report: error: the report's plots need matplotlib: pip install 'shiftlab[report]'",
              file=sys.stderr)
        return 1
    from shiftlab.report.build import build_report
    from shiftlab.report.load import ReportError

    if args.bootstrap < 1:
        print("error: --bootstrap must be at least 1", file=sys.stderr)
        return 2
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        print(f"error: --out {args.out} is a file, not a folder; give a folder for the report", file=sys.stderr)
        return 2
    try:
        path = build_report(args.runs, args.out, compare=args.compare, pairs=args.pairs, reference=args.reference,
                            n_resamples=args.bootstrap, seed=args.seed, title=args.title,
                            figure_formats=args.figure_format)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"report written to {path}")
    return 0
