"""Suites: one resumable run directory per dataset and the suite table (datasets x methods)."""
from __future__ import annotations

import csv
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _gate import GatedRun, child_env
from _synthetic import make_image_folder, make_imagenet_r
from shiftlab.cli import main as cli_main
from shiftlab.datasets import suites
from shiftlab.datasets.classes import imagenet_a_wnids
from shiftlab.engine import suite as suite_runs
from shiftlab.report.build import build_report
from shiftlab.results import suite_table
from shiftlab.results.published_suites import openai_sha256, sources, suite_rows, table_rows
from shiftlab.results.summary import summarize
from shiftlab.rundir import record_files, records


def make_imagenet_a(root: Path, n_images: int) -> Path:
    """ImageNet-A's layout (all 200 wnid folders) with one image in each of the first n_images."""
    wnids = imagenet_a_wnids()
    make_image_folder(root / "imagenet-a", wnids, per_class=0)
    make_image_folder(root / "imagenet-a", wnids[:n_images], per_class=1, size=(72, 64), seed=3, image_format="jpg")
    return root / "imagenet-a"


def top1_from_records(run_dir: Path, method: str) -> float:
    recs = [r for r in record_files.iter_records(run_dir / "records.jsonl")
            if r.get("method") == method and r.get("setting", "clean") == "clean" and "error" not in r]
    return 100.0 * sum(r["correct"] for r in recs) / len(recs)


def cell_from_records(run_dir: Path, method: str) -> str:
    """suite.md's cell, computed from the records with shiftlab.results.metrics: 'top-1 (ECE e, n k)'."""
    from shiftlab.results import metrics
    recs = [r for r in record_files.iter_records(run_dir / "records.jsonl")
            if r.get("method") == method and r.get("setting", "clean") == "clean" and "error" not in r]
    ece = metrics.ece([r["confidence"] for r in recs], [r["correct"] for r in recs])
    return f"{top1_from_records(run_dir, method):.2f} (ECE {ece:.2f}, n {len(recs)})"


def write_records(run_dir: Path, dataset: str, model: str, accuracy: dict[str, list[bool]],
                  pretrained: str | None = "openai", sha256: str | None = None, protocol: str | None = "paper",
                  **config) -> None:
    run_dir.mkdir(parents=True)
    lines = []
    for method, correct in accuracy.items():
        for i, ok in enumerate(correct):
            lines.append(json.dumps({"id": i, "path": f"c{i % 3}/img_{i}.jpg", "label": i % 3, "method": method,
                                     "setting": "clean", "pred": i % 3 if ok else (i + 1) % 3, "correct": ok,
                                     "top5": [0, 1, 2], "confidence": 0.6, "true_prob": 0.5, "seconds": 0.01}))
    (run_dir / "records.jsonl").write_text("\n".join(lines) + "\n")
    # the summary a run writes at its end (the suite table reads it)
    run_config = {"model": model, "pretrained": pretrained, "dataset": dataset, "classnames": ["a", "b", "c"],
                  "checkpoint_sha256": sha256, "protocol": protocol, **config}
    (run_dir / "summary.json").write_text(json.dumps(summarize([json.loads(line) for line in lines], run_config)))


# ----------------------------------------------------------------- the table

