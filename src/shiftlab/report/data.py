"""What the report's sections read: the loaded runs with their metrics and paired tests.

Kept apart from build.py (which computes it) and sections.py (which lays it out), so
the two depend on this module and not on each other.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from shiftlab.report.load import Run, Series
from shiftlab.report.stats import PairedResult
from shiftlab.results.published import canonical_method


@dataclass
class ReportData:
    runs: list[Run]
    metrics: dict[tuple[str, str], dict]
    paired: list[PairedResult]
    out: Path
    n_resamples: int
    seed: int
    suites: list[dict] = field(default_factory=list)   # suite tables (shiftlab.results.suite_table.suite_table)

    @property
    def series(self) -> list[Series]:
        return [s for r in self.runs for s in r.series]

    def m(self, s: Series) -> dict:
        return self.metrics[(s.key, s.setting_label)]

    def groups(self) -> dict[tuple[str, str], list[Series]]:
        return comparable_groups(self.runs)


def is_zeroshot(s: Series) -> bool:
    return canonical_method(s.method) == "zeroshot"


def comparable_groups(runs: list[Run]) -> dict[tuple[str, str], list[Series]]:
    """(dataset, setting label) -> series: sample ids only mean the same image within one."""
    groups: dict[tuple[str, str], list[Series]] = {}
    for r in runs:
        for s in r.series:
            groups.setdefault((r.dataset, s.setting_label), []).append(s)
    return groups


def zeroshot_baseline(s: Series, group: list[Series]) -> Series | None:
    """The zero-shot series to compare s with: from the same run if it has one."""
    candidates = [z for z in group if is_zeroshot(z) and z is not s]
    same_run = [z for z in candidates if z.run is s.run]
    return (same_run or candidates or [None])[0]
