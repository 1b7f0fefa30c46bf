"""Benchmark suites: every dataset of a paper table, one resumable run directory per dataset.

    shiftlab run --suite natural-shift --data ROOT --out runs/ns-rn50 --methods tpt,zeroshot
    shiftlab run --datasets imagenet-r,imagenet-a --data ROOT --out runs/two

A suite directory holds `suite.json` (what was asked for), one run directory per dataset
(`SUITE_DIR/<dataset>/`, each exactly what `shiftlab run --out SUITE_DIR/<dataset>` writes,
resumable on its own) and the suite table (`suite.md`, `suite.csv`): top-1 per method and
dataset (with its ECE and n beside it, and a "partial: --limit N" mark on a dataset whose run did
not cover it all), the average, and for natural shift the OOD average over the four shifted sets,
as in TPT's Table 1. Every number is recomputed from the datasets' records.jsonl.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engine import RunConfig
    from .models import ClipModel

SUITE_FILE = "suite.json"
SUITE_MD = "suite.md"
SUITE_CSV = "suite.csv"


@dataclass(frozen=True)
class Suite:
    name: str
    datasets: tuple[str, ...]
    ood: tuple[str, ...] = ()        # datasets of the "OOD average" column (none: no such column)
    title: str = ""


SUITES: dict[str, Suite] = {
    "natural-shift": Suite(
        "natural-shift", ("imagenet", "imagenet-a", "imagenet-v2", "imagenet-r", "imagenet-sketch"),
        ood=("imagenet-a", "imagenet-v2", "imagenet-r", "imagenet-sketch"),
        title="Natural distribution shift (ImageNet and its four shifted sets; TPT's Table 1)"),
    "cross-dataset": Suite(
        "cross-dataset", ("flowers102", "dtd", "oxford-pets", "stanford-cars", "ucf101", "caltech101",
                          "food101", "sun397", "fgvc-aircraft", "eurosat"),
        title="Cross-dataset generalization (ten fine-grained sets, CoOp's test splits; TPT's Table 2)"),
}

# Column headers as the papers print them.
SHORT_NAMES = {
    "imagenet": "ImageNet", "imagenet-a": "-A", "imagenet-v2": "-V2", "imagenet-r": "-R",
    "imagenet-sketch": "-Sketch", "flowers102": "Flowers102", "dtd": "DTD", "oxford-pets": "Pets",
    "stanford-cars": "Cars", "ucf101": "UCF101", "caltech101": "Caltech101", "food101": "Food101",
    "sun397": "SUN397", "fgvc-aircraft": "Aircraft", "eurosat": "EuroSAT",
}


class SuiteError(ValueError):
    """A suite request the user must fix (unknown suite, empty dataset list, not a suite directory)."""


def resolve_suite(suite: str | None, datasets: str | Sequence[str] | None) -> Suite:
    """The suite for `--suite NAME` or `--datasets a,b,c` (exactly one of them)."""
    if suite and datasets:
        raise SuiteError("give either --suite or --datasets, not both")
    if suite:
        if suite not in SUITES:
            raise SuiteError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
        return SUITES[suite]
    names = [d.strip() for d in (datasets.split(",") if isinstance(datasets, str) else datasets or ()) if d.strip()]
    from .datasets import DATASETS
    names = [DATASETS.canonical(n) if n in DATASETS else n for n in names]  # R, imagenet_r, flowers -> canonical
    if not names:
        raise SuiteError("--datasets needs at least one dataset name, e.g. --datasets imagenet-r,imagenet-a")
    if len(set(names)) != len(names):
        raise SuiteError(f"--datasets lists a dataset twice: {','.join(names)}")
    known = next((s for s in SUITES.values() if s.datasets == tuple(names)), None)
    return known or Suite("custom", tuple(names), title="Datasets " + ", ".join(names))


def dataset_dir(suite_dir: str | Path, dataset: str) -> Path:
    return Path(suite_dir) / dataset


def write_manifest(suite_dir: Path, suite: Suite, config: dict, rewrote: Sequence[str] | None = None,
                   kept: Sequence[str] = ()) -> None:
    """suite.json: the suite, its config, and which datasets the last command ran (`rewrote`)
    and which rows it kept from earlier commands (`kept`)."""
    suite_dir.mkdir(parents=True, exist_ok=True)
    manifest = {"suite": suite.name, "datasets": list(suite.datasets), "ood": list(suite.ood),
                "title": suite.title, "config": config,
                "rewrote": list(suite.datasets if rewrote is None else rewrote), "kept": list(kept)}
    (suite_dir / SUITE_FILE).write_text(json.dumps(manifest, indent=2))


# RunConfig fields that do not change a result: a dataset run with other values of these (and the
# method list, compared per method in the table) can share a table with one run now
_NOT_RESULTS = frozenset({"methods", "resume", "progress", "device", "workers", "batch_size", "limit", "cache_dir",
                          "download", "data", "online_checkpoint_seconds", "trust_checkpoint",
                          "save_probs"})


@dataclass(frozen=True)
class SuiteMerge:
    """What a command that runs `ran` into an existing suite directory does with the other rows."""

    suite: Suite                     # the suite the table covers
    ran: tuple[str, ...]             # the datasets this command runs (their rows are rewritten)
    kept: tuple[str, ...]            # earlier datasets whose rows stay (records on disk, same config)
    # earlier datasets with records that are left out of the table (another configuration), and why
    dropped: tuple[str, ...] = ()
    reason: str = ""

    def message(self) -> str | None:
        if not self.kept and not self.dropped:
            return None
        words = [f"suite: this command runs {', '.join(self.ran)}"]
        if self.kept:
            words.append(f"the table keeps {', '.join(self.kept)} from earlier runs (not re-run)")
        if self.dropped:
            words.append(f"and leaves out {', '.join(self.dropped)} ({self.reason}; their folders stay on disk)")
        return "; ".join(words)


def merge_with_previous(suite_dir: str | Path, suite: Suite, config: dict) -> SuiteMerge:
    """A command given fewer (or other) datasets than the suite directory's suite.json: the table
    keeps the earlier datasets that have records and were run with the same configuration, in
    their order, then the new ones (nothing lost); earlier datasets run otherwise are left out
    of the table and named (nothing mixed)."""
    from .records import record_files
    previous = read_manifest(suite_dir)
    earlier = [d for d in (previous or {}).get("datasets", []) if isinstance(d, str) and d not in suite.datasets]
    started = [d for d in earlier if record_files(dataset_dir(suite_dir, d))]
    if not started:
        return SuiteMerge(suite, suite.datasets, ())

    def results(c: dict) -> dict:
        return {k: v for k, v in json.loads(json.dumps(c)).items() if k not in _NOT_RESULTS}
    old, new = results(previous.get("config") or {}), results(config)
    differ = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if differ:
        return SuiteMerge(suite, suite.datasets, (), tuple(started), f"run with another {', '.join(differ)}")
    # the earlier suite's datasets (not started ones too: the table shows them as missing), then the new
    order = [d for d in previous["datasets"] if d in earlier or d in suite.datasets]
    order += [d for d in suite.datasets if d not in order]
    known = next((k for k in SUITES.values() if set(k.datasets) == set(order)), None)
    merged = known or Suite("custom", tuple(order), title="Datasets " + ", ".join(order))
    return SuiteMerge(merged, suite.datasets, tuple(d for d in merged.datasets if d in started))


def read_manifest(suite_dir: str | Path) -> dict | None:
    """suite.json of a suite directory, or None when the directory is not one."""
    path = Path(suite_dir) / SUITE_FILE
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SuiteError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("datasets"), list):
        raise SuiteError(f"{path} does not describe a suite (no 'datasets' list)")
    return manifest


def suite_from_manifest(manifest: dict) -> Suite:
    return Suite(str(manifest.get("suite") or "custom"), tuple(manifest["datasets"]),
                 tuple(manifest.get("ood") or ()), str(manifest.get("title") or ""))


def run_suite(config: RunConfig, suite: Suite, model: ClipModel | None = None, datasets: dict | None = None) -> dict:
    """Run `config` (an engine RunConfig whose `out` is the suite directory) on every dataset of
    the suite, each into `out/<dataset>`; then write the suite table. Returns the table."""
    from .engine import expand_methods
    from .engine import run as run_engine
    from .runtime import distributed

    config = dataclasses.replace(config, methods=expand_methods(config.methods))   # "all" -> names, in order
    suite_dir = Path(config.out)
    check_suite_settings(config, suite, datasets)
    rank0 = distributed.context().rank == 0
    settings = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("dataset", "out", "classnames")}
    merge = merge_with_previous(suite_dir, suite, settings)
    if rank0:
        write_manifest(suite_dir, merge.suite, settings, rewrote=merge.ran, kept=merge.kept)
        if merge.message():
            print(merge.message(), file=sys.stderr)
    for name in suite.datasets:
        if config.progress and rank0:
            print(f"== {suite.name}: {name} -> {dataset_dir(suite_dir, name)}")
        per_dataset = dataclasses.replace(config, dataset=name, out=str(dataset_dir(suite_dir, name)),
                                          methods=list(config.methods), classnames=None)
        run_engine(per_dataset, model=model, dataset=(datasets or {}).get(name))
    if not rank0:
        return {}
    table = suite_table(suite_dir)
    write_suite_table(suite_dir, table)
    if config.progress:
        print(table_markdown(table))
    return table


def check_suite_settings(config: RunConfig, suite: Suite, datasets: dict | None = None) -> None:
    """Build every dataset's method configs before the first dataset runs, so a setting that cannot work
    on a later dataset stops the suite now with its one-line error, not hours in: an unknown field, DMN-ZS's
    CuPL file missing from a `cupl_file` directory or lacking one of the dataset's classes (when
    `datasets` holds the built dataset)."""
    from .methods import get_method_class
    from .methods.base import make_config
    from .methods.online_common import check_descriptions
    from .protocols import method_overrides

    for name in suite.datasets:
        classnames = getattr((datasets or {}).get(name), "classnames", None)
        for method in config.methods:
            overrides = method_overrides(config.protocol, method, (config.method_config or {}).get(method),
                                         config.precision, dataset=name)
            check_descriptions(method, make_config(get_method_class(method), **overrides), classnames)


# ------------------------------------------------------------------ the table

def suite_table(suite_dir: str | Path, setting: str = "clean") -> dict:
    """Top-1 (percent) per method and dataset from the datasets' records, plus the averages.

    {"suite", "title", "datasets", "ood", "methods", "model", "pretrained",
     "top1": {method: {dataset: value}}, "ece": {method: {dataset: value}}, "n": {method: {dataset: n}},
     "partial": {dataset: "partial: --limit N" and/or "incomplete: k of N samples"},
     "average": {method: value | None}, "ood_average": {method: value | None}, "missing": [...]}
    An average is given only when the method has a number on every dataset it averages.
    """
    from .published_suites import run_identity
    from .report.load import ReportError, load_run
    from .report.stats import series_metrics

    suite_dir = Path(suite_dir)
    manifest = read_manifest(suite_dir)
    if manifest is None:
        raise SuiteError(f"{suite_dir} is not a suite directory (no {SUITE_FILE})")
    suite = suite_from_manifest(manifest)
    top1: dict[str, dict[str, float]] = {}
    ece: dict[str, dict[str, float]] = {}
    counts: dict[str, dict[str, int]] = {}
    partial: dict[str, str] = {}
    missing, identity = [], {}
    for name in suite.datasets:
        try:
            run = load_run(dataset_dir(suite_dir, name))
        except ReportError:
            missing.append(name)
            continue
        identity = identity or (run_identity(run.summary) if run.config else {})
        series = [s for s in run.series if s.setting == setting and s.n]
        for s in series:
            scored = series_metrics(s)
            top1.setdefault(s.method, {})[name] = scored["top1"]
            ece.setdefault(s.method, {})[name] = scored["ece"]
            counts.setdefault(s.method, {})[name] = s.n
        mark = partial_mark(run.config, [s.n + s.errors for s in series])
        if mark:
            partial[name] = mark
    config = manifest.get("config") or {}
    asked = list(config.get("methods") or [])
    methods = [m for m in asked if m in top1] + sorted(set(top1) - set(asked))

    def mean_over(method: str, names: Sequence[str]) -> float | None:
        values = [top1[method].get(d) for d in names]
        return None if not names or any(v is None for v in values) else float(sum(values) / len(values))

    return {"suite": suite.name, "title": suite.title, "datasets": list(suite.datasets), "ood": list(suite.ood),
            "methods": methods, "model": identity.get("model", config.get("model")),
            "pretrained": identity.get("pretrained", config.get("pretrained")),
            "weights_sha256": identity.get("weights_sha256"), "weights_source": identity.get("weights_source"),
            "protocol": identity.get("protocol"),
            "top1": top1, "ece": ece, "n": counts, "partial": partial, "missing": missing,
            "rewrote": list(manifest.get("rewrote") or suite.datasets), "kept": list(manifest.get("kept") or []),
            "average": {m: mean_over(m, suite.datasets) for m in methods},
            "ood_average": {m: mean_over(m, suite.ood) for m in methods} if suite.ood else {}}


def partial_mark(config: dict, accounted: Sequence[int]) -> str:
    """Why a dataset's cells are not the whole dataset's: its run used --limit below the dataset's
    size, or some method has fewer records (predictions and errors) than the run's samples."""
    limit, n_samples = config.get("limit"), config.get("n_samples")
    limit = limit if isinstance(limit, int) and not isinstance(limit, bool) else None
    n_samples = n_samples if isinstance(n_samples, int) and not isinstance(n_samples, bool) else None
    marks = []
    if limit is not None and (n_samples is None or limit < n_samples):
        marks.append(f"partial: --limit {limit}")
    expected = min(x for x in (limit, n_samples) if x is not None) if (limit or n_samples) else None
    if expected is not None and accounted and min(accounted) < expected:
        marks.append(f"incomplete: {min(accounted)} of {expected} samples")
    return "; ".join(marks)


