"""The HTML report over synthetic runs whose metrics are known by construction."""
from __future__ import annotations

import argparse
import csv
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from shiftlab.commands import report as report_cmd
from shiftlab.report.build import build_report
from shiftlab.report.load import ReportError
from shiftlab.report.stats import PairedResult, mcnemar, paired_bootstrap_ci, rendition_of
from shiftlab.results.published import OPENAI_RN50_SHA256, canonical_method, published_for, published_rows

RENDS = ["art", "cartoon", "deviantart", "embroidery", "graffiti", "graphic", "misc", "origami",
         "painting", "sculpture", "sketch", "sticker", "tattoo", "toy", "videogame"]
CLASSNAMES = ["goldfish", "great white shark", "hammerhead", "stingray", "hen"]
N = 50

# method -> setting -> (is sample i correct?, confidence). Known by hand:
#   zeroshot clean: even i -> 25/50 = 50.00 %, conf 0.5 -> ECE 0.00
#   tpt clean: i % 5 != 0 -> 40/50 = 80.00 %, conf 0.9 -> ECE |0.8 - 0.9| = 10.00
#   zeroshot pgd: i % 10 == 0 -> 10.00 %; tpt pgd: i % 4 == 0 -> 13/50 = 26.00 %
PATTERNS = {
    "zeroshot": {"clean": (lambda i: i % 2 == 0, 0.5), "pgd": (lambda i: i % 10 == 0, 0.3)},
    "tpt": {"clean": (lambda i: i % 5 != 0, 0.9), "pgd": (lambda i: i % 4 == 0, 0.6)},
}
TPT_NLL = -(0.8 * math.log(0.9) + 0.2 * math.log(0.05))


def write_run(run_dir: Path, model="RN50", patterns=PATTERNS, attack=True) -> Path:
    run_dir.mkdir(parents=True)
    lines = []
    for i in range(N):
        y = i % 5
        path = f"n0{y}/weird.jpg" if i == N - 1 else f"n0{y}/{RENDS[i % 15]}_{i}.jpg"
        for method, settings in patterns.items():
            for setting, (is_ok, conf) in settings.items():
                if setting != "clean" and not attack:
                    continue
                ok = bool(is_ok(i))
                pred = y if ok else (y + 1) % 5
                rec = {"id": i, "path": path, "label": y, "method": method, "setting": setting,
                       "pred": pred, "top5": [pred] + [c for c in range(5) if c != pred],
                       "confidence": conf, "true_prob": 0.9 if ok else 0.05, "correct": ok,
                       "seconds": 0.1}
                if setting != "clean":
                    rec["attack"] = {"name": "pgd", "eps": 1 / 255, "steps": 7, "flipped": not ok,
                                     "linf_255": 1}
                lines.append(json.dumps(rec))
    lines.append(json.dumps({"id": N, "path": "n00/broken.jpg", "label": 0, "method": None,
                             "setting": "clean", "error": "truncated JPEG: broken data stream"}))
    lines.append(json.dumps({"id": N + 1, "path": "n01/x.jpg", "label": 1, "method": "tpt",
                             "setting": "clean", "error": "RuntimeError: method raised"}))
    # A killed writer leaves a torn last line: the report must skip it, not crash.
    (run_dir / "records.jsonl").write_text("\n".join(lines) + '\n{"id": 7, "pat')
    summary = {"config": {"model": model, "pretrained": "openai", "dataset": "imagenet-r",
                          "classnames": CLASSNAMES, "checkpoint_sha256": OPENAI_RN50_SHA256},
               "methods": {"zeroshot": {"seconds_per_image": 0.01}, "tpt": {"seconds_per_image": 0.25}},
               "errors": 2}
    if attack:
        summary["attack"] = {"name": "pgd", "eps": 1 / 255, "steps": 7}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    run = write_run(root / "rn50run")
    html_path = build_report([run], root / "out", n_resamples=2000, seed=0)
    return root / "out", html_path.read_text()


