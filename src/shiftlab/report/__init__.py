"""Static HTML report over one or more run directories (see docs/REPORTS.md).

    from shiftlab.report import build_report
    build_report(["runs/a", "runs/b"], "report/", compare=["tpt,zeroshot"])
"""
from shiftlab.report.build import build_report, choose_pairs
from shiftlab.report.load import ReportError, Run, Series, load_run, load_runs
from shiftlab.report.stats import (
    PairedResult,
    mcnemar,
    paired_bootstrap_ci,
    paired_compare,
    rendition_of,
    series_metrics,
)

__all__ = ["build_report", "choose_pairs", "ReportError", "Run", "Series", "load_run", "load_runs",
           "PairedResult", "mcnemar", "paired_bootstrap_ci", "paired_compare", "rendition_of",
           "series_metrics"]