def table_columns(table: dict) -> list[str]:
    return [*table["datasets"], "average", *(["ood_average"] if table["ood"] else [])]


def column_title(column: str) -> str:
    return {"average": "Average", "ood_average": "OOD Average"}.get(column, SHORT_NAMES.get(column, column))


def row_values(table: dict, method: str) -> list[float | None]:
    return [*(table["top1"][method].get(d) for d in table["datasets"]), table["average"][method],
            *([table["ood_average"][method]] if table["ood"] else [])]


def _cell(v: float | None) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"


def _dataset_cell(table: dict, method: str, dataset: str) -> str:
    """'58.90 (ECE 4.10, n 30000)': top-1 with its calibration and sample count."""
    top1 = table["top1"][method].get(dataset)
    if top1 is None:
        return "—"
    ece = (table.get("ece") or {}).get(method, {}).get(dataset)
    return f"{_cell(top1)} (ECE {_cell(ece)}, n {table['n'][method].get(dataset, 0)})"


def published_suite_rows(table: dict) -> list[dict]:
    """The papers' rows comparable with this suite's run: backbone, weights by checksum or verified hub
    source, protocol (see shiftlab.published_suites)."""
    from .published_suites import suite_rows
    return suite_rows(table["suite"], table.get("model"), weights_sha256=table.get("weights_sha256"),
                      protocol=table.get("protocol"), weights_source=table.get("weights_source"))