def table_rows(html: str, table_id: str) -> list[str]:
    m = re.search(rf'<table id="{table_id}".*?</table>', html, re.S)
    assert m, f"table {table_id} missing"
    return m.group(0).split("<tr>")[2:]


def read_csv(path: Path) -> list[dict]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


# ------------------------------------------------------------------ small parts

def test_rendition_parsing():
    assert rendition_of("n01443537/art_3.jpg") == "art"
    assert rendition_of("imagenet-r/n01443537/videogame_12_x.png") == "videogame"
    assert rendition_of("n0/Sketch_1.jpg") == "sketch"
    assert rendition_of("n0/photo_1.jpg") == "other"
    assert rendition_of("n0/weird.jpg") == "other"
    assert rendition_of("") == "other"


def test_published_rows_only_for_rn50_imagenet_r():
    # (the weights are identified by the checkpoint's SHA-256, not by the tag or path: see test_published.py)
    sha = {"weights_sha256": OPENAI_RN50_SHA256}
    rows = published_rows("imagenet-r", "RN50", **sha)
    assert rows["tpt"]["seed_leaderboard"] == 58.9 and rows["tpt"]["paper"] == 59.11
    assert rows["ctpt"]["paper_ece"] == 4.57 and rows["zeroshot"]["paper_ece"] == 2.07
    assert rows["tda"]["seed_leaderboard"] is None and rows["tda"]["paper"] == 62.58
    assert published_rows("imagenet-r", "RN50-quickgelu", **sha) == rows
    assert published_rows("imagenet-r", "ViT-B-16", **sha) == {}
    assert published_rows("imagenet-a", "RN50", **sha) == {}
    assert published_rows("imagenet-r", "RN50", pretrained="yfcc15m") == {}
    assert published_rows("imagenet-r", "RN50", pretrained="/ckpt/RN50.pt", **sha) == rows
    assert canonical_method("C-TPT") == "ctpt" and canonical_method("view_ensemble") == "view_ensemble"
    assert published_for("zero", "imagenet-r", "RN50", **sha) is None
    rows["tpt"]["paper"] = 0.0  # callers get copies
    assert published_rows("imagenet-r", "RN50", **sha)["tpt"]["paper"] == 59.11


def test_mcnemar_exact_and_chi_square_against_scipy():
    stats = pytest.importorskip("scipy.stats")
    assert mcnemar(0, 0)[0] == 1.0
    assert mcnemar(0, 6) == (pytest.approx(2 / 64), "exact binomial")   # 2 * 0.5**6
    assert mcnemar(1, 9)[0] == pytest.approx(22 / 1024)                 # 2 * (1 + 10) / 2**10
    assert mcnemar(5, 5)[0] == 1.0
    for b, c in [(2, 10), (7, 3), (0, 24), (12, 12), (1, 1)]:
        p, test = mcnemar(b, c)
        assert test == "exact binomial"
        assert p == pytest.approx(stats.binomtest(b, b + c, 0.5).pvalue, rel=1e-12)
    for b, c in [(20, 5), (40, 60), (100, 100), (3, 30)]:
        p, test = mcnemar(b, c)
        assert test.startswith("chi-square")
        assert p == pytest.approx(stats.chi2.sf((abs(b - c) - 1) ** 2 / (b + c), 1), rel=1e-9)


def test_paired_bootstrap_ci():
    rng = np.random.default_rng(123)
    n = 4000
    a = rng.random(n) < 0.62   # true accuracies 62 % vs 57 %: true difference 5 points
    b = rng.random(n) < 0.57
    lo, hi = paired_bootstrap_ci(a, b, 2000, seed=0)
    observed = 100 * (a.mean() - b.mean())
    assert lo < observed < hi and lo < 5.0 < hi
    assert (lo, hi) == paired_bootstrap_ci(a, b, 2000, seed=0)      # deterministic
    assert (lo, hi) != paired_bootstrap_ci(a, b, 2000, seed=1)
    # The multinomial shortcut must match resampling indices, the textbook procedure.
    idx = np.random.default_rng(7).integers(0, n, size=(2000, n))
    naive = np.quantile(100 * (a[idx].mean(1) - b[idx].mean(1)), [0.025, 0.975])
    assert lo == pytest.approx(naive[0], abs=0.4) and hi == pytest.approx(naive[1], abs=0.4)
    assert paired_bootstrap_ci(a, a) == (0.0, 0.0)


