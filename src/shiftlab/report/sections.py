"""The report's sections, in page order. Each returns (anchor, heading, HTML) or None to skip."""
from __future__ import annotations

import csv
import io
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from shiftlab import writes
from shiftlab.methods.catalogue import listing as catalogue
from shiftlab.report import plots
from shiftlab.report.data import ReportData, is_zeroshot, zeroshot_baseline
from shiftlab.report.html import REPORT_ADVICE, Cell, esc, fmt, fmt_p, image, num, signed, table, warnings_box
from shiftlab.report.stats import (
    RENDITIONS,
    known_rendition_share,
    per_class_accuracy,
    rendition_accuracy,
    top_confusions,
)
from shiftlab.report.streams import orders_section, stream_section
from shiftlab.results import metrics, suite_table
from shiftlab.results.display import model_label
from shiftlab.results.published import canonical_method, published_for_run
from shiftlab.rundir.records import is_adaptive

Section = tuple[str, str, str]   # (anchor, heading, HTML)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "x"


def _class_namer(series):
    names = next((s.run.classnames for s in series if s.run.classnames), None)
    return lambda i: names[i] if names and 0 <= i < len(names) else str(i)


def _n_classes(series) -> int:
    names = next((s.run.classnames for s in series if s.run.classnames), None) or []
    return max([len(names)] + [int(s.labels.max()) + 1 for s in series if s.n])


def _clean_by_dataset(data: ReportData) -> dict[str, list]:
    return {ds: g for (ds, setting), g in data.groups().items() if setting == "clean"}


def runs_section(data: ReportData) -> Section | None:
    rows, notes = [], []
    for r in data.runs:
        rows.append([r.name, r.label, str(r.path), ", ".join(sorted({s.key for s in r.series})),
                     ", ".join(sorted({s.setting_label for s in r.series})),
                     num(sum(s.n for s in r.series), 0), num(len(r.error_records), 0)])
        notes += [f"{r.name}: {w}" for w in r.warnings]
    return ("runs", "Runs", table(["run", "configuration", "directory", "methods", "settings",
                                   "prediction records", "error records"], rows, text_cols=5)
            + warnings_box(notes))


def results_section(data: ReportData) -> Section | None:
    brier = any(s.probs is not None for s in data.series)   # a column only where vectors were saved
    rows = []
    for s in data.series:
        m = data.m(s)
        rows.append([s.key, s.run.name, s.setting_label, num(m["top1"]), num(m["top5"]), num(m["ece"]),
                     num(m["nll"], 3), *([num(m["brier"], 4)] if brier else []), num(m["n"], 0),
                     num(m["errors"], 0), num(m["seconds_per_image"], 4)])
    note = (" Brier: the mean over samples of the squared distance between the probability vector and the "
            "one-hot label (0 to 2, lower is better), from the vectors saved with --save-probs." if brier else "")
    headers = ["method", "run", "setting", "top-1 %", "top-5 %", "ECE %", "NLL", *(["Brier"] if brier else []), "n",
               "errors", "s / image"]
    blocks = [catalogue.block(s.method) for s in data.series]
    html = table(headers, [r for r, b in zip(rows, blocks) if b == catalogue.SINGLE_IMAGE], text_cols=3,
                 id_="metrics-table")
    for block, label in catalogue.BLOCKS.items():   # the methods that read other test images: labelled, apart
        if block != catalogue.SINGLE_IMAGE and block in blocks:
            html += f"<h3>{esc(label)}</h3>" + table(headers, [r for r, b in zip(rows, blocks) if b == block],
                                                      text_cols=3, id_=f"metrics-table-{block}")
    return ("results", "Results", f"<p>Click a column header to sort.{note}</p>" + html)


