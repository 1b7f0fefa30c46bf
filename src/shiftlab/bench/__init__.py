"""`shiftlab bench`: speed of every method against a straightforward transcription of its paper.

- `baseline`: the straightforward per-image procedures (no caching, full 77-token text tower);
- `runner`: the measurements (`run_bench`); `rounds`: the interleaved rounds (the feature-store re-run
  included) and the projection; `memory`: peak memory per phase; `images`: synthetic images, class names;
- `report`: the table (`format_report`).
"""
from .images import bench_classnames
from .report import format_report
from .runner import BenchConfig, default_methods, run_bench

__all__ = ["BenchConfig", "bench_classnames", "default_methods", "format_report", "run_bench"]
