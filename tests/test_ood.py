"""Open-set runs: the OOD metrics against scikit-learn on the same scores, the ID + OOD mix, the records of OOD
samples, a run that writes AUROC/FPR95/AUPR for every registered method, the report's table and resume refusals."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import shiftlab
from _imports import lazy_module
from _synthetic import make_imagenet_r, random_image
from shiftlab.cli import main as cli_main
from shiftlab.datasets import DatasetError, build_dataset
from shiftlab.datasets.openset import OpenSetDataset
from shiftlab.methods.catalogue.declarations import spec
from shiftlab.results.ood import aupr_in, auroc, fpr_at_tpr, ood_metrics
from shiftlab.rundir import record_files
from shiftlab.rundir.records import check_record

skm = lazy_module("sklearn.metrics")   # imported by the first test that reads it (collection stays fast)


def _fpr95_reference(xin, xood):
    """FPR at TPR 95% as CLIPTTA reads it: scikit-learn's ROC curve, linearly interpolated at TPR = 0.95
    (scipy's interp1d semantics: the segment whose right end is the first point at or above 0.95)."""
    from scipy import interpolate
    labels = [1] * len(xin) + [0] * len(xood)
    fpr, tpr, _ = skm.roc_curve(labels, np.concatenate([xin, xood]))
    return float(interpolate.interp1d(tpr, fpr)(0.95))


CASES = [  # (n_id, n_ood, ties): 0.95 * n_id integer (20, 40) and not (37), scores with and without ties
    (20, 13, False), (37, 50, False), (40, 40, True), (7, 3, True), (200, 90, False)]


@pytest.mark.parametrize("n_id,n_ood,ties", CASES)
def test_metrics_equal_scikit_learn_on_the_same_scores(n_id, n_ood, ties):
    rng = np.random.default_rng(n_id * 100 + n_ood)
    xin, xood = rng.normal(1.0, 1.0, n_id), rng.normal(0.0, 1.0, n_ood)
    if ties:
        xin, xood = np.round(xin * 2) / 2, np.round(xood * 2) / 2
    labels = np.r_[np.ones(n_id), np.zeros(n_ood)]
    scores = np.r_[xin, xood]
    assert auroc(xin, xood) == pytest.approx(100 * skm.roc_auc_score(labels, scores), abs=1e-9)
    assert aupr_in(xin, xood) == pytest.approx(100 * skm.average_precision_score(labels, scores), abs=1e-9)
    assert fpr_at_tpr(xin, xood) == pytest.approx(100 * _fpr95_reference(xin, xood), abs=1e-9)
    m = ood_metrics(xin, xood)
    assert (m["n_id"], m["n_ood"]) == (n_id, n_ood) and m["auroc"] == auroc(xin, xood)


def test_metrics_at_the_extremes():
    assert auroc([3, 4], [1, 2]) == 100 and fpr_at_tpr([3, 4], [1, 2]) == 0 and aupr_in([3, 4], [1, 2]) == 100
    assert auroc([1, 2], [3, 4]) == 0 and fpr_at_tpr([1, 2], [3, 4]) == 100
    assert auroc([1, 1], [1, 1]) == 50
    assert np.isnan(auroc([], [1.0])) and np.isnan(fpr_at_tpr([1.0], []))


def test_detection_without_ood_or_id_samples_is_null_with_the_reason_never_a_bare_nan(tmp_path):
    """Issue 40, 21: only ID (or only OOD) samples wrote `"auroc": NaN` into summary.json, which is not JSON."""
    from shiftlab.results.summary import summarize, write_summary
    base = {"setting": "clean", "method": "zeroshot", "pred": 1, "top5": [1, 0], "confidence": 0.6, "seconds": 0.1,
            "ood_score": 0.6}
    only_id = [{**base, "id": i, "path": f"a{i}.png", "label": 1, "true_prob": 0.6, "correct": True, "ood": False}
               for i in range(3)]
    only_ood = [{**base, "id": i, "path": f"o{i}.png", "label": None, "true_prob": None, "correct": None, "ood": True}
                for i in range(2)]
    for recs, missing in ((only_id, "no OOD samples"), (only_ood, "no in-distribution samples")):
        write_summary(tmp_path, summarize(recs, {"dataset": "imagenet-r"}))
        text = (tmp_path / "summary.json").read_text()
        strict = json.loads(text, parse_constant=lambda c: pytest.fail(f"summary.json holds a bare {c}"))
        ood = strict["methods"]["zeroshot"]["ood"]
        assert (ood["auroc"], ood["fpr95"], ood["aupr"]) == (None, None, None) and missing in ood["undefined"]


# ------------------------------------------------------------------ the mix

def _ood_folder(root: Path, name: str, n: int, seed: int) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    for k in range(n):
        random_image((40, 32), seed + k).save(folder / f"x{k}.png")
    return folder


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("openset")
    make_imagenet_r(root, classes=range(0, 200, 40), size=(48, 40))                  # 5 ID images
    _ood_folder(root / "iNaturalist", "images", 6, 500)                              # MCM's layout
    _ood_folder(root / "NINCO" / "NINCO_OOD_classes", "some_class", 4, 700)        # NINCO's
    return root


def test_open_set_mix_is_seeded_by_content_and_refuses_impossible_ratios(data):
    id_set = build_dataset("imagenet-r", data)
    ood = {"inaturalist-ood": build_dataset("inaturalist-ood", data), "ninco": build_dataset("ninco", data)}
    assert len(ood["inaturalist-ood"]) == 6 and len(ood["ninco"]) == 4 and ood["ninco"].classnames == []
    mixed = OpenSetDataset(id_set, ood, ratio=1.4, seed=3)
    assert len(mixed) == 5 + 7 and mixed.samples[:5] == id_set.samples
    assert [mixed.is_ood(i) for i in range(12)] == [False] * 5 + [True] * 7
    assert all(label is None for _, label in mixed.samples[5:]) and mixed.label(6) is None
    assert all(p.startswith(("ood/inaturalist-ood/", "ood/ninco/")) for p, _ in mixed.samples[5:])
    assert mixed.open_set_info["n_ood"] == 7 and sum(mixed.open_set_info["per_dataset"].values()) == 7
    assert np.array_equal(np.asarray(mixed.image(5)), np.asarray(ood[mixed.drawn[0][0]].image(mixed.drawn[0][1])))
    again = OpenSetDataset(id_set, dict(reversed(list(ood.items()))), ratio=1.4, seed=3)
    assert again.samples == mixed.samples                           # the OOD sets' order does not matter
    assert OpenSetDataset(id_set, ood, ratio=1.4, seed=4).samples != mixed.samples
    with pytest.raises(DatasetError, match=r"asks 15 OOD images for 5 ID images, but inaturalist-ood, ninco hold "
                                           r"only 10; lower the ratio"):
        OpenSetDataset(id_set, ood, ratio=3, seed=0)
    with pytest.raises(DatasetError, match="draws no OOD image"):
        OpenSetDataset(id_set, ood, ratio=0.05, seed=0)


def test_an_ood_record_has_no_label_and_carries_its_score():
    base = {"id": 3, "path": "ood/ninco/a.png", "setting": "clean", "method": "tda", "pred": 4, "top5": [4, 1],
            "confidence": 0.4, "seconds": 0.1}
    rec = check_record({**base, "label": None, "true_prob": None, "correct": None, "ood": True, "ood_score": 0.4})
    assert rec.ood is True and rec.label is None and rec.to_dict()["label"] is None
    assert check_record(json.loads(json.dumps(rec.to_dict()))) == rec
    with pytest.raises(ValueError, match="label must be null on an out-of-distribution sample"):
        check_record({**base, "label": 2, "true_prob": None, "correct": None, "ood": True, "ood_score": 0.4})
    with pytest.raises(ValueError, match="label must be an integer >= 0"):
        check_record({**base, "label": None, "true_prob": None, "correct": None, "ood": False, "ood_score": 0.4})
    with pytest.raises(ValueError, match="ood_score"):
        check_record({**base, "label": 4, "true_prob": 0.4, "correct": True, "ood": False})
    with pytest.raises(ValueError, match="ood must be true or false"):
        check_record({**base, "label": 4, "true_prob": 0.4, "correct": True, "ood": 1, "ood_score": 0.4})


# ------------------------------------------------------------------ every method

@pytest.fixture(scope="module")
def open_set_run(data, tmp_path_factory) -> Path:
    from _records import small_config
    from shiftlab.engine.config import RunConfig, expand_methods
    from shiftlab.engine.loop import run
    from shiftlab.synthetic import tiny_clip
    offline = {n: small_config(n) for n in shiftlab.list_methods()}   # the specs' small test configs
    methods = expand_methods(["all"], "shiftlab-tiny", offline)       # DiffTPT without diffusion views runs
    out = tmp_path_factory.mktemp("openset-run") / "run"
    run(RunConfig(dataset="imagenet-r", data=str(data), model="shiftlab-tiny", pretrained=None, methods=methods,
                  method_config=offline, views=8, out=str(out), workers=0, batch_size=4, progress=False,
                  ood=["inaturalist-ood", "ninco"], ood_ratio=1.0, ood_seed=5, allow_partial=True), model=tiny_clip(0))
    return out


@pytest.mark.slow
# every method "all" runs on the tiny ResNet (a method bound to ViTs, TCA, is left out there)
@pytest.mark.parametrize("name", [n for n in shiftlab.list_methods() if "resnet" in spec(n).towers])
def test_an_open_set_run_writes_detection_metrics_for_every_method(open_set_run, name):
    recs = [r for r in record_files.iter_records(open_set_run / "records.jsonl") if r.get("method") == name]
    assert len(recs) == 10 and all("error" not in r for r in recs)
    id_recs = [r for r in recs if r["ood"] is False]
    ood_recs = [r for r in recs if r["ood"] is True]
    assert len(id_recs) == 5 and len(ood_recs) == 5
    assert all(r["label"] is None and r["correct"] is None and r["true_prob"] is None for r in ood_recs)
    assert all(r["ood_score"] == r["confidence"] for r in recs)        # MCM: the method's max softmax probability
    entry = json.loads((open_set_run / "summary.json").read_text())["methods"][name]
    xin = np.array([r["ood_score"] for r in id_recs])
    xood = np.array([r["ood_score"] for r in ood_recs])
    labels, scores = np.r_[np.ones(5), np.zeros(5)], np.r_[xin, xood]
    assert entry["ood"]["auroc"] == pytest.approx(100 * skm.roc_auc_score(labels, scores))
    assert entry["ood"]["aupr"] == pytest.approx(100 * skm.average_precision_score(labels, scores))
    assert entry["ood"]["fpr95"] == pytest.approx(100 * _fpr95_reference(xin, xood))
    assert (entry["ood"]["n_id"], entry["ood"]["n_ood"], entry["n"]) == (5, 5, 5)   # top-1 etc.: the ID part
    assert entry["top1"] == pytest.approx(100 * sum(r["correct"] for r in id_recs) / 5)


@pytest.mark.slow
def test_open_set_run_json_summary_and_report(open_set_run, tmp_path):
    shared = json.loads((open_set_run / "run.json").read_text())["shared"]
    assert shared["open_set"] == {"ood": ["inaturalist-ood", "ninco"], "ratio": 1.0, "seed": 5, "n_id": 5,
                                  "n_ood": 5, "per_dataset": shared["open_set"]["per_dataset"]}
    assert sum(shared["open_set"]["per_dataset"].values()) == 5
    md = (open_set_run / "summary.md").read_text()
    assert "| AUROC | FPR95 | AUPR | n OOD |" in md and "OOD inaturalist-ood, ninco at ratio 1.0 (seed 5)" in md
    # `shiftlab merge` rewrites the same summary from the records
    before = json.loads((open_set_run / "summary.json").read_text())["methods"]
    assert cli_main(["merge", str(open_set_run)]) == 0
    assert json.loads((open_set_run / "summary.json").read_text())["methods"] == before


@pytest.mark.slow
def test_cli_open_set_run_and_resume_refusals(data, tiny_checkpoint, tmp_path, capsys):
    def run(*extra):
        return cli_main(["run", "--dataset", "imagenet-r", "--data", str(data), "--model", "shiftlab-tiny",
                         "--pretrained", str(tiny_checkpoint), "--views", "2", "--workers", "0", "--no-progress",
                         "--allow-partial", "--methods", "zeroshot,tda", "--out", str(tmp_path / "r"),
                         "--set", "tda.text_head=zeroshot", *extra])   # not its 80-template head: 6 builds, no use
    assert run("--ood", "inaturalist,ninco", "--ood-ratio", "0.8", "--limit", "3") == 0
    capsys.readouterr()
    for change, words in ((["--ood", "inaturalist", "--ood-ratio", "0.8"],
                           ('open_set ', 'ood ["inaturalist-ood", "ninco"] -> ["inaturalist-ood"]')),
                          (["--ood", "inaturalist,ninco", "--ood-ratio", "0.6"], ("open_set ", "ratio 0.8 -> 0.6")),
                          (["--ood", "inaturalist,ninco", "--ood-ratio", "0.8", "--ood-seed", "9"],
                           ("open_set ", "seed 0 -> 9")),
                          ([], ("open_set {",))):
        assert run(*change, "--limit", "3", "--resume") == 2
        err = capsys.readouterr().err
        assert all(w in err for w in words) and "define a different stream" in err, err
    assert run("--ood", "inaturalist,ninco", "--ood-ratio", "0.8", "--resume") == 0
    assert len(list(record_files.iter_records(tmp_path / "r" / "records.jsonl"))) == 2 * 9
    # the report reads the same records: its OOD section and metrics.csv's columns (report.html is built from them)
    from shiftlab.report.build import METRIC_COLUMNS, metric_rows
    from shiftlab.report.data import ReportData
    from shiftlab.report.load import load_runs
    from shiftlab.report.sections import ood_section
    from shiftlab.report.stats import series_metrics
    runs = load_runs([tmp_path / "r"])
    data = ReportData(runs, {(s.key, s.setting_label): series_metrics(s) for r in runs for s in r.series}, [],
                      tmp_path, 20, 0)
    anchor, heading, html = ood_section(data)
    assert heading == "Out-of-distribution detection" and 'id="ood-table"' in html and "inaturalist-ood, ninco" in html
    assert METRIC_COLUMNS[-4:] == ["auroc", "fpr95", "aupr", "n_ood"]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())["methods"]
    for row in metric_rows(data):
        assert row["n_ood"] == 4 and row["n"] == 5                     # 0.8 x 5 ID images
        assert row["auroc"] == pytest.approx(summary[row["method"]]["ood"]["auroc"])