def ood_section(data: ReportData) -> Section | None:
    """Open-set runs: each method's detection of the OOD samples by its OOD score (AUROC, FPR95, AUPR) beside its
    accuracy on the ID part, so the cost of OOD images to an online method's memory shows."""
    rows = []
    own = any(s.own_ood is not None for s in data.series if s.ood_scores is not None)
    for s in data.series:
        if s.ood_scores is None:
            continue
        m = data.m(s)
        mix = ((s.run.summary.get("identity") or {}).get("shared") or {}).get("open_set") or {}
        rows.append([s.key, s.run.name, ", ".join(mix.get("ood") or []) or "?", num(m["top1"]), num(m.get("auroc")),
                     num(m.get("fpr95")), num(m.get("aupr")), num(m["n"], 0), num(m.get("n_ood"), 0)])
        if own:
            o = s.own_ood or {}
            rows[-1] += [str(o.get("score", "")), num(o.get("auroc")), num(o.get("fpr95")),
                         num(o.get("aupr"))]
    if not rows:
        return None
    own_note = (" The last four columns score each method by its own OOD score where its paper defines one "
                "(named in the column), else by MCM's." if own else "")
    own_head = ["own OOD score", "AUROC (own) %", "FPR95 (own) %", "AUPR (own) %"] if own else []
    return ("ood", "Out-of-distribution detection", "<p>Open-set streams: ID top-1 on the in-distribution part; "
            "AUROC, FPR95 (the share of OOD images kept at the threshold keeping 95% of ID images) and AUPR (ID "
            "positive), in percent, by each method's maximum softmax probability (MCM), as CLIPTTA's "
            f"ood_metrics.py defines them (docs/PROTOCOLS.md).{own_note}</p>" + table(
                ["method", "run", "OOD sets", "ID top-1 %", "AUROC %", "FPR95 %", "AUPR %", "n ID", "n OOD",
                 *own_head], rows, text_cols=3, id_="ood-table"))


def sweep_section(data: ReportData) -> Section | None:
    """Each sweep run (`shiftlab sweep`: a sweep.json beside its records): top-1, ECE and n per grid point
    and method, from the point's records, with the method's own (published) setting marked."""
    import json
    body = ""
    for run in data.runs:
        path = Path(run.path) / "sweep.json"
        try:
            rows = json.loads(path.read_text())["rows"] if path.is_file() else []
        except (OSError, ValueError, KeyError, TypeError):
            rows = []
        clean = {s.method: s for s in run.series if s.setting == "clean"}
        cells = []
        for row in rows:
            s = clean.get(row.get("variant"))
            m = data.m(s) if s is not None else {}
            cells.append([str(row.get("point")) + (" *" if row.get("published") else ""), str(row.get("method")),
                          num(m.get("top1")), num(m.get("ece")), num(m.get("n"), 0),
                          ",".join(map(str, row.get("grids") or ["1"]))])
        if cells:
            body += f"<h3>{esc(run.name)}</h3>" + table(["point", "method", "top-1 %", "ECE %", "n", "grid"], cells,
                                                         text_cols=2)
    if not body:
        return None
    return ("sweep", "Sweeps", "<p>Every point of a hyperparameter grid, read from one pass over a feature "
            "store (each point's records are those of the method run with that setting). <code>*</code>: the "
            "method's own (published) setting; grid: which sweep(s) into the directory ran the point.</p>" + body)


