"""`shiftlab merge RUN_DIR`: fold torchrun shards into records.jsonl and rewrite the summary."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("merge", help="merge per-rank record shards of a run directory (idempotent)")
    p.add_argument("run_dir", type=Path)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .. import records
    from .. import summary as run_summary
    from ..published import published_for_run
    run_dir = args.run_dir
    if not records.record_files(run_dir):
        print(f"shiftlab merge: {run_dir} holds no records.jsonl and no shards/*.jsonl")
        return 2
    records.merge_records(run_dir)
    old = run_dir / run_summary.SUMMARY
    previous = json.loads(old.read_text()) if old.is_file() else {}
    config = previous.get("config", {})
    summary = run_summary.summarize(records.load_records(run_dir), config, previous.get("timings"))
    print(run_summary.write_summary(run_dir, summary, published_for_run(summary)))
    return 0