def test_small_gap_is_not_read_as_a_win():
    # 1000 paired samples, A fixes 8 that B misses and B fixes 5: a 0.3-point gap.
    a = np.zeros(1000, dtype=bool)
    b = np.zeros(1000, dtype=bool)
    a[:500] = b[:500] = True
    a[500:508] = True
    b[600:605] = True
    p, test = mcnemar(8, 5)
    lo, hi = paired_bootstrap_ci(a, b)
    assert p > 0.05 and lo < 0 < hi
    result = PairedResult("A", "B", "clean", 1000, 50.8, 50.5, 8, 5, p, test, lo, hi)
    assert result.diff == pytest.approx(0.3) and result.verdict == "no clear difference"


# ------------------------------------------------------------------ the report

def test_report_files_and_pngs(built):
    from PIL import Image

    out, html = built
    assert (out / "report.html").is_file() and (out / "metrics.csv").is_file() and (out / "paired.csv").is_file()
    pngs = sorted(out.glob("*.png"))
    names = {p.name for p in pngs}
    assert {"accuracy_vs_time_imagenet_r.png", "clean_vs_robust.png", "published.png",
            "reliability_imagenet_r_clean.png", "renditions_imagenet_r.png",
            "renditions_delta_imagenet_r.png"} <= names
    for p in pngs:
        with Image.open(p) as im:
            im.verify()
    # Self-contained: every figure inlined, nothing fetched.
    assert html.count('src="data:image/png;base64,') == len(pngs)
    assert "http://" not in html and "https://" not in html


def test_report_numbers_in_html(built):
    _, html = built
    rows = table_rows(html, "metrics-table")
    tpt_clean = next(r for r in rows if ">tpt<" in r and ">clean<" in r)
    assert ">80.00<" in tpt_clean and ">10.00<" in tpt_clean and ">100.00<" in tpt_clean
    assert f">{TPT_NLL:.3f}<" in tpt_clean
    zs_clean = next(r for r in rows if ">zeroshot<" in r and ">clean<" in r)
    assert ">50.00<" in zs_clean and ">0.00<" in zs_clean
    tpt_pgd = next(r for r in rows if ">tpt<" in r and ">pgd eps=1/255<" in r)
    assert ">26.00<" in tpt_pgd
    # Clean vs robust, published numbers beside ours, per-class names, errors shown.
    assert ">26.00<" in next(r for r in table_rows(html, "robust-table") if ">tpt<" in r)
    pub = next(r for r in table_rows(html, "published-table") if ">tpt<" in r)
    # a leaderboard run (no protocol recorded: before protocols) is compared with the seed table only
    assert ">80.00<" in pub and ">58.90<" in pub and ">+21.10<" in pub and ">59.11<" not in pub
    per_class = table_rows(html, "per-class-imagenet_r")
    assert len(per_class) == 5 and ">great white shark<" in per_class[1]
    assert ">goldfish<" in html and "most confused pairs" in html
    assert "truncated JPEG: broken data stream" in html and "2 error record(s)" in html
    assert "unreadable or incomplete line" in html