def suite_section(data: ReportData) -> Section | None:
    """Each suite's table (datasets x methods, averages) with the papers' comparable rows below."""
    if not data.suites:
        return None
    body = ""
    for k, t in enumerate(data.suites):
        columns = suite_table.table_columns(t)
        partial = t.get("partial") or {}
        # the columns carry suite.md's marks ("(partial: --limit 4)"), and a note says what they mean
        headers = ["method", "source", *(suite_table.column_title(c) + (f" ({partial[c]})" if c in partial else "")
                                         for c in columns)]
        blocks = dict(catalogue.by_block(t["methods"]))
        rows = [[m, "ours (records.jsonl)", *[num(v) for v in suite_table.row_values(t, m)]]
                for m in blocks.get(catalogue.SINGLE_IMAGE, [])]
        published = suite_table.published_suite_rows(t)
        for row in published:
            values = {**row["values"], "average": row["average"], "ood_average": row["ood_average"]}
            rows.append([Cell(row["label"], cls="pub"), row["source_id"], *[num(values.get(c)) for c in columns]])
        body += (f"<h3>{esc(t['title'] or t['suite'])}: {esc(model_label(t.get('model'), t.get('pretrained')))}</h3>"
                 + table(headers, rows, text_cols=2, id_=f"suite-table-{k}"))
        # the methods that read other test images, each block in a labelled table of its own (catalogue.BLOCKS)
        for block, methods in blocks.items():
            if block != catalogue.SINGLE_IMAGE:
                body += f"<h4>{esc(catalogue.BLOCKS[block])}</h4>" + table(
                    headers, [[m, "ours (records.jsonl)", *[num(v) for v in suite_table.row_values(t, m)]]
                              for m in methods], text_cols=2, id_=f"suite-table-{k}-{block}")
        notes = []
        if partial:
            notes.append("not the whole dataset: " + ", ".join(f"{suite_table.column_title(d)} ({partial[d]})"
                                                               for d in partial)
                         + "; averages over them are not comparable with published numbers")
        if t["missing"]:
            notes.append("no records yet for " + ", ".join(t["missing"]) + ": averages need every dataset")
        if t.get("kind") == "corruption":
            notes.append(f"Top-1 of {t.get('base')} under each corruption (the mean over severities "
                         f"{', '.join(map(str, t['severities']))}); mCE: Hendrycks & Dietterich's mean corruption "
                         "error with zero-shot CLIP as the reference instead of AlexNet (100 = as many errors as "
                         "zero-shot CLIP; docs/PROTOCOLS.md)")
        if t["ood"]:
            notes.append("Average: all " + str(len(t["datasets"])) + " datasets; OOD Average: "
                         + ", ".join(suite_table.column_title(d) for d in t["ood"]) + " (as in TPT's Table 1)")
        if published:
            cited = dict.fromkeys((row["source_id"], row["source"]) for row in published)
            notes.append("Published rows (grey): " + "; ".join(f"{sid}: {c}" for sid, c in cited)
                         + ". An empty published cell (–) is a number not published or not verified from a "
                           "primary source; shiftlab never fills one in.")
            notes += [f"{row['label']}: {row['note']}" for row in published if row.get("note")]
        else:
            notes.append("No published row is comparable with this run: the papers' numbers are shown only for "
                         "CLIP RN50 / ViT-B/16 whose checkpoint's SHA-256 is OpenAI's or that was read, "
                         "content-verified, from open_clip's official Hugging Face repository, run with the `paper` "
                         "protocol (this run: " + f"weights sha256 {t.get('weights_sha256') or 'not recorded'}, "
                         f"source {t.get('weights_source') or 'unknown'}, "
                         f"protocol {t.get('protocol') or 'not recorded'}); see shiftlab/data/published_suites.json.")
        body += "".join(f"<p class=meta>{esc(n)}</p>" for n in notes)
    return ("suite", "Suite tables", "<p>Top-1 accuracy (%) per dataset (or per corruption), recomputed from each "
            "run's records.jsonl.</p>" + body)