def table_markdown(table: dict) -> str:
    """The suite table as Markdown: our methods, then the comparable published rows with sources."""
    from .display import model_label

    columns = table_columns(table)
    partial = table.get("partial") or {}
    head = ["method", *(column_title(c) + (f" ({partial[c]})" if c in partial else "") for c in columns)]
    lines = [f"### {table['title'] or table['suite']} · {model_label(table.get('model'), table.get('pretrained'))}",
             "", "Top-1 accuracy (%), clean images; beside it ECE (%, 15 bins) and n (samples scored).", "",
             "| " + " | ".join(head) + " |", "|---|" + "---:|" * len(columns)]
    for m in table["methods"]:
        cells = [_dataset_cell(table, m, c) if c in table["datasets"] else _cell(v)
                 for c, v in zip(columns, row_values(table, m))]
        lines.append("| " + " | ".join([m, *cells]) + " |")
    published = published_suite_rows(table)
    notes = []
    if partial:
        notes.append("not the whole dataset: " + ", ".join(f"{column_title(d)} ({partial[d]})" for d in partial)
                     + "; averages over them are not comparable with published numbers")
    if table["missing"]:
        notes.append("no records yet for: " + ", ".join(table["missing"]))
    if table.get("kept"):
        notes.append(f"last written by a run of {', '.join(table['rewrote'])}; {', '.join(table['kept'])} "
                     "kept from earlier runs of the same configuration")
    if published:
        lines += ["", "Published (same backbone, OpenAI weights by checksum, `paper` protocol; — = not "
                  "published or not verified from a primary source):", "",
                  "| published row | source | " + " | ".join(map(column_title, columns)) + " |",
                  "|---|---|" + "---:|" * len(columns)]
        for row in published:
            values = [row["values"].get(d) for d in table["datasets"]] + [row.get("average")]
            values += [row.get("ood_average")] if table["ood"] else []
            lines.append(f"| {row['label']} | {row['source_id']} | " + " | ".join(map(_cell, values)) + " |")
        cited = dict.fromkeys((row["source_id"], row["source"]) for row in published)
        lines += ["", *(f"- {sid}: {citation}" for sid, citation in cited)]
    return "\n".join(lines) + "\n" + ("\n" + "; ".join(notes) + "\n" if notes else "")