def test_report_csv_values(built):
    out, _ = built
    rows = {(r["method"], r["setting"]): r for r in read_csv(out / "metrics.csv")}
    assert len(rows) == 4
    tpt = rows[("tpt", "clean")]
    assert float(tpt["top1"]) == pytest.approx(80.0) and float(tpt["top5"]) == pytest.approx(100.0)
    assert float(tpt["ece"]) == pytest.approx(10.0) and float(tpt["nll"]) == pytest.approx(TPT_NLL)
    assert int(tpt["n"]) == 50 and int(tpt["errors"]) == 2   # its own error + the decode error
    assert float(tpt["seconds_per_image"]) == pytest.approx(0.25)
    assert tpt["run_label"] == "RN50 (openai) on imagenet-r, attack pgd eps=1/255"
    zs = rows[("zeroshot", "clean")]
    assert float(zs["top1"]) == pytest.approx(50.0) and int(zs["errors"]) == 1
    pgd = rows[("zeroshot", "pgd")]
    assert float(pgd["top1"]) == pytest.approx(10.0) and pgd["setting_label"] == "pgd eps=1/255"
    assert float(pgd["attack_eps"]) == pytest.approx(1 / 255)


def test_report_paired_comparison(built):
    out, html = built
    rows = {r["setting"]: r for r in read_csv(out / "paired.csv")}
    clean = rows["clean"]
    assert (clean["a"], clean["b"]) == ("tpt", "zeroshot")       # zero-shot is the baseline side
    # tpt right & zeroshot wrong: odd i not divisible by 5 (20); the reverse: i in {0,10,20,30,40} (5).
    assert (int(clean["a_only"]), int(clean["b_only"]), int(clean["n"])) == (20, 5, 50)
    assert float(clean["p_value"]) == pytest.approx(math.erfc(math.sqrt((15 - 1) ** 2 / 25 / 2)), rel=1e-6)
    assert float(clean["diff"]) == pytest.approx(30.0)
    assert float(clean["ci_low"]) < 30.0 < float(clean["ci_high"])
    robust = rows["pgd eps=1/255"]
    # tpt right on i % 4 == 0 (13), zeroshot on i % 10 == 0 (5), both on i % 20 == 0 (3).
    assert (int(robust["a_only"]), int(robust["b_only"])) == (10, 2)
    assert robust["test"] == "exact binomial"
    assert float(robust["p_value"]) == pytest.approx(2 * (1 + 12 + 66) / 2 ** 12, rel=1e-6)
    assert clean["verdict"] == robust["verdict"] == "tpt better"
    paired_rows = table_rows(html, "paired-table")
    assert any(">+30.00<" in r and ">20<" in r and ">5<" in r for r in paired_rows)


def _cli(argv) -> int:
    parser = argparse.ArgumentParser(prog="shiftlab")
    report_cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.mark.slow
def test_two_runs_same_method_are_disambiguated_and_compare_flag(tmp_path):
    a = write_run(tmp_path / "rn50run")
    b = write_run(tmp_path / "vitrun", model="ViT-B-16", attack=False,
                  patterns={"tpt": PATTERNS["tpt"], "mta": {"clean": (lambda i: i % 3 != 0, 0.8)}})
    out = tmp_path / "out"
    assert _cli(["report", str(a), str(b), "--out", str(out), "--compare", "mta,zeroshot",
                 "--bootstrap", "200", "--pairs", "reference"]) == 0
    keys = {r["method_key"] for r in read_csv(out / "metrics.csv")}
    # Several runs: every key names its run, not only the keys two runs share (a key without its run is ambiguous).
    assert keys == {"tpt [rn50run]", "tpt [vitrun]", "zeroshot [rn50run]", "mta [vitrun]"}
    pairs = {(r["a"], r["b"], r["setting"]) for r in read_csv(out / "paired.csv")}
    assert ("mta [vitrun]", "zeroshot [rn50run]", "clean") in pairs         # asked for with --compare
    assert ("tpt [rn50run]", "zeroshot [rn50run]", "clean") in pairs        # same-run zero-shot baseline
    html = (out / "report.html").read_text()
    assert "ViT-B-16 (openai) on imagenet-r" in html
    # Published numbers only beside the RN50 run's methods.
    assert not any("vitrun" in r for r in table_rows(html, "published-table"))
    # The never-attacked run has no place in the clean-vs-robust table: it has no robust number.
    robust = table_rows(html, "robust-table")
    assert len(robust) == 2 and not any("vitrun" in r for r in robust)
    assert any("tpt [rn50run]" in r and ">26.00<" in r for r in robust)