@pytest.mark.slow
def test_suite_table_averages_and_published_rows(tmp_path):
    suite_dir = tmp_path / "ns"
    suite = suites.SUITES["natural-shift"]
    suite_runs.write_manifest(suite_dir, suite, {"methods": ["zeroshot", "tpt"], "model": "RN50"})
    # zeroshot: 1/4, 2/4, 3/4, 4/4, 2/4 correct; tpt skipped imagenet-sketch (no average then).
    for k, name in enumerate(suite.datasets):
        acc = {"zeroshot": [j < [1, 2, 3, 4, 2][k] for j in range(4)]}
        if name != "imagenet-sketch":
            acc["tpt"] = [True] * 4 if k % 2 else [True, False, False, False]
        write_records(suite_dir / name, name, "RN50", acc, sha256=openai_sha256("RN50"))
    table = suite_table.suite_table(suite_dir)
    assert table["methods"] == ["zeroshot", "tpt"] and table["missing"] == []
    assert table["top1"]["zeroshot"] == {"imagenet": 25.0, "imagenet-a": 50.0, "imagenet-v2": 75.0,
                                         "imagenet-r": 100.0, "imagenet-sketch": 50.0}
    assert table["average"]["zeroshot"] == pytest.approx(60.0)          # (25+50+75+100+50)/5
    assert table["ood_average"]["zeroshot"] == pytest.approx(68.75)     # (50+75+100+50)/4
    assert table["average"]["tpt"] is None and table["ood_average"]["tpt"] is None
    suite_table.write_suite_table(suite_dir, table)
    md = (suite_dir / "suite.md").read_text()
    # every confidence is 0.6: one bin, so ECE = |60 - top-1|
    assert ("| zeroshot | 25.00 (ECE 35.00, n 4) | 50.00 (ECE 10.00, n 4) | 75.00 (ECE 15.00, n 4) | "
            "100.00 (ECE 40.00, n 4) | 50.00 (ECE 10.00, n 4) | 60.00 | 68.75 |") in md
    assert ("| tpt | 25.00 (ECE 35.00, n 4) | 100.00 (ECE 40.00, n 4) | 25.00 (ECE 35.00, n 4) | "
            "100.00 (ECE 40.00, n 4) | — | — | — |") in md
    assert "partial" not in md
    assert "| ImageNet | -A | -V2 | -R | -Sketch | Average | OOD Average |" in md
    # RN50 + OpenAI's checkpoint (by SHA-256) + the paper protocol: the papers' rows follow, with their source.
    assert "| TPT | tpt-readme | 60.74 | 26.67 | 54.70 | 59.11 | 35.09 | 47.26 | 43.89 |" in md
    assert "github.com/azshue/TPT" in md
    rows = list(csv.DictReader((suite_dir / "suite.csv").open()))
    ours = {(r["method"], r["dataset"]): r for r in rows if r["kind"] == "ours"}
    assert float(ours[("zeroshot", "ood_average")]["top1"]) == pytest.approx(68.75)
    assert ours[("zeroshot", "imagenet-a")]["n"] == "4" and ours[("tpt", "average")]["top1"] == ""
    assert float(ours[("zeroshot", "imagenet-a")]["ece"]) == pytest.approx(10.0)
    assert ours[("zeroshot", "imagenet-a")]["partial"] == ""
    assert any(r["kind"] == "published" and r["label"] == "DMN-ZS" and r["dataset"] == "imagenet-r"
               and float(r["top1"]) == 61.44 for r in rows)
    # The HTML report of the suite directory shows the same table.
    html = build_report([suite_dir], tmp_path / "report", n_resamples=10).read_text()
    section = re.search(r'<section id="suite">.*?</section>', html, re.S).group(0)
    assert ">68.75<" in section and ">60.00<" in section and ">43.89<" in section
    assert "tpt-readme" in section and (tmp_path / "report" / "suite_ns.csv").is_file()
    # The same numbers from weights of unknown origin, or under the leaderboard protocol: no published rows.
    for sha, protocol in [(None, "paper"), ("0" * 64, "paper"), (openai_sha256("RN50"), None)]:
        for name in suite.datasets:
            summary = json.loads((suite_dir / name / "summary.json").read_text())
            summary["config"].update(checkpoint_sha256=sha, protocol=protocol)
            (suite_dir / name / "summary.json").write_text(json.dumps(summary))
        table = suite_table.suite_table(suite_dir)
        assert table["protocol"] == (protocol or "leaderboard") and suite_table.published_suite_rows(table) == []
        assert "Published" not in suite_table.table_markdown(table)