CSV_COLUMNS = ["suite", "kind", "method", "label", "model", "pretrained", "dataset", "top1", "ece", "n", "partial",
               "source"]


def table_rows(table: dict) -> list[dict]:
    """Long-format rows (one per method x column) for suite.csv; published rows are kind=published."""
    rows = []
    base = {"suite": table["suite"], "model": table.get("model"), "pretrained": table.get("pretrained")}
    for m in table["methods"]:
        for column, value in zip(table_columns(table), row_values(table, m)):
            rows.append({**base, "kind": "ours", "method": m, "label": m, "dataset": column, "top1": value,
                         "ece": (table.get("ece") or {}).get(m, {}).get(column), "n": table["n"][m].get(column),
                         "partial": (table.get("partial") or {}).get(column), "source": "records.jsonl"})
    for row in published_suite_rows(table):
        values = {**row["values"], "average": row.get("average"), "ood_average": row.get("ood_average")}
        for column in table_columns(table):
            rows.append({**base, "kind": "published", "method": row.get("method"), "label": row["label"],
                         "dataset": column, "top1": values.get(column), "n": None, "source": row["source"]})
    return rows


def write_suite_csv(path: Path, table: dict) -> Path:
    with Path(path).open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in table_rows(table):
            writer.writerow({k: ("" if row.get(k) is None else (f"{row[k]:.10g}" if isinstance(row[k], float)
                                                                 else row[k])) for k in CSV_COLUMNS})
    return Path(path)


def write_suite_table(suite_dir: str | Path, table: dict) -> None:
    suite_dir = Path(suite_dir)
    (suite_dir / SUITE_MD).write_text(table_markdown(table))
    write_suite_csv(suite_dir / SUITE_CSV, table)