def test_a_report_folder_holds_only_the_current_reports_files(tmp_path):
    """A report written into a folder that holds an earlier report removes the earlier report's
    files it does not write again (plots of settings no longer there), never a user's file."""
    out = tmp_path / "out"
    build_report([write_run(tmp_path / "attacked")], out, n_resamples=200)
    first = {p.name for p in out.iterdir()}
    assert "clean_vs_robust.png" in first and ".shiftlab_report.json" in first
    (out / "notes.txt").write_text("mine")
    (out / "my_plot.png").write_bytes(b"mine")
    clean_only = write_run(tmp_path / "clean_only", attack=False)
    build_report([clean_only], out, n_resamples=200)
    now = {p.name for p in out.iterdir()}
    listed = set(json.loads((out / ".shiftlab_report.json").read_text())["files"])
    assert "clean_vs_robust.png" not in now and not any("robust" in n or "eps" in n for n in now)
    assert {"notes.txt", "my_plot.png"} <= now and (out / "notes.txt").read_text() == "mine"
    assert now == listed | {"notes.txt", "my_plot.png", ".shiftlab_report.json"}
    html = (out / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') == len([n for n in listed if n.endswith(".png")])
    # a folder written before the manifest existed: the report's own file names only
    (out / ".shiftlab_report.json").unlink()
    (out / "reliability_imagenet_r_old.png").write_bytes(b"stale")
    build_report([clean_only], out, n_resamples=200)
    now = {p.name for p in out.iterdir()}
    assert "reliability_imagenet_r_old.png" not in now and {"notes.txt", "my_plot.png"} <= now
    # a damaged manifest cannot reach outside the folder
    (tmp_path / "outside.txt").write_text("keep")
    (out / ".shiftlab_report.json").write_text(json.dumps({"files": ["../outside.txt", "/etc/hostname"]}))
    build_report([clean_only], out, n_resamples=200)
    assert (tmp_path / "outside.txt").read_text() == "keep"


def test_missing_records_is_a_clear_error(tmp_path, capsys):
    empty = tmp_path / "not_a_run"
    empty.mkdir()
    with pytest.raises(ReportError, match=re.escape(str(empty / "records.jsonl"))):
        build_report([empty], tmp_path / "out")
    assert _cli(["report", str(empty), "--out", str(tmp_path / "out")]) == 2
    assert str(empty / "records.jsonl") in capsys.readouterr().err
    run = write_run(tmp_path / "run")
    assert _cli(["report", str(run), "--out", str(tmp_path / "o2"), "--compare", "nope,tpt"]) == 2


@pytest.mark.parametrize("seed", ["-1", str(2 ** 64)])
def test_a_bootstrap_seed_no_generator_takes_is_refused_in_one_line(tmp_path, capsys, seed):
    """`--seed -1` used to end in numpy's traceback ("expected non-negative integer") after the runs were read."""
    with pytest.raises(SystemExit) as info:
        _cli(["report", str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--seed", seed])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err     # this bare parser prints its usage above the line
    assert "argument --seed: must be between 0 and 18446744073709551615" in err.strip().splitlines()[-1]
    assert not (tmp_path / "out").exists()


def test_an_out_that_is_a_file_is_refused_in_one_line(tmp_path, capsys):
    """It ended in "OUT: File exists (then run shiftlab report again)", which says neither what is wrong nor what to
    do."""
    out = tmp_path / "report.html"
    out.write_text("mine")
    assert _cli(["report", str(write_run(tmp_path / "run")), "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"error: --out {out} is a file, not a folder; give a folder for the report\n"
    assert out.read_text() == "mine"


def test_page_renders_in_headless_chromium_without_js_errors(built, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium not on PATH (system package: apt-get install chromium); "
                    "skipping the headless rendering check")
    out, _ = built
    proc = subprocess.run(
        [browser, "--headless", "--disable-gpu", "--no-sandbox", "--enable-logging=stderr", "--v=0",
         f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", (out / "report.html").as_uri()],
        capture_output=True, text=True, timeout=90)
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    assert not [line for line in console if "Uncaught" in line or "Error" in line], console
    # The sorting script ran to its end on every sortable table.
    assert proc.stdout.count('data-sortable="ready"') == proc.stdout.count('class="sortable"') > 0


# ------------------------------------------------------- what a new user reads first

def test_published_section_cites_data_inside_the_package(built):
    _, html = built
    section = re.search(r'<section id="published">.*?</section>', html, re.S).group(0)
    assert "PROTOCOL.md" not in html
    assert "shiftlab/results/published.py" in section and "R-TPT paper" in section


def test_reliability_diagrams_show_samples_per_bin(built):
    from shiftlab.report.plots import reliability_figure

    _, html = built
    rows = table_rows(html, "bins-imagenet_r-clean")
    assert len(rows) == 15
    # Columns: bin, then (n, acc %, conf %) per method. tpt: conf 0.9 for all 50 clean samples ->
    # bin 13 (0.867, 0.933]; zeroshot: 0.5 -> bin 7 (0.467, 0.533]; every other bin holds 0.
    cells = [re.findall(r">([^<]*)</td>", r) for r in rows]
    header = re.search(r'<table id="bins-imagenet_r-clean".*?</thead>', html, re.S).group(0)
    assert header.index("tpt n") < header.index("zeroshot n")
    assert [c[1] for c in cells] == ["50" if j == 13 else "0" for j in range(15)]
    assert [c[4] for c in cells] == ["50" if j == 7 else "0" for j in range(15)]
    assert cells[13][:4] == ["(0.867, 0.933]", "50", "80.00", "90.00"]
    conf = np.r_[np.full(3, 0.15), np.full(40, 0.95)]
    fig = reliability_figure([("m", conf, conf > 0.5, 1.0)])
    counts_axes = fig.axes[1]
    assert sorted(t.get_text() for t in counts_axes.texts) == ["3", "40"]
    assert "n=43" in fig.axes[0].get_title()


def test_cost_chart_names_points_in_a_legend_with_several_ticks():
    from shiftlab.report.plots import accuracy_vs_time_figure, log_ticks

    # The demo's timings: five methods within half a decade, two of them 2% apart.
    points = [("zeroshot [demo]", 0.52, 0.0, "demo"), ("mta [demo]", 0.66, 0.0, "demo"),
              ("tpt [demo]", 2.06, 0.0, "demo"), ("tpt [run3]", 2.34, 0.0, "run3"),
              ("rtpt [demo]", 2.43, 0.0, "demo")]
    fig = accuracy_vs_time_figure(points)
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
    assert len(ticks) >= 3
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [f"{i}  {p[0]}" for i, p in
                                                                     enumerate(points, start=1)]
    assert [t.get_text() for t in ax.texts] == ["1", "2", "3", "4", "5"]   # numbers only beside points
    assert log_ticks(0.3, 0.9) == pytest.approx([0.3, 0.5, 0.7])
    assert log_ticks(0.01, 10)[:3] == pytest.approx([0.01, 0.02, 0.05])


@pytest.mark.slow
def test_run_headers_and_eps_read_the_same_in_summary_md_and_report(tmp_path):
    from shiftlab.results.display import format_eps, model_label, run_label
    from shiftlab.results.summary import summary_markdown

    assert model_label("RN50", "/path/to/x.pt") == "RN50 (checkpoint x.pt)"
    assert model_label("shiftlab-tiny", None) == "shiftlab-tiny (random weights)"
    assert model_label("shiftlab-tiny (random weights)", None) == "shiftlab-tiny (random weights)"
    assert format_eps(4 / 255) == "eps=4/255" and format_eps(0.01) == "eps=0.01" and format_eps(None) == ""
    summary = {"config": {"dataset": "imagenet-r", "model": "RN50", "pretrained": "/path/to/x.pt"},
               "methods": {"tpt": {"top1": 1.0, "n": 1, "robust": {"top1": 0.0}}}, "errors": 0,
               "attack": {"name": "pgd", "eps": 4 / 255, "steps": 7, "success_rate": 50.0}}
    md = summary_markdown(summary)
    assert md.startswith("### imagenet-r · RN50 (checkpoint x.pt)\n") and "//" not in md
    assert "attack pgd eps=4/255 steps=7" in md and "0.0156" not in md
    random_md = summary_markdown({**summary, "config": {"dataset": "imagenet-r", "model": "shiftlab-tiny",
                                                        "pretrained": None}})
    assert "shiftlab-tiny (random weights) · RANDOM WEIGHTS" in random_md and "None" not in random_md
    run = write_run(tmp_path / "r")
    cfg = json.loads((run / "summary.json").read_text())
    cfg["config"]["pretrained"] = "/path/to/x.pt"
    cfg["attack"]["eps"] = 4 / 255
    (run / "summary.json").write_text(json.dumps(cfg))
    html = build_report([run], tmp_path / "out", n_resamples=10).read_text()
    label = run_label("RN50", "/path/to/x.pt", "imagenet-r", {"name": "pgd", "eps": 4 / 255})
    assert label == "RN50 (checkpoint x.pt) on imagenet-r, attack pgd eps=4/255" and label in html


def test_report_modules_import_no_cycle():
    import ast

    package = Path(__file__).resolve().parents[1] / "src" / "shiftlab" / "report"
    graph = {}
    for path in package.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("shiftlab.report"):
                deps |= ({node.module.split(".")[2]} if node.module.count(".") >= 2
                         else {a.name for a in node.names})
        graph[path.stem] = deps - {path.stem}
    assert graph["sections"] and "build" not in graph["sections"]

    def reaches(start, target, seen=()):
        return any(d == target or (d not in seen and reaches(d, target, (*seen, d))) for d in graph.get(start, ()))
    cycles = [m for m in graph if m != "__init__" and reaches(m, m)]
    assert not cycles, cycles


# ------------------------------------------------------------------ ten methods, five datasets

def test_holm_adjustment_by_hand():
    from shiftlab.report.stats import holm
    # sorted: 0.005 x4 = 0.02, 0.01 x3 = 0.03, 0.03 x2 = 0.06, 0.04 x1 = 0.04 -> kept at the running max 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0]) and holm([]) == []


def write_many(run_dir: Path, dataset: str, methods: list[str], n: int = 60, n_classes: int = 30) -> Path:
    """A run of `methods` on `dataset`: method k is right on sample i when (i * (k + 3)) % 7 > k % 4."""
    run_dir.mkdir(parents=True)
    lines = []
    for i in range(n):
        y = i % n_classes
        for k, method in enumerate(methods):
            ok = (i * (k + 3)) % 7 > k % 4
            pred = y if ok else (y + 1) % n_classes
            lines.append(json.dumps({"id": i, "path": f"c{y}/{i}.jpg", "label": y, "method": method,
                                     "setting": "clean", "pred": pred, "top5": [pred], "confidence": 0.6,
                                     "true_prob": 0.6 if ok else 0.01, "correct": ok, "seconds": 0.1}))
    (run_dir / "records.jsonl").write_text("\n".join(lines) + "\n")
    summary = {"config": {"model": "RN50", "pretrained": "openai", "dataset": dataset,
                          "classnames": [f"class {c}" for c in range(n_classes)]},
               "methods": {m: {"seconds_per_image": 0.1 * (1 + k % 3)} for k, m in enumerate(methods)},
               "errors": 0}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


TEN = ["zeroshot", "prompt_ensemble", "view_ensemble", "tpt", "ctpt", "rtpt", "mta", "zero", "tda", "dmn_zs"]
FIVE = ["imagenet-r", "imagenet-a", "imagenet-v2", "imagenet-sketch", "imagenet"]


@pytest.fixture(scope="module")
def big_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("big")
    runs = [write_many(root / ds, ds, TEN) for ds in FIVE]
    html = build_report(runs, root / "out", n_resamples=200, seed=0).read_text()
    return root, runs, html


@pytest.mark.slow
def test_ten_methods_five_datasets_compare_with_one_reference_holm_corrected(big_report):
    root, runs, html = big_report
    rows = read_csv(root / "out" / "paired.csv")
    assert len(rows) == 9 * 5 and {r["b"].split(" ")[0] for r in rows} == {"zeroshot"}   # not 225 rows of all pairs
    from shiftlab.report.stats import holm
    for ds in FIVE:
        family = [r for r in rows if r["dataset"] == ds]
        want = holm([float(r["p_value"]) for r in family])
        assert [float(r["p_holm"]) for r in family] == pytest.approx(want)
    assert "Holm" in html and len(table_rows(html, "paired-table")) == 45
    build_report(runs[:1], root / "all", n_resamples=50, pairs="all")
    assert len(read_csv(root / "all" / "paired.csv")) == 45                 # C(10, 2) on request
    build_report(runs[:1], root / "mta", n_resamples=50, reference="mta")
    assert {r["b"] for r in read_csv(root / "mta" / "paired.csv")} == {"mta"}   # one run: plain keys
    from shiftlab.report.load import ReportError
    with pytest.raises(ReportError, match="^reference: no method 'nope'"):
        build_report(runs[:1], root / "x", reference="nope")
    from shiftlab.options import speaking_cli
    with speaking_cli(), pytest.raises(ReportError, match="^--reference: no method 'nope'"):
        build_report(runs[:1], root / "x", reference="nope")


@pytest.mark.slow
def test_ten_methods_get_ten_colours_and_one_cost_figure_per_dataset(big_report):
    from matplotlib.colors import to_hex

    from shiftlab.report.plots import accuracy_vs_time_figure, distinct_colors
    root, _, html = big_report
    assert {f"accuracy_vs_time_{ds.replace('-', '_')}.png" for ds in FIVE} <= {p.name for p in (root / "out").iterdir()}
    for n in (3, 10, 14, 37):
        assert len({to_hex(c) for c in distinct_colors(n)}) == n
    points = [(m, 0.1 * (1 + k % 3), 50.0 + k, "run") for k, m in enumerate(TEN)]
    fig = accuracy_vs_time_figure(points)
    colours = [to_hex(c.get_facecolor()[0]) for c in fig.axes[0].collections]
    assert len(set(colours)) == 10
    # coincident points share one label listing their numbers
    fig = accuracy_vs_time_figure([("a", 1.0, 50.0, "r"), ("b", 1.0, 50.0, "r"), ("c", 2.0, 60.0, "r")])
    assert [t.get_text() for t in fig.axes[0].texts] == ["1,2", "3"]


@pytest.mark.slow
def test_per_class_tables_show_the_worst_and_best_classes_and_the_csv_all(big_report):
    root, _, html = big_report
    shown = table_rows(html, "per-class-imagenet_r")
    assert len(shown) == 20 and "10 worst and 10 best of 30 classes" in html
    full = read_csv(root / "out" / "per_class_imagenet_r.csv")
    cols = [f"{m} [imagenet-r] %" for m in TEN]
    assert len(full) == 30 and set(full[0]) == {"class", "name", "n", *cols}
    means = sorted((np.mean([float(r[c]) for c in cols]), int(r["class"])) for r in full)
    worst = means[0][1]
    assert f">class {worst}<" in shown[0]