def test_suite_table_marks_limited_and_incomplete_datasets(tmp_path):
    suite_dir = tmp_path / "two"
    suite = suites.resolve_suite(None, "imagenet-r,imagenet-a")
    suite_runs.write_manifest(suite_dir, suite, {"methods": ["zeroshot", "tpt"], "model": "RN50"})
    # imagenet-r: --limit 4 of 30000 images; imagenet-a: all 5 asked for, tpt stopped after 3
    write_records(suite_dir / "imagenet-r", "imagenet-r", "RN50", {"zeroshot": [True] * 4, "tpt": [False] * 4},
                  limit=4, n_samples=30000)
    write_records(suite_dir / "imagenet-a", "imagenet-a", "RN50", {"zeroshot": [True] * 5, "tpt": [True] * 3},
                  limit=None, n_samples=5)
    table = suite_table.suite_table(suite_dir)
    assert table["partial"] == {"imagenet-r": "partial: --limit 4", "imagenet-a": "incomplete: 3 of 5 samples"}
    suite_table.write_suite_table(suite_dir, table)
    md = (suite_dir / "suite.md").read_text()
    assert md.splitlines()[4] == ("| method | -R (partial: --limit 4) | -A (incomplete: 3 of 5 samples) | "
                                  "Average |")
    assert "| zeroshot | 100.00 (ECE 40.00, n 4) | 100.00 (ECE 40.00, n 5) | 100.00 |" in md
    assert "| tpt | 0.00 (ECE 60.00, n 4) | 100.00 (ECE 40.00, n 3) | 50.00 |" in md
    assert "not the whole dataset: -R (partial: --limit 4), -A (incomplete: 3 of 5 samples)" in md
    rows = {(r["method"], r["dataset"]): r for r in csv.DictReader((suite_dir / "suite.csv").open())}
    assert rows[("tpt", "imagenet-r")]["partial"] == "partial: --limit 4"
    assert rows[("tpt", "imagenet-a")]["n"] == "3" and float(rows[("tpt", "imagenet-r")]["ece"]) == 60.0
    # a --limit at least the dataset's size covers it all: no mark
    assert suite_table.partial_mark({"limit": 5, "n_samples": 5}, [5, 5]) == ""
    assert suite_table.partial_mark({"limit": None, "n_samples": None}, [3]) == ""


def test_a_dataset_folder_of_another_model_or_weights_is_left_out_of_the_table_and_named(tmp_path):
    # each dataset's summary.json is read back: one run with another backbone, other weights or another protocol
    # (a folder copied in, a dataset rerun otherwise) is not averaged with the suite's as if it were its row
    suite_dir = tmp_path / "three"
    suite = suites.resolve_suite(None, "imagenet-r,imagenet-a,imagenet-v2")
    suite_runs.write_manifest(suite_dir, suite, {"methods": ["zeroshot"], "model": "RN50", "pretrained": "openai",
                                                 "protocol": "paper"})
    write_records(suite_dir / "imagenet-r", "imagenet-r", "RN50", {"zeroshot": [True] * 4}, sha256="a" * 64)
    write_records(suite_dir / "imagenet-a", "imagenet-a", "ViT-B-16", {"zeroshot": [False] * 4}, sha256="a" * 64)
    write_records(suite_dir / "imagenet-v2", "imagenet-v2", "RN50", {"zeroshot": [False] * 4}, sha256="b" * 64)
    table = suite_table.suite_table(suite_dir)
    assert table["top1"]["zeroshot"] == {"imagenet-r": 100.0} and table["average"]["zeroshot"] is None
    assert table["mismatched"] == {"imagenet-a": "model ViT-B-16, not RN50",
                                   "imagenet-v2": f"weights_sha256 {'b' * 64}, not {'a' * 64}"}
    md = suite_table.table_markdown(table)
    assert "left out (run otherwise than this suite): -A (model ViT-B-16, not RN50)" in md


