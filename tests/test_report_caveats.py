"""report.html carries every caveat summary.md and suite.md carry (issue 34, finding 3), and its
accuracy axis stays readable on degenerate data (all scores 0, one point, equal costs, NaN)."""
from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest

from shiftlab.datasets import suites
from shiftlab.engine import suite as suite_runs
from shiftlab.report import caveats as caveats_mod
from shiftlab.report import plots
from shiftlab.report.build import build_report
from shiftlab.results.summary import summarize, summary_markdown


def write_run(run_dir: Path, dataset: str = "imagenet-r", pretrained: str | None = "openai",
              correct: dict[str, list[bool]] | None = None, **config) -> Path:
    """A run directory whose records and summary.json are those a run writes (summarize)."""
    correct = correct or {"zeroshot": [True, False, True, False], "tpt": [True, True, False, False]}
    run_dir.mkdir(parents=True)
    recs = []
    for method, oks in correct.items():
        for i, ok in enumerate(oks):
            recs.append({"id": i, "path": f"c{i % 3}/img_{i}.jpg", "label": i % 3, "method": method,
                         "setting": "clean", "pred": i % 3 if ok else (i + 1) % 3, "correct": ok,
                         "top5": [0, 1, 2], "confidence": 0.6, "true_prob": 0.5, "seconds": 0.01})
    (run_dir / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    run_config = {"model": "RN50", "pretrained": pretrained, "dataset": dataset, "classnames": ["a", "b", "c"],
                  **config}
    (run_dir / "summary.json").write_text(json.dumps(summarize(recs, run_config)))
    return run_dir


def caveat_notes(html: str) -> list[str]:
    """The text of each caveat; they all stand at the top of the page, before the navigation."""
    head, _, rest = html.partition("<nav>")
    assert 'class="warn caveat"' not in rest, "a caveat below the page's top"
    return re.findall(r'<div class="warn caveat"><b>Caveat:</b> (.*?)</div>', head)


def test_random_weights_are_a_caveat_on_the_page_as_in_summary_md(tmp_path):
    run = write_run(tmp_path / "rand", pretrained=None, limit=None, n_samples=4)
    md = summary_markdown(json.loads((run / "summary.json").read_text()))
    assert "RANDOM WEIGHTS: accuracies are meaningless" in md
    html = build_report([run], tmp_path / "out", n_resamples=10).read_text()
    notes = caveat_notes(html)
    assert len(notes) == 1 and notes[0].startswith("RANDOM WEIGHTS: accuracies are meaningless (run(s) rand")
    # real weights, the whole dataset: no caveat at all
    whole = write_run(tmp_path / "real", limit=None, n_samples=4)
    html = build_report([whole], tmp_path / "out2", n_resamples=10).read_text()
    assert caveat_notes(html) == [] and 'id="caveats"' not in html


def test_a_limited_and_a_stopped_run_are_caveats(tmp_path):
    limited = write_run(tmp_path / "lim", limit=4, n_samples=30000)
    stopped = write_run(tmp_path / "stop", dataset="imagenet-a", limit=None, n_samples=5)
    html = build_report([limited, stopped], tmp_path / "out", n_resamples=10).read_text()
    notes = caveat_notes(html)
    assert any("lim (imagenet-r) is partial: --limit 4" in n for n in notes), notes
    assert any("stop (imagenet-a) is incomplete: 4 of 5 samples" in n for n in notes), notes


def test_a_complete_open_set_run_is_not_called_incomplete(tmp_path):
    """Issue 40 case 3: every complete open-set run was marked "incomplete: 220 of 240 samples" (its 240 records
    per method are 220 ID + 20 OOD); its OOD records count as samples of the run."""
    run_dir = tmp_path / "open"
    run_dir.mkdir()
    recs = []
    for i in range(6):
        ood = i >= 4
        recs.append({"id": i, "path": f"c/img_{i}.jpg", "label": None if ood else i % 3, "method": "zeroshot",
                     "setting": "clean", "pred": i % 3, "correct": None if ood else True, "top5": [0, 1, 2],
                     "confidence": 0.6, "true_prob": None if ood else 0.5, "seconds": 0.01, "ood": ood,
                     "ood_score": 0.6 - 0.1 * ood})
    (run_dir / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    config = {"model": "RN50", "pretrained": "openai", "dataset": "imagenet-r", "classnames": ["a", "b", "c"],
              "limit": None, "n_samples": 6}
    (run_dir / "summary.json").write_text(json.dumps(summarize(recs, config)))
    html = build_report([run_dir], tmp_path / "out", n_resamples=10).read_text()
    assert not any("incomplete" in n for n in caveat_notes(html)), caveat_notes(html)
    # one OOD record short is still said
    (run_dir / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs[:-1]))
    html = build_report([run_dir], tmp_path / "out2", n_resamples=10).read_text()
    assert any("open (imagenet-r) is incomplete: 5 of 6 samples" in n for n in caveat_notes(html))


def test_summary_md_and_the_report_keep_the_blocks_apart_and_carry_the_caveats(tmp_path):
    """Issue 40 case 5: summary.md (the table `shiftlab run` prints) of a --limit run carried no partial mark and
    tabled a batch-transductive method with the single-image ones (only a footnote); the report's plots and
    paired table named it as any other method."""
    run = write_run(tmp_path / "lim", pretrained=None, limit=4, n_samples=30000, reads_ahead={"stata": "batch"},
                    correct={"zeroshot": [True, False, True, False], "tda": [True, True, False, False],
                             "stata": [False, True, True, True]})
    md = summary_markdown(json.loads((run / "summary.json").read_text()))
    title = md.splitlines()[0]
    assert "RANDOM WEIGHTS: accuracies are meaningless" in title
    assert "PARTIAL: --limit 4, not comparable with published numbers" in title
    single, _, batch = md.partition("**Batch-transductive methods")
    assert "| zeroshot |" in single and "| tda |" in single and "stata" not in single.split("**Single-image")[1]
    assert "| stata |" in batch and "| zeroshot |" not in batch
    html = build_report([run], tmp_path / "out", n_resamples=10).read_text()
    paired = re.search(r'<table[^>]*id="paired-table".*?</table>', html, re.S).group(0)
    assert "stata (batch-transductive)" in paired and "zeroshot (" not in paired
    metrics_csv = csv.DictReader((tmp_path / "out" / "metrics.csv").open())
    rows = {r["method"]: r["method_key"] for r in metrics_csv}
    assert rows == {"zeroshot": "zeroshot", "tda": "tda", "stata": "stata (batch-transductive)"}   # plot labels
    # suite.md says random weights as summary.md does
    suite_dir = tmp_path / "suite"
    suite_runs.write_manifest(suite_dir, suites.resolve_suite(None, "imagenet-r"),
                              {"methods": ["zeroshot"], "model": "RN50", "pretrained": None})
    write_run(suite_dir / "imagenet-r", pretrained=None, limit=None, n_samples=4)
    from shiftlab.results import suite_table
    table = suite_table.suite_table(suite_dir)
    assert "RANDOM WEIGHTS: accuracies are meaningless" in suite_table.table_markdown(table).splitlines()[0]


def test_suite_partial_columns_footnote_and_missing_datasets_reach_the_page(tmp_path):
    suite_dir = tmp_path / "two"
    suite = suites.resolve_suite(None, "imagenet-r,imagenet-a,imagenet-v2")
    suite_runs.write_manifest(suite_dir, suite, {"methods": ["zeroshot", "tpt"], "model": "RN50"})
    write_run(suite_dir / "imagenet-r", "imagenet-r", limit=4, n_samples=30000)
    write_run(suite_dir / "imagenet-a", "imagenet-a", limit=None, n_samples=4)
    # imagenet-v2 never started: the suite is incomplete
    html = build_report([suite_dir], tmp_path / "out", n_resamples=10).read_text()
    section = re.search(r'<section id="suite">.*?</section>', html, re.S).group(0)
    # suite.md's column mark and footnote
    assert "<th>-R (partial: --limit 4)</th>" in section and "<th>-A</th>" in section
    assert "not the whole dataset: -R (partial: --limit 4); averages over them are not comparable" in section
    notes = caveat_notes(html)
    assert any(n.startswith("Incomplete suite") and "no records yet for imagenet-v2" in n for n in notes), notes
    assert any("Suite" in n and "-R (partial: --limit 4)" in n for n in notes), notes


def test_transductive_methods_are_a_caveat(tmp_path, monkeypatch):
    from shiftlab.methods.catalogue.declarations import Capabilities, spec
    run = write_run(tmp_path / "run", limit=None, n_samples=4)
    html = build_report([run], tmp_path / "out0", n_resamples=10).read_text()
    assert not any("Transductive" in n for n in caveat_notes(html))
    monkeypatch.setattr(spec("tpt"), "capabilities", Capabilities(reads_ahead="test_set"))
    html = build_report([run], tmp_path / "out1", n_resamples=10).read_text()
    notes = [n for n in caveat_notes(html) if n.startswith("Transductive: tpt ")]
    assert len(notes) == 1 and "zeroshot" not in notes[0]
    # variants are their method; an unknown name is not transductive
    assert caveats_mod.transductive("tpt@lr=0.1") and not caveats_mod.transductive("zeroshot")
    assert not caveats_mod.transductive("no_such_method")
    assert caveats_mod.transductive("stata")   # StatA adapts on whole batches of test images (batches=True)
    # a method that adapts on a batch of test images together (the episodic-batch protocol) reads other images
    monkeypatch.setattr(spec("zeroshot"), "capabilities", Capabilities(batches=True))
    assert caveats_mod.transductive("zeroshot")


# ------------------------------------------------------------------ the accuracy-vs-cost axis

def test_accuracy_axis_of_all_zero_scores_is_not_minus_one_to_one():
    fig = plots.accuracy_vs_time_figure([("a", 0.1, 0.0, "r"), ("b", 0.3, 0.0, "r")])
    lo, hi = fig.axes[0].get_ylim()
    assert lo == 0.0 and hi == plots.MIN_ACCURACY_SPAN


@pytest.mark.parametrize("accs, limits", [
    ([0.0, 0.0], (0.0, 10.0)),
    ([100.0], (90.0, 100.0)),
    ([50.0, 50.0], (45.0, 55.0)),
    ([20.0, 70.0], (16.0, 74.0)),        # padded by 8 % of the 50-point range
    ([0.0, 100.0], (0.0, 100.0)),
])
def test_accuracy_limits(accs, limits):
    assert plots.accuracy_limits(accs) == pytest.approx(limits)


def test_one_point_equal_costs_and_nan_values_give_finite_axes():
    for points in ([("a", 0.2, 40.0, "r")],
                   [("a", 0.2, 40.0, "r"), ("b", 0.2, 60.0, "r")],
                   [("a", 0.2, 40.0, "r"), ("b", math.nan, 60.0, "r"), ("c", 0.1, math.nan, "r"),
                    ("d", math.inf, 10.0, "r"), ("e", 0.0, 10.0, "r")]):
        fig = plots.accuracy_vs_time_figure(points)
        ax = fig.axes[0]
        x_lo, x_hi = ax.get_xlim()
        y_lo, y_hi = ax.get_ylim()
        assert all(map(math.isfinite, (x_lo, x_hi, y_lo, y_hi)))
        assert 0 < x_lo < 0.2 / 1.2 and x_hi > 0.2 * 1.2 and 0 <= y_lo < 40 and y_hi <= 100
        assert len(ax.collections) == min(len(points), 2) if len(points) < 5 else len(ax.collections) == 1
    assert plots.accuracy_vs_time_figure([("a", math.nan, 1.0, "r"), ("b", 0.1, math.nan, "r")]) is None


def _robust_run(run_dir: Path, eps: float, robust_correct: list[bool]) -> Path:
    """A clean-and-robust run of zero-shot under apgd_ce at `eps`, with these robust verdicts."""
    run_dir.mkdir(parents=True)
    attack = {"name": "apgd_ce", "eps": eps, "norm": "Linf", "budget": eps, "threat": f"eps={round(eps * 255)}/255",
              "steps": 100}
    recs = []
    for setting, oks in (("clean", [True] * 4), ("apgd_ce", robust_correct)):
        for i, ok in enumerate(oks):
            rec = {"id": i, "path": f"c{i % 3}/img_{i}.jpg", "label": i % 3, "method": "zeroshot", "setting": setting,
                   "pred": i % 3 if ok else (i + 1) % 3, "correct": ok, "top5": [0, 1, 2], "confidence": 0.6,
                   "true_prob": 0.5, "seconds": 0.01}
            if setting != "clean":
                rec["attack"] = {"name": "apgd_ce", "threat": attack["threat"], "steps": 100, "norm": "Linf",
                                 "budget": eps, "flipped": not ok, "linf_255": round(eps * 255)}
            recs.append(rec)
    (run_dir / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    config = {"model": "RN50", "pretrained": "openai", "dataset": "imagenet-r", "classnames": ["a", "b", "c"],
              "limit": None, "n_samples": 4, "attack": attack, "clean_and_robust": True}
    (run_dir / "summary.json").write_text(json.dumps(summarize(recs, config)))
    return run_dir


@pytest.mark.slow
def test_robust_accuracy_rising_with_eps_across_runs_is_a_caveat(tmp_path):
    small = _robust_run(tmp_path / "eps1", 1 / 255, [True, False, False, False])    # 25%
    large = _robust_run(tmp_path / "eps4", 4 / 255, [True, True, False, False])     # 50%: must not rise
    html = build_report([small, large], tmp_path / "out", n_resamples=10).read_text()
    [note] = [n for n in caveat_notes(html) if n.startswith("Sanity check failed")]
    assert "zeroshot: robust top-1 under apgd_ce (transfer) rises from 25.00% to 50.00%" in note
    assert "eps=1/255 -&gt; eps=4/255" in note or "eps=1/255 -> eps=4/255" in note
    # falling with eps: no sanity caveat
    fine = _robust_run(tmp_path / "eps4b", 4 / 255, [False] * 4)
    html = build_report([small, fine], tmp_path / "out2", n_resamples=10).read_text()
    assert not [n for n in caveat_notes(html) if n.startswith("Sanity check failed")]


def test_a_transfer_attack_is_said_to_be_one_in_summary_md_and_the_report(tmp_path):
    # a "robust top-1" beside a test-time defense reads as its robustness; under the default target the attack
    # never saw the method's adaptation, and both outputs must say so (docs/ROBUSTNESS.md, threat model)
    run = _robust_run(tmp_path / "eps4", 4 / 255, [True, False, False, False])
    md = summary_markdown(json.loads((run / "summary.json").read_text()))
    assert ("robust top-1: transfer, the attack's images made against zero-shot CLIP and every method scored on "
            "them, its adaptation unseen by the attack (--attack-target adaptive or attack_target=\"adaptive\" attacks "
            "each method's own prediction)") in md
    html = build_report([run], tmp_path / "out", n_resamples=10).read_text()
    section = html[html.index('id="robust"'):]
    assert "Transfer settings (apgd_ce eps=4/255): the attack's images are made against zero-shot CLIP" in section
