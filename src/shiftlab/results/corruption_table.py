"""The corruption suite's table, as the field prints it: top-1 accuracy per corruption (the mean over the
severities run), their mean, and the mean corruption error (mCE).

mCE follows Hendrycks & Dietterich (ICLR 2019, section 3): a method f's corruption error on corruption c is
CE_c = sum_s E_{s,c}(f) / sum_s E_{s,c}(ref), E the top-1 error at severity s, and mCE the mean of CE_c over the
corruptions, in percent. They normalise by AlexNet's errors; here the reference is zero-shot CLIP (the method
`zeroshot` of the same run, same model and views), so mCE < 100 means fewer errors than zero-shot CLIP under the
same corruptions. Without a zero-shot row, or where its error is 0, mCE is left out (—) and the table says so.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from ..datasets.suites import parse_corruption_entry
from ..methods.catalogue import listing as catalogue

__all__ = ["REFERENCE", "corruption_columns", "mean_corruption_error", "corruption_markdown"]

REFERENCE = "zeroshot"


def mean_corruption_error(errors: Mapping[str, Mapping[int, float]],
                          reference: Mapping[str, Mapping[int, float]]) -> float | None:
    """mCE in percent from top-1 errors {corruption: {severity: error %}} of a method and of the reference, over
    the corruptions and severities both have; None when a corruption's reference error sum is 0 or nothing is shared."""
    ces = []
    for corruption, by_severity in errors.items():
        shared = [s for s in by_severity if s in reference.get(corruption, {})]
        if not shared:
            return None
        denominator = sum(reference[corruption][s] for s in shared)
        if denominator <= 0:
            return None
        ces.append(sum(by_severity[s] for s in shared) / denominator)
    return 100.0 * sum(ces) / len(ces) if ces else None


def corruption_columns(top1: Mapping[str, Mapping[str, float]], entries: Sequence[str], methods: Sequence[str],
                       base: str) -> dict:
    """The table's corruption keys: kind, base, reference, corruptions, severities, accuracy {method: {corruption:
    mean top-1 over its severities}}, average {method: mean over corruptions}, mce {method: value or None}."""
    corruptions = list(dict.fromkeys(parse_corruption_entry(e)[0] for e in entries))
    severities = sorted({parse_corruption_entry(e)[1] for e in entries})
    errors: dict[str, dict[str, dict[int, float]]] = {}
    for method in methods:
        for entry, value in top1.get(method, {}).items():
            corruption, severity = parse_corruption_entry(entry)
            errors.setdefault(method, {}).setdefault(corruption, {})[severity] = 100.0 - value
    accuracy: dict[str, dict[str, float]] = {}
    average: dict[str, float | None] = {}
    mce: dict[str, float | None] = {}
    for method in methods:
        by_c = errors.get(method, {})
        complete = {c: v for c, v in by_c.items() if set(v) == set(severities)}
        accuracy[method] = {c: 100.0 - sum(v.values()) / len(v) for c, v in complete.items()}
        done = all(c in accuracy[method] for c in corruptions)
        average[method] = sum(accuracy[method].values()) / len(corruptions) if done and corruptions else None
        reference = {c: v for c, v in errors.get(REFERENCE, {}).items() if set(v) == set(severities)}
        mce[method] = (mean_corruption_error(complete, reference)
                       if done and all(c in reference for c in corruptions) else None)
    return {"kind": "corruption", "base": base, "reference": REFERENCE, "corruptions": corruptions,
            "severities": severities, "accuracy": accuracy, "average": average, "mce": mce}


def _cell(value: float | None) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"


def corruption_markdown(table: dict) -> str:
    """The corruption table as Markdown: one row per method, one column per corruption, mean and mCE."""
    severities = table["severities"]
    sev = f"severity {severities[0]}" if len(severities) == 1 else "mean over severities " + ",".join(
        map(str, severities))
    head = ["method", *table["corruptions"], "mean", "mCE"]
    from .display import suite_heading
    lines = [suite_heading(table),
             "", f"Top-1 accuracy (%) of {table.get('base') or '?'} under each corruption ({sev}); mCE (%): "
             "Hendrycks & Dietterich's mean corruption error with zero-shot CLIP (`zeroshot`) as the reference "
             "instead of AlexNet (100 = as many errors as zero-shot CLIP).", "",
             "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for k, (block, methods) in enumerate(catalogue.by_block(table["methods"])):   # as suite_table.table_markdown
        if k or block != catalogue.SINGLE_IMAGE:
            lines += ["", f"**{catalogue.BLOCKS[block]}**", "", "| " + " | ".join(head) + " |",
                      "|---|" + "---:|" * (len(head) - 1)]
        for method in methods:
            cells = [_cell(table["accuracy"].get(method, {}).get(c)) for c in table["corruptions"]]
            lines.append("| " + " | ".join([method, *cells, _cell(table["average"].get(method)),
                                            _cell(table["mce"].get(method))]) + " |")
    notes = []
    if REFERENCE not in table["methods"]:
        notes.append("no mCE: the reference method zeroshot was not run (add it to --methods)")
    if table.get("missing"):
        notes.append("no records yet for: " + ", ".join(table["missing"]))
    if table.get("partial"):
        notes.append("not the whole dataset: " + ", ".join(f"{k} ({v})" for k, v in table["partial"].items()))
    return "\n".join(lines) + "\n" + ("\n" + "; ".join(notes) + "\n" if notes else "")
