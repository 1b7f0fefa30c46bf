"""`shiftlab bench`: speed of every method against a straightforward transcription of its paper.

- `baseline`: the straightforward per-image procedures (no caching, full 77-token text tower);
- `runner`: the measurements (`run_bench`); `rounds`: the interleaved rounds (the feature-store re-run
  included) and the projection; `memory`: peak memory per phase; `images`: synthetic images, class names;
- `report`: the table (`format_report`); `progress`: the heartbeat (no torch: the command starts it first).

The names below are imported on first use, so that `shiftlab.bench.progress` loads without torch.
"""
from __future__ import annotations

import importlib

_WHERE = {"bench_classnames": "images", "format_report": "report", "BenchConfig": "runner",
          "default_methods": "runner", "run_bench": "runner"}

__all__ = ["BenchConfig", "bench_classnames", "default_methods", "format_report", "run_bench"]


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
