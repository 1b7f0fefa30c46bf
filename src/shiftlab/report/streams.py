"""The report's stream sections: accuracy over the stream (one figure per online method) and the
distribution over `--orders K` stream orders (a box per method, with a sign test against the reference).

Both read what the run recorded: `stream.json` (the sample ids in stream order, which methods are online;
shiftlab.rundir.stream) and `orders.json` (shiftlab.results.orders). Runs made before either existed are
left out, with a note.
"""
from __future__ import annotations

import numpy as np

from shiftlab.report import plots
from shiftlab.report.data import ReportData, is_zeroshot
from shiftlab.report.html import Cell, esc, fmt_p, image, num, table
from shiftlab.report.load import Series
from shiftlab.report.stats import mcnemar
from shiftlab.results.orders import read_orders
from shiftlab.rundir.stream import read_stream

Section = tuple[str, str, str]


def running_accuracy(s: Series, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(stream positions 1..n, cumulative top-1 % after each) of `s`'s samples in stream order `ids`
    (samples it has no prediction for, errors included, are skipped)."""
    correct = dict(zip(s.ids.tolist(), s.correct.tolist()))
    hits = np.array([correct[i] for i in ids if i in correct], dtype=float)
    if not hits.size:
        return np.zeros(0), np.zeros(0)
    positions = np.arange(1, hits.size + 1)
    return positions, 100.0 * np.cumsum(hits) / positions


def domain_boundaries(stream: dict) -> list[tuple[int, str]]:
    """(stream position, 0-based, where a run of one domain starts, its name) of a recorded stream of domains;
    every position for a mixed stream is a switch, so only streams with at most 2 runs per domain get them."""
    names, domain_of = stream.get("domains"), stream.get("domain_of")
    if not names or not domain_of:
        return []
    starts = [(i, names[d]) for i, d in enumerate(domain_of) if i == 0 or domain_of[i - 1] != d]
    return starts if len(starts) <= 2 * len(names) else []


def domain_accuracy(s: Series, stream: dict) -> list[float]:
    """`s`'s top-1 % on each domain of a recorded stream of domains (nan where it has no prediction)."""
    domain = dict(zip(stream["ids"], stream["domain_of"]))
    out = []
    for d in range(len(stream["domains"])):
        hits = [bool(c) for i, c in zip(s.ids.tolist(), s.correct.tolist()) if domain.get(i) == d]
        out.append(100.0 * sum(hits) / len(hits) if hits else float("nan"))
    return out


def _domain_table(run, stream: dict) -> str:
    rows = [[s.key, s.setting_label, *[num(a) for a in domain_accuracy(s, stream)]] for s in run.series]
    return ("<p>Top-1 % per domain, in stream order (" + esc(stream.get("order", "recorded")) + "):</p>"
            + table(["method", "setting", *stream["domains"]], rows, text_cols=2))


def stream_section(data: ReportData) -> Section | None:
    body, notes = "", []
    for run in data.runs:
        stream = read_stream(run.path)
        if stream is None:
            if any(s.setting == "clean" for s in run.series):
                notes.append(run.name)
            continue
        if stream.get("domains") and stream.get("domain_of"):
            body += f"<h3>Domains of {esc(run.name)}</h3>" + _domain_table(run, stream)
        boundaries = [(i + 1, name) for i, name in domain_boundaries(stream)]
        online = [s for s in run.series if s.method in stream["online"]]
        for s in online:
            ref = next((z for z in run.series if is_zeroshot(z) and z.setting == s.setting), None)
            lines = [(s.key, *running_accuracy(s, stream["ids"]))]
            if ref is not None:
                lines.append((f"{ref.key} (reference)", *running_accuracy(ref, stream["ids"])))
            delta = stream.get("delta")
            kind = stream.get("order", "recorded") + (f", delta {delta:g}" if delta is not None else "")
            title = f"{s.key} over the {kind} stream ({run.name}, {s.setting_label})"
            png = plots.stream_accuracy(lines, data.out / f"stream_{run.name}_{s.key}_{s.setting}.png".replace(
                "/", "_"), title, boundaries)
            if png is not None:
                body += f"<h3>{esc(s.key)} &mdash; {esc(run.name)}</h3>" + image(png, title)
    if not body:
        return None
    note = (f"<p>Runs recorded before streams were ({esc(', '.join(notes))}) have no stream order on disk and "
            "are not drawn.</p>") if notes else ""
    return ("stream", "Accuracy over the stream",
            "<p>Online methods remember earlier test images, so their accuracy depends on the order. Each "
            "figure shows an online method's cumulative top-1 accuracy after each image of the stream as the "
            "run evaluated it (its kind and seed are in run.json; docs/PROTOCOLS.md), beside the zero-shot "
            "reference of the same run over the same order.</p>" + note + body)


def orders_section(data: ReportData) -> Section | None:
    body = ""
    for run in data.runs:
        table_ = read_orders(run.path)
        if not table_ or not table_.get("methods"):
            continue
        methods = table_["methods"]
        ref = next((name for name in methods if name == "zeroshot"), None)
        rows = []
        for name, row in methods.items():
            wins = losses = 0
            p = float("nan")
            if ref is not None and name != ref and len(methods[ref]["top1"]) == len(row["top1"]):
                diffs = np.array(row["top1"]) - np.array(methods[ref]["top1"])
                wins, losses = int((diffs > 0).sum()), int((diffs < 0).sum())
                p, _ = mcnemar(wins, losses)
            rows.append([name, row["kind"], num(len(row["top1"]), 0), num(row["mean"]), num(row["std"]),
                         num(row["worst"]), num(row["eta"]),
                         f"{wins} / {losses}" if ref is not None and name != ref else "–",
                         Cell(fmt_p(p), "" if np.isnan(p) else repr(p))])
        png = plots.order_boxes({name: row["top1"] for name, row in methods.items()},
                                data.out / f"orders_{run.name}.png".replace("/", "_"),
                                f"Top-1 over {table_['orders']} stream orders ({run.name})")
        missing = table_.get("missing") or []
        body += (f"<h3>{esc(run.name)}</h3>"
                 + table(["method", "kind", "orders", "mean %", "std", "worst %", "ETA %",
                          "orders better / worse than zero-shot", "sign test p"], rows, text_cols=2)
                 + (f"<p>Orders not finished: {esc(', '.join(map(str, missing)))}.</p>" if missing else "")
                 + image(png, f"top-1 over {table_['orders']} stream orders"))
    if not body:
        return None
    return ("orders", "Stream orders",
            "<p><code>--orders K</code> runs the online methods over K seeded orders of the same images (episodic "
            "methods do not depend on the order: their one accuracy stands for every order). <b>ETA</b>, the "
            "Expected Tail Accuracy, is the mean of the worst 10 % of the orders (OGA's definition). The sign "
            "test counts the orders in which a method beats the zero-shot reference and those in which it loses "
            "(exact binomial, ties left out), the same test as the paired section's McNemar below 25 "
            "discordant pairs; order 0's images are also compared image by image in the paired section.</p>"
            + body)
