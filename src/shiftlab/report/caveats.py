"""The caveats a report page must carry above everything else: the warnings summary.md and suite.md
carry (random weights, runs cut short by --limit or stopped early, suites missing datasets) and the
methods whose numbers are not per-sample (transductive), each as one sentence.

A 4-image run with random weights must not read like a result: build.py puts these notes at the top
of report.html, before the navigation, in the page's warning style.
"""
from __future__ import annotations

from shiftlab.methods.catalogue import listing as catalogue
from shiftlab.report.data import ReportData
from shiftlab.report.load import Run
from shiftlab.results import sanity, suite_table
from shiftlab.results.display import is_random_weights

RANDOM_WEIGHTS = "RANDOM WEIGHTS: accuracies are meaningless"


def base_method(key: str) -> str:
    """'tda@pos_alpha=2' -> 'tda': the registered method a run's method key names."""
    return key.split("@", 1)[0]


def transductive(method: str) -> bool:
    """Whether `method` reads more than the current sample and its past (a batch's other samples, the
    whole test set): its spec's `Capabilities.reads_ahead` ("batch" for every batch method, "test_set"),
    i.e. it is not in the single-image block of the tables (shiftlab.methods.catalogue.listing.block); False for
    an unknown name. Read from the torch-free specs, so the report imports no torch."""
    return catalogue.block(base_method(method)) != catalogue.SINGLE_IMAGE


def run_partial_note(data: ReportData, run: Run) -> str:
    """suite.md's mark for one run ('partial: --limit 4', 'incomplete: 3 of 5 samples'), '' if whole."""
    # an open-set run's samples are its ID records (scored: n) and its OOD ones (no class: n_ood) together
    accounted = [int(data.m(s)["n"] + data.m(s)["errors"] + (data.m(s).get("n_ood") or 0))
                 for s in run.series if s.setting == "clean"]
    return suite_table.partial_mark(run.config, accounted)


def caveats(data: ReportData) -> list[str]:
    """Every caveat of the page, one sentence each, in the order they matter."""
    notes = []
    random = [r.name for r in data.runs if "pretrained" in r.config and is_random_weights(r.config["pretrained"])]
    if random:
        notes.append(f"{RANDOM_WEIGHTS} (run(s) {', '.join(random)} used random weights, --pretrained none).")
    for r in data.runs:
        mark = run_partial_note(data, r)
        if mark:
            notes.append(f"Not the whole dataset: {r.name} ({r.dataset}) is {mark}; its numbers are not "
                         "comparable with published ones.")
    for r in data.runs:
        lost = r.config.get("dataset_lost") or []
        if lost:
            notes.append(f"Samples lost: {r.name} ({r.dataset}) ran with --allow-partial on files that cannot "
                         f"deliver every sample ({len(lost)} problem(s), first: {lost[0]}); its numbers are not "
                         "comparable with published ones.")
    for t in data.suites:
        name = t.get("title") or t["suite"]
        if t["missing"]:
            notes.append(f"Incomplete suite {name}: no records yet for {', '.join(t['missing'])}; its averages "
                         "need every dataset and are left empty.")
        partial = t.get("partial") or {}
        if partial:
            notes.append(f"Suite {name} is not the whole of every dataset: "
                         + ", ".join(f"{suite_table.column_title(d)} ({m})" for d, m in partial.items())
                         + "; averages over them are not comparable with published numbers.")
    notes += sanity_notes(data)
    methods = sorted({s.method for s in data.series if transductive(s.method)})
    if methods:
        notes.append(f"Transductive: {', '.join(methods)} read(s) more than the current image and the images "
                     "before it (other test images of a batch or of the whole set); their numbers are not "
                     "comparable with per-image test-time adaptation.")
    return notes


def sanity_notes(data: ReportData) -> list[str]:
    """The failed sanity checks of the robust evaluations (shiftlab.results.sanity): each run's own
    (summary.json "sanity"), and those only runs together can show (robust accuracy rising with eps or
    steps across runs of one dataset, adaptive above transfer), one sentence each, without repeats."""
    found: list[str] = []
    by_dataset: dict[str, list[sanity.Point]] = {}
    for r in data.runs:
        found += [w.get("message", "") for w in r.summary.get("sanity") or [] if isinstance(w, dict)]
        by_dataset.setdefault(r.dataset, []).extend(sanity.points_of_summary(r.summary))
    for points in by_dataset.values():
        found += [w.message for w in sanity.check_points(points)]
    return [f"Sanity check failed: {m}" for m in dict.fromkeys(m for m in found if m)]

