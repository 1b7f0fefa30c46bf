"""The suite table: top-1 (with ECE and n) per method and dataset of a suite directory, the averages
(for natural shift the OOD average over the four shifted sets, as in TPT's Table 1), suite.md and
suite.csv. Every number is read from the datasets' summary.json."""
from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import writes
from ..datasets.specs import DATASETS
from ..datasets.suites import Suite, SuiteError
from ..methods.catalogue import listing as catalogue

SUITE_FILE = "suite.json"
SUITE_MD = "suite.md"
SUITE_CSV = "suite.csv"

def dataset_dir(suite_dir: str | Path, dataset: str) -> Path:
    return Path(suite_dir) / dataset


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
                 tuple(manifest.get("ood") or ()), str(manifest.get("title") or ""),
                 kind=str(manifest.get("kind") or "datasets"), base=str(manifest.get("base") or ""))


# ------------------------------------------------------------------ the table

# what a suite's datasets must share to be one table: the backbone, its weights and the protocol that ran
_SUITE_IDENTITY = ("model", "pretrained", "weights_sha256", "protocol")


def _what_ran(summary: dict) -> dict[str, Any]:
    """`_SUITE_IDENTITY` of a dataset's run: its run identity's (what ran), else its config's (`run_identity`)."""
    from .published_suites import run_identity
    shared = (summary.get("identity") or {}).get("shared") if isinstance(summary.get("identity"), dict) else None
    if isinstance(shared, dict) and shared.get("model") is not None:
        return {"model": shared.get("model"), "pretrained": shared.get("pretrained"),
                "weights_sha256": shared.get("checkpoint_sha256") or shared.get("weights_sha256"),
                "protocol": shared.get("protocol")}
    return {k: v for k, v in run_identity(summary).items() if k in _SUITE_IDENTITY}


def _read_summary(run_dir: Path) -> dict | None:
    """A dataset run's summary.json (written at the end of its run and by `shiftlab merge`), or None when
    it has none yet or it is not a summary."""
    path = run_dir / "summary.json"
    try:
        summary = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and isinstance(summary.get("methods"), dict) else None


def suite_table(suite_dir: str | Path, setting: str = "clean") -> dict:
    """Top-1 (percent) per method and dataset from the datasets' summary.json, plus the averages.

    {"suite", "title", "datasets", "ood", "methods", "model", "pretrained",
     "top1": {method: {dataset: value}}, "ece": {method: {dataset: value}}, "n": {method: {dataset: n}},
     "partial": {dataset: "partial: --limit N" and/or "incomplete: k of N samples"},
     "average": {method: value | None}, "ood_average": {method: value | None}, "missing": [...]}
    An average is given only when the method has a number on every dataset it averages.
    """
    from .published_suites import run_identity

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
    mismatched: dict[str, str] = {}
    first: dict[str, Any] | None = None
    for name in suite.datasets:
        summary = _read_summary(dataset_dir(suite_dir, name))
        if summary is None:
            missing.append(name)
            continue
        # each dataset's summary is read back: one run otherwise than the suite's first (another backbone, weights
        # or protocol: a folder copied in, a dataset rerun with other flags) is left out and named, never averaged
        ran = _what_ran(summary)
        if first is None:
            first = ran
        by_digest = bool(ran["weights_sha256"] and first["weights_sha256"])   # then a moved file is the same weights
        differ = [f"{k} {ran[k]}, not {first[k]}" for k in _SUITE_IDENTITY
                  if ran[k] != first[k] and not (k == "pretrained" and by_digest)]
        if differ:
            mismatched[name] = "; ".join(differ)
            continue
        identity = identity or (run_identity(summary) if summary.get("config") else {})
        accounted = []
        for method, entry in summary["methods"].items():
            scores = entry if setting == "clean" else entry.get("robust") or {}
            if (setting != "clean" and scores.get("setting") != setting) or not scores.get("n"):
                continue
            top1.setdefault(method, {})[name] = scores["top1"]
            ece.setdefault(method, {})[name] = scores["ece"]
            counts.setdefault(method, {})[name] = scores["n"]
            # an open-set dataset's samples: its ID records (n) and its OOD ones (the detection's n_ood)
            accounted.append(scores["n"] + scores.get("errors", 0) + ((scores.get("ood") or {}).get("n_ood") or 0))
        mark = partial_mark(summary.get("config") or {}, accounted)
        if mark:
            partial[name] = mark
    config = manifest.get("config") or {}
    asked = list(config.get("methods") or [])
    methods = [m for m in asked if m in top1] + sorted(set(top1) - set(asked))

    def mean_over(method: str, names: Sequence[str]) -> float | None:
        values = [top1[method].get(d) for d in names]
        return None if not names or any(v is None for v in values) else float(sum(values) / len(values))

    table = {"suite": suite.name, "title": suite.title, "datasets": list(suite.datasets), "ood": list(suite.ood),
            "methods": methods, "model": identity.get("model", config.get("model")),
            "pretrained": identity.get("pretrained", config.get("pretrained")),
            "weights_sha256": identity.get("weights_sha256"), "weights_source": identity.get("weights_source"),
            "protocol": identity.get("protocol"),
            "top1": top1, "ece": ece, "n": counts, "partial": partial, "missing": missing,
            "rewrote": list(manifest.get("rewrote") or suite.datasets), "kept": list(manifest.get("kept") or []),
            "mismatched": mismatched,
            "average": {m: mean_over(m, suite.datasets) for m in methods},
            "ood_average": {m: mean_over(m, suite.ood) for m in methods} if suite.ood else {}}
    if suite.kind == "corruption":
        from .corruption_table import corruption_columns
        table.update(corruption_columns(top1, suite.datasets, methods, suite.base))
    return table


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
    if table.get("kind") == "corruption":   # the field's table: accuracy per corruption, mean, mCE
        return [*table["corruptions"], "average", "mce"]
    return [*table["datasets"], "average", *(["ood_average"] if table["ood"] else [])]


