"""`shiftlab merge RUN_DIR`: fold torchrun shards into records.jsonl and rewrite the summary.

The same `finish_run` as the end of a run: lines the run's schema refuses are quarantined (named
by file and line), and the summary carries the labels and config of run.json. Any problem is one
line on stderr and exit status 2, never a traceback.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("merge", help="merge per-rank record shards of a run directory (idempotent)")
    p.add_argument("run_dir", type=Path)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..results import summary as run_summary
    from ..rundir import record_files
    from ..rundir.lock import RunLock, RunLockedError
    run_dir = args.run_dir
    if not record_files.record_files(run_dir):
        print(f"shiftlab merge: {run_dir} holds no records.jsonl and no shards/*.jsonl")
        return 2
    from ..results import orders
    try:
        with RunLock(run_dir, "merge"):   # never while a run (or another merge) writes there
            _, md = run_summary.finish_run(run_dir)
            # --orders K: each later order is a run directory of its own; merge them, then gather them again
            for sub in sorted((Path(run_dir) / orders.ORDERS_DIR).glob("[0-9]*")):
                if record_files.record_files(sub):
                    with RunLock(sub, "merge"):
                        run_summary.finish_run(sub)
            table = orders.refresh_orders(run_dir)
    except (RunLockedError, OSError, ValueError) as exc:   # RunDirError, RunIdentityError (run.json) among them
        print(f"shiftlab merge: {exc}", file=sys.stderr)
        return 2
    print(md)
    if table is not None:
        print(orders.orders_markdown(table))
    return 0