PAIRED_HELP = """<p>Each row compares methods A and B on the <em>same</em> images (matched by sample id
and setting; samples either method failed on are left out). <b>A fixes</b>: images A gets right and
B wrong; <b>B fixes</b>: the reverse. Only these discordant images carry information about which
method is better. The <b>McNemar p-value</b> is the chance of a split at least this uneven if both
methods were equally good (exact binomial test below 25 discordant images, chi-square with
continuity correction, "cc", from 25 on). The <b>95% interval</b> of A&minus;B comes from a paired bootstrap
({n} resamples, seed {seed}). Many comparisons on one dataset make some small p-values likely by
chance, so the p-values of one dataset and setting are <b>Holm-corrected</b> together (family-wise
error rate 5%; "Holm p"). Read a gap as real only when the interval excludes 0 and the Holm p &lt; 0.05;
otherwise the methods are not distinguishable on this data, however large the gap looks. Every
method is compared with one reference (zero-shot unless <code>--reference</code> says otherwise);
<code>--pairs all</code> compares every pair.</p>"""


def paired_section(data: ReportData) -> Section | None:
    if not data.paired:
        return ("paired", "Paired comparison",
                "<p>No two methods share a dataset and setting: nothing to compare.</p>")
    rows = []
    for p in data.paired:
        verdict_cls = "good" if p.verdict.endswith("better") else ""
        rows.append([p.a, p.b, p.setting, num(p.n, 0), num(p.acc_a), num(p.acc_b), signed(p.diff),
                     Cell(f"[{fmt(p.ci_low)}, {fmt(p.ci_high)}]", repr(p.ci_low)), num(p.a_only, 0),
                     num(p.b_only, 0), Cell(fmt_p(p.p_value), repr(p.p_value)),
                     Cell(fmt_p(p.p_adjusted), repr(p.p_adjusted)), p.test,
                     Cell(p.verdict, cls=verdict_cls)])
    return ("paired", "Paired comparison",
            PAIRED_HELP.format(n=data.n_resamples, seed=data.seed) + table(
                ["A", "B", "setting", "n paired", "A top-1 %", "B top-1 %", "A − B (points)",
                 "95% CI of A − B", "A fixes", "B fixes", "McNemar p", "Holm p", "test", "reading"],
                rows, text_cols=3, id_="paired-table"))


def cost_section(data: ReportData) -> Section | None:
    clean = _clean_by_dataset(data)
    # a method keeps its colour in every figure; its runs (backbones) differ by marker shape
    methods = sorted({s.method for group in clean.values() for s in group})
    by_method = dict(zip(methods, plots.distinct_colors(len(methods))))
    colors = {s.key: by_method[s.method] for group in clean.values() for s in group}
    body = ""
    for dataset, group in clean.items():
        points = [(s.key, data.m(s)["seconds_per_image"], data.m(s)["top1"], s.run.name) for s in group]
        png = plots.accuracy_vs_time(points, data.out / f"accuracy_vs_time_{_slug(dataset)}.png",
                                     f"Accuracy vs. cost on {dataset} (clean images)", colors)
        if png is not None:
            body += f"<h3>{esc(dataset)}</h3>" + image(png, f"accuracy vs seconds per image on {dataset}")
    if not body:
        return None
    return ("cost", "Accuracy vs. cost", "<p>One figure per dataset (accuracies of different datasets are "
            "not on one scale). Up and to the left is better. Seconds per image from summary.json (mean of "
            "the records' timings when it is missing). Each point is numbered and named in the legend; one "
            "marker shape per run, one colour per method in every figure.</p>" + body)


def calibration_section(data: ReportData) -> Section | None:
    body = ("<p>Bars: accuracy of the samples in each confidence bin (15 equal-width bins); "
            "red: the gap to their mean confidence; grey strip: the number of samples in each bin. "
            "A calibrated method follows the diagonal; ECE is the sample-weighted mean gap, so a bin "
            "holding few samples barely counts.</p>")
    for (dataset, setting), group in data.groups().items():
        panels = [(s.key, s.confidence, s.correct, data.m(s)["ece"]) for s in group]
        png = plots.reliability_grid(panels, data.out / f"reliability_{_slug(dataset)}_{_slug(setting)}.png")
        if png is not None:
            body += (f"<h3>{esc(dataset)}, {esc(setting)}</h3>" + image(png, f"reliability {setting}")
                     + _bins_table(group, f"bins-{_slug(dataset)}-{_slug(setting)}"))
    return ("calibration", "Calibration", body)