def test_published_suite_numbers_are_sourced_and_add_up():
    cited = sources()
    for suite, model, backbone in [("natural-shift", "RN50", "RN50"), ("cross-dataset", "RN50-quickgelu", "RN50"),
                                   ("natural-shift", "ViT-B-16", "ViT-B/16"),
                                   ("cross-dataset", "ViT-B-16-quickgelu", "ViT-B/16")]:
        rows = suite_rows(suite, model, weights_sha256=openai_sha256(backbone), protocol="paper")
        assert rows and rows == table_rows(suite, backbone)
        assert all(row["backbone"] == backbone for row in rows)
        datasets = suites.SUITES[suite].datasets
        for row in rows:
            assert row["source"] == cited[row["source_id"]] and set(row["values"]) <= set(datasets)
            # A printed average must be the mean of the printed per-dataset numbers (catches typos).
            if row["average"] is not None:
                assert len(row["values"]) == len(datasets)
                assert sum(row["values"].values()) / len(datasets) == pytest.approx(row["average"], abs=0.006)
            if row["ood_average"] is not None:
                ood = [row["values"][d] for d in suites.SUITES[suite].ood]
                assert sum(ood) / len(ood) == pytest.approx(row["ood_average"], abs=0.006)
    # OpenAI's files as open_clip's table lists them (the SHA-256 is part of the official URL).
    assert openai_sha256("RN50") == "afeb0e10f9e5a86da6080e35cf09123aca3b358a0c3e3b6c78a7b63bc04b6762"
    assert openai_sha256("ViT-B/16") == "5806e77cd80f8b59890b7e101eabd078d9fb84e6937f9e85e4ecb61988df416f"
    vit = openai_sha256("ViT-B/16")
    # ViT-B/16 rows: only for a ViT-B/16 architecture holding OpenAI's ViT-B/16 file (by checksum or its
    # verified hub source), under the paper protocol; never for RN50's file, other weights or other backbones.
    vit_rows = suite_rows("natural-shift", "ViT-B-16", weights_sha256=vit, protocol="paper")
    assert {r["method"] for r in vit_rows} >= {"zeroshot", "tpt", "zero", "dmn_zs"}
    assert next(r for r in vit_rows if r["method"] == "tpt")["values"]["imagenet-a"] == 54.77
    assert next(r for r in table_rows("cross-dataset", "ViT-B/16")
                if r["method"] == "dmn_zs")["values"]["flowers102"] == 74.49
    assert suite_rows("natural-shift", "ViT-B-16", weights_sha256=vit, protocol="paper",
                      weights_source="hf-hub:timm/vit_base_patch16_clip_224.openai") == vit_rows
    assert suite_rows("natural-shift", "ViT-B-16", weights_sha256="0" * 64, protocol="paper",
                      weights_source="hf-hub:timm/vit_base_patch16_clip_224.openai") == vit_rows  # verified hub blob
    assert suite_rows("natural-shift", "ViT-B-16", weights_sha256="0" * 64, protocol="paper") == []  # unknown origin
    assert suite_rows("natural-shift", "ViT-B-16", weights_sha256=None, protocol="paper") == []
    assert suite_rows("natural-shift", "ViT-B-16", weights_sha256=openai_sha256("RN50"), protocol="paper") == []
    assert suite_rows("cross-dataset", "ViT-B-16", weights_sha256=vit, protocol="leaderboard") == []
    assert suite_rows("cross-dataset", "ViT-B-32", weights_sha256=vit, protocol="paper") == []
    assert suite_rows("cross-dataset", "ViT-L-14", weights_sha256=vit, protocol="paper") == []
    assert suite_rows("natural-shift", "RN50", weights_sha256=vit, protocol="paper") == []   # wrong file
    assert suite_rows("natural-shift", "RN50", weights_sha256=None, protocol="paper") == []  # unknown origin
    assert suite_rows("natural-shift", "convnext_base", weights_sha256=vit, protocol="paper") == []


