"""Turn run directories into report.html + PNGs + metrics.csv + paired.csv."""
from __future__ import annotations

import csv
import datetime as _dt
import io
import itertools
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

from shiftlab import writes
from shiftlab.datasets import suites
from shiftlab.options import name_of
from shiftlab.report import plots, sections
from shiftlab.report.caveats import caveats
from shiftlab.report.data import ReportData, comparable_groups, is_zeroshot, zeroshot_baseline
from shiftlab.report.html import REPORT_ADVICE, esc, page
from shiftlab.report.load import ReportError, Run, Series, load_runs
from shiftlab.report.stats import PairedResult, holm, paired_compare, series_metrics
from shiftlab.results import suite_table
from shiftlab.rundir.record_files import record_files

__all__ = ["ReportData", "build_report", "choose_pairs", "comparable_groups", "expand_suites", "is_zeroshot",
           "resolve_method", "zeroshot_baseline"]

def resolve_method(name: str, runs: list[Run]) -> list[str]:
    """Display keys a user-given name means: an exact key, else every key of that method."""
    keys = {s.key for r in runs for s in r.series}
    if name in keys:
        return [name]
    by_method = sorted({s.key for r in runs for s in r.series if s.method == name})
    if not by_method:
        raise ReportError(f"{name_of('compare')}: no method {name!r} in these runs; known: {', '.join(sorted(keys))}")
    return by_method


PAIR_MODES = ("reference", "all")


def reference_series(s: Series, group: list[Series], reference: str) -> Series | None:
    """The series of method `reference` to compare s with (zero-shot: any zero-shot variant), from s's
    own run when it has one."""
    if reference == "zeroshot":
        return zeroshot_baseline(s, group)
    candidates = [r for r in group if r.method == reference and r is not s]
    same_run = [r for r in candidates if r.run is s.run]
    return (same_run or candidates or [None])[0]


def choose_pairs(runs: list[Run], mode: str = "reference", compare: Iterable[str] = (),
                 reference: str = "zeroshot") -> list[tuple[Series, Series]]:
    """Pairs (A, B) to compare within each (dataset, setting): every method against the `reference`
    method (B side) by default, every pair with mode "all", plus the user's `compare` pairs."""
    if mode not in PAIR_MODES:
        raise ReportError(f"unknown pairs mode {mode!r} ({', '.join(PAIR_MODES)})")
    pairs: list[tuple[Series, Series]] = []
    wanted = []
    for spec in compare:
        parts = [p.strip() for p in spec.split(",")]
        if len(parts) != 2 or not all(parts):
            raise ReportError(f"{name_of('compare')} expects two method names as A,B, got {spec!r}")
        wanted.append((resolve_method(parts[0], runs), resolve_method(parts[1], runs)))
    methods = {s.method for r in runs for s in r.series}
    if mode == "reference" and reference != "zeroshot" and reference not in methods:
        raise ReportError(f"{name_of('reference')}: no method {reference!r} in these runs; known: "
                          f"{', '.join(sorted(methods))}")
    is_reference = is_zeroshot if reference == "zeroshot" else (lambda x: x.method == reference)
    for group in comparable_groups(runs).values():
        found: list[tuple[Series, Series]] = []
        if mode == "all":
            for a, b in itertools.combinations(group, 2):
                found.append((b, a) if is_reference(a) and not is_reference(b) else (a, b))
        else:
            for s in group:
                base = reference_series(s, group, reference)
                if base is not None and not is_reference(s):
                    found.append((s, base))
        by_key = {s.key: s for s in group}
        for keys_a, keys_b in wanted:
            for ka, kb in itertools.product(keys_a, keys_b):
                if ka in by_key and kb in by_key and ka != kb:
                    # The user's order wins over an automatic pair of the same two methods.
                    found = [p for p in found if {p[0].key, p[1].key} != {ka, kb}]
                    found.append((by_key[ka], by_key[kb]))
        pairs.extend(found)
    return pairs