def _bins_table(group, table_id: str) -> str:
    """Per confidence bin: samples, accuracy and mean confidence of each method (the diagram's data)."""
    rows = []
    per = {s.key: metrics.reliability_bins(s.confidence, s.correct) for s in group
           if s.n and not np.isnan(s.confidence).any()}
    if not per:
        return ""
    edges = next(iter(per.values()))
    for j, (lo, hi, *_) in enumerate(edges):
        row = [f"({lo:.3f}, {hi:.3f}]"]
        for bins in per.values():
            _, _, n, acc, conf = bins[j]
            row += [num(n, 0), num(100 * acc), num(100 * conf)]
        rows.append(row)
    headers = ["confidence bin"] + [f"{k} {h}" for k in per for h in ("n", "acc %", "conf %")]
    return ("<details><summary>Samples, accuracy and mean confidence per bin</summary>"
            + table(headers, rows, id_=table_id) + "</details>")


def robust_section(data: ReportData) -> Section | None:
    attacked = sorted({s.setting_label for s in data.series if s.setting != "clean"})
    if not attacked:
        return None
    # Only runs that were attacked: a run evaluated on clean images alone has no robust number,
    # and an empty bar beside its clean one would read as "robust accuracy 0".
    attacked_runs = {id(s.run) for s in data.series if s.setting != "clean"}
    keys = list(dict.fromkeys(s.key for s in data.series if id(s.run) in attacked_runs))
    top1 = {(s.key, s.setting_label): data.m(s)["top1"] for s in data.series}
    columns = {lab: [top1.get((k, lab), np.nan) for k in keys] for lab in ["clean", *attacked]}
    # an attack run both ways (--attack-target both): how much robust accuracy the transfer attack overstated
    paired = [lab for lab in attacked if f"{lab} adaptive" in columns]
    rows = []
    for i, k in enumerate(keys):
        row = [k, num(columns["clean"][i])]
        for lab in attacked:
            row += [num(columns[lab][i]), signed(columns[lab][i] - columns["clean"][i])]
        row += [signed(columns[lab][i] - columns[f"{lab} adaptive"][i]) for lab in paired]
        rows.append(row)
    headers = (["method", "clean top-1 %"] + [h for lab in attacked for h in (f"{lab} top-1 %", f"{lab} − clean")]
               + [f"{lab}: transfer − adaptive" for lab in paired])
    png = plots.grouped_bars(keys, columns, data.out / "clean_vs_robust.png", "Clean vs. robust accuracy")
    transfer = sorted({s.setting_label for s in data.series if s.setting != "clean" and not is_adaptive(s.setting)})
    said = (f" Transfer settings ({esc(', '.join(transfer))}): the attack's images are made against zero-shot CLIP "
            "and every method is scored on them, its adaptation unseen by the attack (an adaptive setting attacks "
            "each method's own prediction).") if transfer else ""
    return ("robust", "Clean vs. robust accuracy",
            f"<p>Robust accuracy: top-1 on the adversarial images of each attack setting.{said}</p>"
            + image(png, "clean vs robust accuracy") + table(headers, rows, id_="robust-table"))


