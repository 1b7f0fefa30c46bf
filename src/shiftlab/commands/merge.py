"""`shiftlab merge RUN_DIR`: fold torchrun shards into records.jsonl and rewrite the summary."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("merge", help="merge per-rank record shards of a run directory (idempotent)")
    p.add_argument("run_dir", type=Path)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .. import records
    from .. import summary as run_summary
    from ..published import published_for_run
    from ..runtime import identity
    from ..runtime.lock import RunLock, RunLockedError
    run_dir = args.run_dir
    if not records.record_files(run_dir):
        print(f"shiftlab merge: {run_dir} holds no records.jsonl and no shards/*.jsonl")
        return 2
    try:
        with RunLock(run_dir, "merge"):   # never while a run (or another merge) writes there
            records.quarantine(run_dir)
            records.merge_records(run_dir)
            old = run_dir / run_summary.SUMMARY
            try:
                previous = json.loads(old.read_text()) if old.is_file() else {}
            except ValueError:
                previous = {}
            config = previous.get("config", {})
            summary = run_summary.summarize(records.load_records(run_dir), config, previous.get("timings"),
                                            previous.get("identity") or identity.read(run_dir))
            print(run_summary.write_summary(run_dir, summary, published_for_run(summary)))
    except (RunLockedError, records.RunDirError, identity.RunIdentityError) as exc:
        print(f"shiftlab merge: {exc}", file=sys.stderr)
        return 2
    return 0