def paired_results(runs: list[Run], pairs: list[tuple[Series, Series]], n_resamples: int,
                   seed: int) -> list[PairedResult]:
    """McNemar + bootstrap for every pair, p-values Holm-adjusted within each (dataset, setting)."""
    results = [paired_compare(a, b, n_resamples, seed) for a, b in pairs]
    families: dict[tuple[str, str], list[int]] = {}
    for i, (a, _) in enumerate(pairs):
        families.setdefault((a.run.dataset, a.setting_label), []).append(i)
    for members in families.values():
        for i, adjusted in zip(members, holm([results[i].p_value for i in members])):
            results[i].p_holm = adjusted
    return results


def _csv_value(v):
    if isinstance(v, float):
        # Significant digits, not decimals: p-values like 3e-9 must not become 0.
        return "" if math.isnan(v) else f"{v:.10g}"
    return "" if v is None else v


def write_csv(path: Path, rows: list[dict], columns: list[str]) -> Path:
    buffer = io.StringIO(newline="")
    w = csv.DictWriter(buffer, fieldnames=columns)
    w.writeheader()
    for row in rows:
        w.writerow({c: _csv_value(row.get(c)) for c in columns})
    return writes.write_file(path, buffer.getvalue(), REPORT_ADVICE)


METRIC_COLUMNS = ["run", "run_dir", "run_label", "model", "pretrained", "dataset", "method", "method_key",
                  "setting", "setting_label", "attack_eps", "top1", "top5", "ece", "nll", "brier", "n", "errors",
                  "seconds_per_image", "auroc", "fpr95", "aupr", "n_ood"]
PAIRED_COLUMNS = ["dataset", "setting", "a", "b", "n", "acc_a", "acc_b", "diff", "ci_low", "ci_high",
                  "a_only", "b_only", "p_value", "p_holm", "test", "verdict", "bootstrap_resamples", "seed"]


def metric_rows(data: ReportData) -> list[dict]:
    rows = []
    for r in data.runs:
        for s in r.series:
            rows.append({"run": r.name, "run_dir": str(r.path), "run_label": r.label,
                         "model": r.config.get("model"), "pretrained": r.config.get("pretrained"),
                         "dataset": r.dataset, "method": s.method, "method_key": s.key,
                         "setting": s.setting, "setting_label": s.setting_label,
                         "attack_eps": s.attack_eps, **data.m(s)})
    return rows


def expand_suites(paths: Iterable[str | Path]) -> tuple[list[Path], list[Path]]:
    """Run directories to load and suite directories to tabulate: a suite directory (holding
    suite.json) stands for the run directory of each of its datasets that has records."""
    runs, suite_dirs = [], []
    for path in paths:
        try:
            manifest = suite_table.read_manifest(path)
        except suites.SuiteError as exc:
            raise ReportError(str(exc)) from None
        if manifest is None:
            runs.append(Path(path))
            continue
        suite_dirs.append(Path(path))
        started = [suite_table.dataset_dir(path, n) for n in manifest["datasets"]
                   if record_files(suite_table.dataset_dir(path, n))]
        if not started:
            raise ReportError(f"suite {path} has no records yet (none of {', '.join(manifest['datasets'])} started)")
        runs += started
    return runs, suite_dirs


# The files a report folder holds, listed after each build so that the next build into the same
# folder removes what it does not write again (a plot of a dataset no longer in the report) and
# nothing else: a file the report did not write is never touched.
MANIFEST = ".shiftlab_report.json"
# what a report folder written before the manifest existed can hold (used only beside its report.html)
_OWN_PATTERNS = ("report.html", "metrics.csv", "paired.csv", "suite_*.csv", "per_class_*.csv",
                 "accuracy_vs_time*.png", "reliability_*.png", "clean_vs_robust.png", "renditions_*.png",
                 "published.png")