def test_library_shift_settings_out_of_range_are_refused():
    from shiftlab.engine.config import RunConfig
    from shiftlab.engine.shifts import shift_problem
    assert shift_problem(RunConfig(severity=7)) == "severity must be one of 1..5 (Hendrycks & Dietterich's), got 7"
    assert shift_problem(RunConfig(ood=["ninco"], ood_ratio=float("nan"))).startswith("ood_ratio must be in (0, 10]")
    from shiftlab.options import speaking_cli
    with speaking_cli():
        assert "--ood-ratio must be in (0, 10]" in shift_problem(RunConfig(ood=["ninco"], ood_ratio=float("nan")))
    assert "unknown corruption 'rain'" in shift_problem(RunConfig(corruption="rain"))
    assert shift_problem(RunConfig(corruption="fog", severity=1, ood=["ninco"], ood_ratio=0.5)) is None


def test_open_set_flags_are_checked_before_any_work(data, tmp_path, capsys):
    base = ["run", "--dataset", "imagenet-r", "--data", str(data), "--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit):
        cli_main([*base, "--ood", "inaturalist,nope"])
    assert "unknown dataset 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main([*base, "--ood", "ninco", "--ood-ratio", "0"])
    assert "must be above 0 and at most 10" in capsys.readouterr().err
    assert cli_main([*base, "--ood", "ninco", "--attack", "pgd"]) == 2
    assert "OOD images have none" in capsys.readouterr().err
    assert cli_main([*base, "--ood", "ninco", "--order", "dirichlet", "--delta", "0.1"]) == 2
    assert "a label-ordered stream needs every sample's class" in capsys.readouterr().err
    assert cli_main([*base, "--ood", "imagenet-r"]) == 2
    assert "the OOD set is the in-distribution dataset itself" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