def test_suite_requests_that_cannot_run_are_one_line_errors(tmp_path, capsys):
    base = ["run", "--data", str(tmp_path), "--out", str(tmp_path / "o"), "--no-progress"]
    assert cli_main(base + ["--suite", "natural-shift", "--datasets", "imagenet-r"]) == 2
    assert "either --suite or --datasets" in capsys.readouterr().err
    assert cli_main(base + ["--datasets", "imagenet-r,imagenet-r"]) == 2
    assert "lists a dataset twice" in capsys.readouterr().err
    # Every missing dataset is reported at once, before anything runs.
    assert cli_main(base + ["--datasets", "imagenet-r,imagenet-a", "--pretrained", "none",
                            "--model", "no-such-model", "--methods", "zeroshot"]) == 1
    message = capsys.readouterr().err
    assert len(message.splitlines()) == 3   # one line per problem
    assert "dataset imagenet-r:" in message and "dataset imagenet-a:" in message and "model:" in message
    assert not (tmp_path / "o").exists()


# ------------------------------------------------ end to end, killed and resumed

@pytest.mark.slow
def test_two_dataset_suite_resumes_after_sigkill_and_writes_the_table(tmp_path, tiny_checkpoint):
    data = tmp_path / "data"
    make_imagenet_r(data, classes=range(0, 200, 40), size=(72, 64))            # 5 images
    make_imagenet_a(data, 24)
    suite_dir = tmp_path / "suite"
    argv = ["run", "--datasets", "imagenet-r,imagenet-a", "--data", str(data), "--model", "shiftlab-tiny",
            "--pretrained", str(tiny_checkpoint), "--views", "4", "--workers", "0", "--batch-size", "1",
            "--methods", "zeroshot,tpt", "--no-progress", "--out", str(suite_dir), "--allow-partial"]
    # batches of one: steps 1-5 are imagenet-r's 5 images, 6 and 7 the first two of imagenet-a's 24
    with GatedRun(tmp_path / "gate", argv, at="after_step:7") as child:
        child.wait_reached()
        assert child.kill() == -signal.SIGKILL
    assert len(list(record_files.iter_records(suite_dir / "imagenet-a" / "records.jsonl"))) == 2 * 2
    assert len(list(record_files.iter_records(suite_dir / "imagenet-r" / "records.jsonl"))) == 10
    assert not (suite_dir / "suite.md").exists()

    done = subprocess.run([sys.executable, "-m", "shiftlab", *argv, "--resume"], env=child_env(),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    for name, n_images in [("imagenet-r", 5), ("imagenet-a", 24)]:
        recs = list(record_files.iter_records(suite_dir / name / "records.jsonl"))
        assert len(recs) == len({records.record_key(r) for r in recs}) == 2 * n_images
        assert json.loads((suite_dir / name / "summary.json").read_text())["config"]["dataset"] == name
    manifest = json.loads((suite_dir / "suite.json").read_text())
    assert manifest["datasets"] == ["imagenet-r", "imagenet-a"] and manifest["ood"] == []
    md = (suite_dir / "suite.md").read_text()
    rows = {r["method"] + "/" + r["dataset"]: r for r in csv.DictReader((suite_dir / "suite.csv").open())
            if r["kind"] == "ours"}
    for method in ("zeroshot", "tpt"):
        r_acc, a_acc = (top1_from_records(suite_dir / d, method) for d in ("imagenet-r", "imagenet-a"))
        assert float(rows[f"{method}/imagenet-r"]["top1"]) == pytest.approx(r_acc)
        assert float(rows[f"{method}/imagenet-a"]["top1"]) == pytest.approx(a_acc)
        assert float(rows[f"{method}/average"]["top1"]) == pytest.approx((r_acc + a_acc) / 2)
        r_cell, a_cell = (cell_from_records(suite_dir / d, method) for d in ("imagenet-r", "imagenet-a"))
        assert f"| {method} | {r_cell} | {a_cell} | {(r_acc + a_acc) / 2:.2f} |" in md
    assert "Published" not in md   # a list of one's own datasets has no paper table


# ------------------------------------------------------------- second backbone

@pytest.mark.slow
def test_vit_b16_runs_end_to_end_and_loads_from_an_openai_state_dict(tmp_path):
    from shiftlab.models import load_model
    from shiftlab.models.architectures import _is_openai_state_dict

    data = make_image_folder(tmp_path / "data", ["cat", "dog"], per_class=1, size=(96, 80), image_format="jpg")
    out = tmp_path / "vit"
    assert cli_main(["run", "--dataset", "imagefolder", "--data", str(data), "--model", "ViT-B-16",
                     "--pretrained", "none", "--views", "8", "--workers", "0", "--methods", "zeroshot,tpt,mta",
                     "--no-progress", "--out", str(out)]) == 0
    recs = list(record_files.iter_records(out / "records.jsonl"))
    want = [(i, m) for i in range(2) for m in ("mta", "tpt", "zeroshot")]
    assert sorted((r["id"], r["method"]) for r in recs) == want
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["model"] == "ViT-B-16" and summary["errors"] == 0
    assert (out / "summary.md").read_text().startswith("### imagefolder · ViT-B-16 (random weights)")
    # OpenAI's ViT-B/16 file is an OpenAI state dict: the loader must rebuild the same network from one.
    model = load_model("ViT-B-16-quickgelu", None)   # OpenAI's ViTs use QuickGELU, as their RN50 does
    assert model.image_size == 224
    sd = model.clip.state_dict()
    assert _is_openai_state_dict(sd)
    path = tmp_path / "ViT-B-16-openai-layout.pt"
    torch.save(sd, path)
    del sd
    rebuilt = load_model("ViT-B-16", str(path))
    assert rebuilt.name == "ViT-B-16-quickgelu" and rebuilt.image_size == 224
    x = torch.rand(1, 3, 224, 224)
    with torch.no_grad():
        assert torch.allclose(rebuilt.clip.encode_image(x), model.clip.encode_image(x), atol=1e-5)


def test_every_suite_dataset_is_a_canonical_registered_name():
    from shiftlab.datasets import DATASETS

    for suite in suites.SUITES.values():
        assert all(d in DATASETS and DATASETS.canonical(d) == d for d in suite.datasets), suite.name
        assert set(suite.ood) <= set(suite.datasets) and all(DATASETS.get(d).short for d in suite.datasets)


# ------------------------------------------------ a suite continued with fewer datasets

@pytest.mark.slow
def test_a_suite_continued_with_fewer_datasets_keeps_the_other_rows_and_says_so(tmp_path, tiny_checkpoint, capsys):
    """Nothing lost: a command naming a subset of a suite directory's datasets rewrites their rows
    and keeps the others (records on disk, same configuration), saying which; nothing mixed: rows
    of another configuration are left out of the table, named, and never deleted."""
    data = tmp_path / "data"
    make_imagenet_r(data, classes=range(0, 200, 40), size=(72, 64))            # 5 images
    make_imagenet_a(data, 6)
    suite_dir = tmp_path / "suite"
    args = ["run", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained", str(tiny_checkpoint),
            "--views", "2", "--workers", "0", "--methods", "zeroshot", "--no-progress", "--out", str(suite_dir),
            "--allow-partial"]
    assert cli_main(args + ["--datasets", "imagenet-r,imagenet-a"]) == 0
    first = (suite_dir / "suite.md").read_text()
    a_acc = top1_from_records(suite_dir / "imagenet-a", "zeroshot")
    out = capsys.readouterr().out
    assert "| zeroshot |" in out and f"{a_acc:.2f}" in out       # --no-progress still prints the suite table

    assert cli_main(args + ["--datasets", "imagenet-r", "--resume"]) == 0
    err = capsys.readouterr().err
    assert "suite: this command runs imagenet-r; the table keeps imagenet-a from earlier runs (not re-run)" in err
    manifest = json.loads((suite_dir / "suite.json").read_text())
    assert manifest["datasets"] == ["imagenet-r", "imagenet-a"]
    assert (manifest["rewrote"], manifest["kept"]) == (["imagenet-r"], ["imagenet-a"])
    md = (suite_dir / "suite.md").read_text()
    assert md.split("\n\n")[2].strip() == first.split("\n\n")[2].strip()     # the same table rows
    assert "last written by a run of imagenet-r; imagenet-a kept from earlier runs of the same configuration" in md
    rows = [r for r in csv.DictReader((suite_dir / "suite.csv").open()) if r["dataset"] == "imagenet-a"]
    assert [float(r["top1"]) for r in rows] == [pytest.approx(a_acc)]

    # the earlier datasets were run with another model: left out and named, their records kept
    manifest["config"]["model"] = "RN50"
    (suite_dir / "suite.json").write_text(json.dumps(manifest))
    assert cli_main(args + ["--datasets", "imagenet-r", "--resume"]) == 0
    err = capsys.readouterr().err
    assert "leaves out imagenet-a (run with another model; their folders stay on disk)" in err
    assert json.loads((suite_dir / "suite.json").read_text())["datasets"] == ["imagenet-r"]
    assert "-A" not in (suite_dir / "suite.md").read_text().splitlines()[4]
    assert (suite_dir / "imagenet-a" / "records.jsonl").is_file()


def test_merge_with_previous_keeps_rows_of_the_same_configuration_only(tmp_path):
    config = {"model": "RN50", "pretrained": "openai", "protocol": "paper", "methods": ["tpt"], "limit": None}
    suite_runs.write_manifest(tmp_path, suites.SUITES["natural-shift"], config)
    for name in ("imagenet", "imagenet-a", "imagenet-r"):
        write_records(tmp_path / name, name, "RN50", {"tpt": [True, False]})
    subset = suites.resolve_suite(None, "imagenet-r")
    # other methods or another limit change no result: the other datasets with records are kept
    merge = suite_runs.merge_with_previous(tmp_path, subset, {**config, "methods": ["zeroshot"], "limit": 5})
    assert merge.suite == suites.SUITES["natural-shift"]       # all five again: the suite keeps its OOD column
    assert merge.ran == ("imagenet-r",) and merge.kept == ("imagenet", "imagenet-a") and not merge.dropped
    assert merge.message() == ("suite: this command runs imagenet-r; the table keeps imagenet, imagenet-a from "
                               "earlier runs (not re-run)")
    merge = suite_runs.merge_with_previous(tmp_path, subset, {**config, "protocol": "leaderboard"})
    assert merge.suite == subset and merge.kept == () and merge.dropped == ("imagenet", "imagenet-a")
    assert "leaves out imagenet, imagenet-a (run with another protocol;" in merge.message()
    # the same datasets again, or a directory without suite.json: nothing to say
    assert suite_runs.merge_with_previous(tmp_path, suites.SUITES["natural-shift"], config).message() is None
    assert suite_runs.merge_with_previous(tmp_path / "new", subset, config).message() is None


def test_a_suite_resumed_from_another_config_file_keeps_its_rows(tmp_path):
    """Leftover of #34: `config_file` (the path, digest and values of `--config FILE`) decides no result, the
    flags it gave do; a suite continued with the same settings from another file (or from flags) kept no row."""
    config = {"model": "RN50", "pretrained": "openai", "protocol": "paper", "methods": ["tpt"],
              "config_file": {"path": "a.toml", "sha256": "0" * 64, "values": {"model": "RN50"}}}
    suite_runs.write_manifest(tmp_path, suites.SUITES["natural-shift"], config)
    for name in ("imagenet", "imagenet-a", "imagenet-r"):
        write_records(tmp_path / name, name, "RN50", {"tpt": [True, False]})
    subset = suites.resolve_suite(None, "imagenet-r")
    for other in ({"path": "b.toml", "sha256": "1" * 64, "values": {"model": "RN50"}}, None):
        merge = suite_runs.merge_with_previous(tmp_path, subset, {**config, "config_file": other})
        assert merge.kept == ("imagenet", "imagenet-a") and not merge.dropped, merge.message()
    # a setting the file gave that does change results still leaves the rows out
    merge = suite_runs.merge_with_previous(tmp_path, subset, {**config, "model": "ViT-B-16", "config_file": None})
    assert merge.dropped == ("imagenet", "imagenet-a") and "another model" in merge.message()
