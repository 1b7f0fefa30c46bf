"""What tests compare between two runs: record files read back, and records with their timings removed."""
from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from pathlib import Path


def json_lines(path: Path) -> list[dict]:
    """Every non-blank line of a JSON-lines file, parsed."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def comparable(recs: Iterable[dict], methods: Collection[str] | None = None) -> list[str]:
    """Records as sorted canonical JSON without `seconds` (the one field two identical runs differ in);
    `methods`: only those methods' records."""
    return sorted(json.dumps({k: v for k, v in r.items() if k != "seconds"}, sort_keys=True)
                  for r in recs if methods is None or r.get("method") in methods)


class Crash(Exception):
    """What `crash_before_step` raises: a run stopped in process at a known step."""


def crash_before_step(step: int):
    """Run hooks that raise `Crash` before the run's step `step` (0-based): the steps before it are done and
    written, as a killed run leaves them."""
    from shiftlab.engine.loop import RunHooks

    class CrashBeforeStep(RunHooks):
        steps = 0

        def before_step(self, ids):
            if self.steps == step:
                raise Crash
            self.steps += 1
    return CrashBeforeStep()