def column_title(column: str) -> str:
    """A column's header as the papers print it: the dataset's `short` title (datasets/specs.py)."""
    if column in ("average", "ood_average", "mce"):
        return {"average": "Average", "ood_average": "OOD Average", "mce": "mCE"}[column]
    known = column in DATASETS and DATASETS.canonical(column) == column
    return (DATASETS.get(column).short or column) if known else column


def row_values(table: dict, method: str) -> list[float | None]:
    if table.get("kind") == "corruption":
        return [*(table["accuracy"].get(method, {}).get(c) for c in table["corruptions"]), table["average"][method],
                table["mce"].get(method)]
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
    source, protocol (see shiftlab.results.published_suites)."""
    from .published_suites import suite_rows
    return suite_rows(table["suite"], table.get("model"), weights_sha256=table.get("weights_sha256"),
                      protocol=table.get("protocol"), weights_source=table.get("weights_source"))


def table_markdown(table: dict) -> str:
    """The suite table as Markdown: our methods, then the comparable published rows with sources."""
    from .display import suite_heading
    if table.get("kind") == "corruption":
        from .corruption_table import corruption_markdown
        return corruption_markdown(table)

    columns = table_columns(table)
    partial = table.get("partial") or {}
    head = ["method", *(column_title(c) + (f" ({partial[c]})" if c in partial else "") for c in columns)]
    lines = [suite_heading(table), "",
             "Top-1 accuracy (%), clean images; beside it ECE (%, 15 bins) and n (samples scored).", "",
             "| " + " | ".join(head) + " |", "|---|" + "---:|" * len(columns)]
    # the methods that read other test images (their batch, the whole test set) in blocks of their own, each
    # under its label (shiftlab.methods.catalogue.listing.BLOCKS), never in the single-image rows
    for k, (block, methods) in enumerate(catalogue.by_block(table["methods"])):
        if k or block != catalogue.SINGLE_IMAGE:
            lines += ["", f"**{catalogue.BLOCKS[block]}**", "", "| " + " | ".join(head) + " |",
                      "|---|" + "---:|" * len(columns)]
        for m in methods:
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
    if table.get("mismatched"):
        notes.append("left out (run otherwise than this suite): " + ", ".join(
            f"{column_title(d)} ({why})" for d, why in table["mismatched"].items()))
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
               "source", "block"]


def table_rows(table: dict) -> list[dict]:
    """Long-format rows (one per method x column) for suite.csv; published rows are kind=published."""
    rows = []
    base = {"suite": table["suite"], "model": table.get("model"), "pretrained": table.get("pretrained")}
    for m in table["methods"]:
        for column, value in zip(table_columns(table), row_values(table, m)):
            rows.append({**base, "kind": "ours", "method": m, "label": m, "dataset": column, "top1": value,
                         "ece": (table.get("ece") or {}).get(m, {}).get(column), "n": table["n"][m].get(column),
                         "partial": (table.get("partial") or {}).get(column), "source": "records.jsonl",
                         "block": catalogue.block(m)})
    for row in published_suite_rows(table):
        values = {**row["values"], "average": row.get("average"), "ood_average": row.get("ood_average")}
        for column in table_columns(table):
            rows.append({**base, "kind": "published", "method": row.get("method"), "label": row["label"],
                         "dataset": column, "top1": values.get(column), "n": None, "source": row["source"]})
    return rows


def write_suite_csv(path: Path, table: dict) -> Path:
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS)
    writer.writeheader()
    for row in table_rows(table):
        writer.writerow({k: ("" if row.get(k) is None else (f"{row[k]:.10g}" if isinstance(row[k], float)
                                                             else row[k])) for k in CSV_COLUMNS})
    return writes.write_file(path, buffer.getvalue(), writes.resume_advice())


def write_suite_table(suite_dir: str | Path, table: dict) -> None:
    suite_dir = Path(suite_dir)
    writes.write_file(suite_dir / SUITE_MD, table_markdown(table), writes.resume_advice())
    write_suite_csv(suite_dir / SUITE_CSV, table)