def renditions_section(data: ReportData) -> Section | None:
    body = ""
    for dataset, group in _clean_by_dataset(data).items():
        group = [s for s in group if known_rendition_share(s) > 0.5]
        if not group:
            continue
        acc = {s.key: rendition_accuracy(s) for s in group}
        cols = [r for r in (*RENDITIONS, "other") if any(r in a for a in acc.values())]
        counts = Counter({r: max(a[r][0] for a in acc.values() if r in a) for r in cols})
        labels = [f"{r} ({counts[r]})" for r in cols]
        matrix = np.array([[acc[s.key].get(r, (0, np.nan))[1] for r in cols] for s in group])
        slug = _slug(dataset)
        body += f"<h3>{esc(dataset)}</h3>" + image(plots.heatmap(
            [s.key for s in group], labels, matrix, data.out / f"renditions_{slug}.png",
            "Top-1 accuracy (%) per rendition (images per rendition)"), "accuracy per rendition")
        delta_rows, deltas = [], []
        for s in group:
            base = None if is_zeroshot(s) else zeroshot_baseline(s, group)
            if base is not None:
                shared = np.intersect1d(s.ids, base.ids)
                mine, ref = rendition_accuracy(s, shared), rendition_accuracy(base, shared)
                deltas.append([mine[r][1] - ref[r][1] if r in mine and r in ref else np.nan for r in cols])
                delta_rows.append(f"{s.key} − {base.key}")
        if delta_rows:
            body += ("<p>Where test-time adaptation helps (blue) and hurts (red): top-1 difference "
                     "to zero-shot in points, on the images both predicted.</p>" + image(plots.heatmap(
                         delta_rows, labels, np.array(deltas), data.out / f"renditions_delta_{slug}.png",
                         "Top-1 difference to zero-shot (points)", diverging=True, value_fmt="{:+.1f}"),
                         "accuracy difference to zero-shot per rendition"))
        body += table(["rendition", *[s.key for s in group]],
                      [[lab, *[num(matrix[i, j]) for i in range(len(group))]] for j, lab in enumerate(labels)])
    return ("renditions", "Accuracy per rendition", body) if body else None


def published_section(data: ReportData) -> Section | None:
    rows, keys, ours, seed, paper = [], [], [], [], []
    for s in data.series:
        pub = published_for_run(s.run.summary).get(canonical_method(s.method) or "")
        if s.setting != "clean" or pub is None:
            continue
        m = data.m(s)
        rows.append([s.key, pub["label"], num(m["top1"]), num(pub["seed_leaderboard"]),
                     signed(m["top1"] - (pub["seed_leaderboard"] or np.nan)), num(pub["paper"]),
                     signed(m["top1"] - (pub["paper"] or np.nan)), num(m.get("ece20", np.nan)),
                     num(pub["paper_ece"])])
        keys.append(s.key)
        ours.append(m["top1"])
        seed.append(pub["seed_leaderboard"] or np.nan)
        paper.append(pub["paper"] or np.nan)
    if not rows:
        return None
    png = plots.grouped_bars(keys, {"ours": ours, "seed leaderboard (R-TPT paper)": seed,
                                    "original paper / README": paper},
                             data.out / "published.png", "Ours vs. published (CLIP RN50, ImageNet-R)")
    return ("published", "Ours vs. published numbers",
            "<p>Published top-1 for CLIP RN50 (OpenAI weights, identified by the checkpoint's SHA-256 or its "
            "verified Hugging Face hub source) on "
            "ImageNet-R, each beside runs of the protocol it was published with. The numbers ship with "
            "shiftlab as data (<code>shiftlab/results/published.py</code>, <code>published_rows</code>): "
            "the seed leaderboard is the R-TPT paper's table (Sheng et al., CVPR 2025), the paper / README "
            "column each method's own paper or repository README, the ECE column the C-TPT paper "
            "(Yoon et al., ICLR 2024).</p>" + image(png, "ours vs published") + table(
                ["method", "published as", "ours top-1 %", "seed leaderboard", "ours − leaderboard",
                 "paper / README", "ours − paper", "ours ECE % (20 bins)", "C-TPT paper ECE % (20 bins)"],
                rows, text_cols=2, id_="published-table"))


PER_CLASS_SHOWN = 10   # worst and best classes shown per dataset; the CSV holds every class