def _previous_report_files(out: Path) -> list[Path]:
    """The files the last report written into ``out`` wrote (its manifest's list; without one,
    the report's own file names, if a report.html shows that a report was written there)."""
    import json
    manifest = out / MANIFEST
    if manifest.is_file():
        try:
            names = json.loads(manifest.read_text(encoding="utf-8"))["files"]
        except (OSError, ValueError, KeyError, TypeError):
            names = []
        # a name is a plain file name inside out: a damaged manifest cannot reach elsewhere
        return [out / n for n in names if isinstance(n, str) and n == Path(n).name and n not in (".", "..")]
    if not (out / "report.html").is_file():
        return []
    return sorted({p for pattern in _OWN_PATTERNS for p in out.glob(pattern)})


def _write_manifest(out: Path, before: set[str]) -> None:
    import json
    written = sorted(p.name for p in out.iterdir() if p.is_file() and p.name not in before and p.name != MANIFEST)
    writes.write_file(out / MANIFEST, json.dumps({"files": written}, indent=1) + "\n", REPORT_ADVICE)


def build_report(run_dirs: Iterable[str | Path], out_dir: str | Path, compare: Iterable[str] = (),
                 pairs: str = "reference", n_resamples: int = 2000,
                 seed: int = 0, title: str | None = None, reference: str = "zeroshot",
                 figure_formats: Sequence[str] = ("png",)) -> Path:
    """Write the report for the given run directories into out_dir; returns report.html's path.
    The folder then holds this report's files only: what the previous report written there
    wrote is removed first (files the report did not write stay). Each figure is a PNG (inlined in the page)
    and, for each of `figure_formats` besides png ("pdf", "svg"), a file of that format beside it."""
    try:
        with plots.figure_formats(figure_formats):
            return _build_report(run_dirs, out_dir, compare, pairs, n_resamples, seed, title, reference)
    except ValueError as exc:
        if str(exc).startswith("figure format"):
            raise ReportError(str(exc)) from None
        raise


def _build_report(run_dirs: Iterable[str | Path], out_dir: str | Path, compare: Iterable[str], pairs: str,
                  n_resamples: int, seed: int, title: str | None, reference: str) -> Path:
    run_dirs, suite_dirs = expand_suites(run_dirs)
    runs = load_runs(run_dirs)
    out = Path(out_dir)
    writes.make_dirs(out, REPORT_ADVICE)
    writes.clean_orphans(out)
    metrics = {(s.key, s.setting_label): series_metrics(s) for r in runs for s in r.series}
    paired = paired_results(runs, choose_pairs(runs, pairs, compare, reference), n_resamples, seed)
    tables = [suite_table.suite_table(d) for d in suite_dirs]
    data = ReportData(runs, metrics, paired, out, n_resamples, seed, tables)
    for stale in _previous_report_files(out):
        writes.remove(stale, REPORT_ADVICE)
    before = {p.name for p in out.iterdir()}
    for d, table in zip(suite_dirs, tables):
        suite_table.write_suite_csv(out / f"suite_{Path(d).resolve().name}.csv", table)

    write_csv(out / "metrics.csv", metric_rows(data), METRIC_COLUMNS)
    dataset_of = {(s.key, s.setting_label): s.run.dataset for s in data.series}
    write_csv(out / "paired.csv",
              [{**p.as_row(), "dataset": dataset_of[(p.a, p.setting)],
                "bootstrap_resamples": n_resamples, "seed": seed} for p in paired], PAIRED_COLUMNS)

    title = title or "shiftlab report: " + ", ".join(r.name for r in runs)
    meta = (f"{len(runs)} run(s), {len(data.series)} method/setting series; generated "
            f"{_dt.datetime.now().isoformat(timespec='seconds')}. Metrics recomputed from records.jsonl; "
            f"accuracies and ECE in percent, NLL in nats. Files: "
            + ", ".join(f'<a href="{esc(n)}">{esc(n)}</a>' for n in (
                "metrics.csv", "paired.csv", *(f"suite_{Path(d).resolve().name}.csv" for d in suite_dirs))))
    parts = [build(data) for build in sections.ALL]
    html_path = out / "report.html"
    writes.write_file(html_path, page(title, meta, [p for p in parts if p], caveats(data)), REPORT_ADVICE)
    _write_manifest(out, before)
    return html_path
