"""A run's results as a table: `shiftlab.load_results(run_dir)`, a pandas DataFrame of summary.json's scores
(one row per dataset x method x setting), or of the records themselves (`records=True`: one row per sample x
method x setting).

A run directory (its summary.json) or a suite directory (each dataset's run directory below it, a `dataset`
column telling them apart) is read; a run stopped before its summary is scored from its records as
`shiftlab merge` would. Nested values become flat columns (`robust` of an attacked run: rows of their own with
`setting`; `ood.auroc` -> `ood_auroc`). pandas is optional (`pip install pandas`): `result_rows` gives the same
rows as a list of dicts without it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..rundir import record_files
from .summary import SUMMARY, summarize

__all__ = ["load_results", "result_rows"]

# the first columns, in this order, when present
_LEADING = ("dataset", "method", "setting", "top1", "top5", "ece", "ece20", "nll", "n", "errors", "seconds_per_image")


def _flat(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}_{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value


def _run_dirs(path: Path) -> list[Path]:
    """`path` itself when it is a run directory, else the run directories one level below it (a suite)."""
    def is_run(d: Path) -> bool:
        return (d / SUMMARY).is_file() or bool(record_files.record_files(d))
    if is_run(path):
        return [path]
    below = sorted(d for d in path.iterdir() if d.is_dir() and is_run(d))
    if not below:
        raise FileNotFoundError(f"{path}: no run here (neither summary.json nor records.jsonl, in it or one "
                                "folder below); pass the folder a shiftlab run or suite wrote")
    return below


def _summary(run_dir: Path) -> dict:
    try:
        data = json.loads((run_dir / SUMMARY).read_text())
        if isinstance(data, dict) and isinstance(data.get("methods"), dict):
            return data
    except (OSError, ValueError):
        pass
    return summarize(record_files.load_records(run_dir), {})   # stopped before its summary: scored from its records


def _summary_rows(run_dir: Path) -> list[dict[str, Any]]:
    summary = _summary(run_dir)
    dataset = (summary.get("config") or {}).get("dataset", run_dir.name)
    rows = []
    for method, entry in summary["methods"].items():
        clean = {k: v for k, v in entry.items() if k != "robust"}
        parts = [("clean", clean)] if "top1" in clean else []
        if isinstance(entry.get("robust"), dict):
            robust = dict(entry["robust"])
            parts.append((robust.pop("setting", "robust"), {"seconds_per_image": entry.get("seconds_per_image"),
                                                            **robust}))
        for setting, scores in parts:
            row: dict[str, Any] = {"dataset": dataset, "method": method, "setting": setting}
            _flat("", scores, row)
            rows.append(row)
    return rows


def _record_rows(run_dir: Path, dataset: str) -> list[dict[str, Any]]:
    rows = []
    for rec in record_files.load_records(run_dir):
        row: dict[str, Any] = {"dataset": dataset}
        _flat("", rec, row)
        rows.append(row)
    return rows


def result_rows(run_dir: str | Path, records: bool = False) -> list[dict[str, Any]]:
    """The rows `load_results` makes, as dicts (no pandas needed)."""
    path = Path(run_dir).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such run directory")
    rows: list[dict[str, Any]] = []
    for d in _run_dirs(path):
        if records:
            dataset = (_summary(d).get("config") or {}).get("dataset", d.name) if (d / SUMMARY).is_file() else d.name
            rows += _record_rows(d, dataset)
        else:
            rows += _summary_rows(d)
    return rows


def load_results(run_dir: str | Path, records: bool = False) -> Any:
    """A pandas DataFrame of a run's (or a suite's) scores, one row per dataset x method x setting; with
    `records=True`, of its records, one row per sample x method x setting. See the module docstring."""
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("shiftlab.load_results needs pandas, which is not installed: pip install pandas "
                          "(or shiftlab.results.frame.result_rows for the same rows as dicts)") from None
    rows = result_rows(run_dir, records)
    frame = pd.DataFrame(rows)
    leading = [c for c in _LEADING if c in frame.columns]
    return frame[leading + [c for c in frame.columns if c not in leading]]