def per_class_rows(group: list, n_classes: int, name: Callable[[int], str]) -> tuple[list[str], list[list]]:
    """Header and one row per class with a sample: index, name, n, each series' accuracy (%)."""
    per = [per_class_accuracy(s, n_classes) for s in group]
    counts = np.max([c for c, _ in per], axis=0)
    rows = [[i, name(i), int(counts[i]), *[float(acc[i]) for _, acc in per]] for i in range(n_classes) if counts[i] > 0]
    return ["class", "name", "n", *[f"{s.key} %" for s in group]], rows


def per_class_section(data: ReportData) -> Section | None:
    body = ""
    for dataset, group in _clean_by_dataset(data).items():
        header, rows = per_class_rows(group, _n_classes(group), _class_namer(group))
        csv_name = f"per_class_{_slug(dataset)}.csv"
        write_rows_csv(data.out / csv_name, header, rows)
        note = ""
        if len(rows) > 2 * PER_CLASS_SHOWN:
            # ranked by the mean accuracy over the series, so that the worst and best classes are the same for all
            ranked = sorted(rows, key=lambda r: (float(np.nanmean(r[3:])), r[0]))
            rows = ranked[:PER_CLASS_SHOWN] + ranked[-PER_CLASS_SHOWN:]
            note = (f"<p class=meta>The {PER_CLASS_SHOWN} worst and {PER_CLASS_SHOWN} best of "
                    f"{len(ranked)} classes by mean accuracy over the methods; every class in "
                    f'<a href="{esc(csv_name)}">{esc(csv_name)}</a>.</p>')
        cells = [[num(r[0], 0), r[1], num(r[2], 0), *[num(v) for v in r[3:]]] for r in rows]
        body += (f"<h3>{esc(dataset)}</h3>" + note + "<div class=scroll>"
                 + table(header, cells, text_cols=2, id_=f"per-class-{_slug(dataset)}") + "</div>")
    return ("per-class", "Per-class accuracy (clean)",
            "<p>Click a header to sort (e.g. by a method's accuracy to find its worst classes).</p>"
            + body) if body else None


def write_rows_csv(path: Path, header: list[str], rows: list[list]) -> None:
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(rows)
    writes.write_file(path, buffer.getvalue(), REPORT_ADVICE)


def confusions_section(data: ReportData) -> Section | None:
    body = ""
    for dataset, group in _clean_by_dataset(data).items():
        name = _class_namer(group)
        n_classes = _n_classes(group)
        for s in group:
            counts = np.bincount(s.labels, minlength=n_classes)
            rows = [[name(t), name(p), num(c, 0), num(100.0 * c / counts[t], 1)]
                    for t, p, c in top_confusions(s, 20)]
            body += (f"<details><summary>{esc(s.key)} ({esc(dataset)}): {len(rows)} most confused pairs"
                     f"</summary>" + table(["true class", "predicted", "count", "% of true class"],
                                           rows, text_cols=2) + "</details>")
    return ("confusions", "Most confused class pairs (clean)", body) if body else None


def errors_section(data: ReportData) -> Section | None:
    body = ""
    for r in data.runs:
        if not r.error_records:
            continue
        by = Counter((str(e.get("setting") or "clean"), e.get("method") or "all methods (before any ran)")
                     for e in r.error_records)
        messages = Counter(str(e.get("error"))[:200] for e in r.error_records)
        body += (f"<h3>{esc(r.name)}: {len(r.error_records)} error record(s)</h3>"
                 + table(["setting", "method", "count"], [[s, m, num(c, 0)] for (s, m), c in sorted(by.items())],
                         text_cols=2)
                 + table(["most frequent messages", "count"],
                         [[msg, num(c, 0)] for msg, c in messages.most_common(10)], sortable=False))
    return ("errors", "Errors", body or "<p>No error records: every sample was predicted.</p>")


ALL = [runs_section, suite_section, sweep_section, results_section, ood_section, paired_section, published_section,
       cost_section, stream_section, orders_section, calibration_section, robust_section, renditions_section,
       per_class_section,
       confusions_section, errors_section]
