"""Issue 40, "Nothing misleading": the wrong inputs of cases 1, 2, 6, 7, 12, 16, 20 and 21 are refused in one
line before torch is imported, with advice that fits; none is run silently into wrong numbers."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _synthetic import make_image_folder, make_imagenet_r
from shiftlab.commands.datasets import found_under
from shiftlab.datasets import DatasetError, build_dataset
from test_checks_before_torch import SCRIPT

TINY = ["--model", "shiftlab-tiny", "--pretrained", "none", "--allow-partial"]


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    """only: a data root holding imagenet-r alone; ood: imagenet-r with an empty SUN/images, Places/ of byte
    copies of imagenet-r's images and two iNaturalist images; folder: a 3-class image folder."""
    base = tmp_path_factory.mktemp("misleading")
    only, ood = base / "only", base / "ood"
    make_imagenet_r(only, classes=range(0, 200, 40), size=(48, 40))
    make_imagenet_r(ood, classes=range(0, 200, 40), size=(48, 40))
    (ood / "SUN" / "images").mkdir(parents=True)
    (ood / "Places").mkdir()
    for k, image in enumerate(sorted((ood / "imagenet-r").rglob("*.jpg"))[:2]):
        shutil.copyfile(image, ood / "Places" / f"copy_{k}.jpg")
    make_image_folder(ood / "iNaturalist" / "images", ["a", "b"], seed=9)
    folder = make_image_folder(base / "folder", ["cat", "dog", "emu"])
    files = base / "files"
    files.mkdir()
    (files / "two.txt").write_text("cat\ndog\n")
    (files / "dup.txt").write_text("cat\ndog\ncat\n")
    (files / "latin1.txt").write_bytes("café\ndog\nemu\n".encode("latin-1"))
    (files / "bom.txt").write_bytes("\ufeffcat\ndog\nemu\n".encode("utf-8"))
    unrelated = base / "unrelated"
    unrelated.mkdir()
    (unrelated / "summary.json").write_text('{"mine": true}\n')
    done = base / "done"     # a run directory with records
    done.mkdir()
    (done / "run.json").write_text("{}\n")
    (done / "records.jsonl").write_text("{}\n")
    make_image_folder(base / "wnids", ["n01443537", "n99999999"])
    return {"base": base, "only": only, "ood": ood, "folder": folder, "files": files, "unrelated": unrelated,
            "done": done, "wnids": base / "wnids"}


def _cases(r: dict[str, Path]) -> list[tuple[list[str], int, list[str], list[str]]]:
    """(argv, exit code, fragments every one of which the error lines hold, fragments none may hold)."""
    only, ood, base = str(r["only"]), str(r["ood"]), r["base"]
    out = str(base / "new-run")
    run = ["run", "--out", out, *TINY]
    download_r = "shiftlab download imagenet-r"
    return [
        # case 1: a missing OOD folder is refused, never read from the data root (or the ID folder itself)
        (run + ["--data", only, "--ood", "sun-ood", "--ood-ratio", "0.5"], 1,
         [f"sun-ood: no folder of it under {only} (expected {only}/SUN/images/ holding its images"], [download_r]),
        (run + ["--data", only + "/imagenet-r", "--ood", "sun-ood"], 1, ["sun-ood: no folder of it under"], []),
        # an empty OOD folder; a stored corrupted set without its folder; a suite's missing dataset
        (run + ["--data", ood, "--ood", "sun-ood"], 1, [f"sun-ood: no images in {ood}/SUN/images"], [download_r]),
        (run + ["--data", only, "--dataset", "imagenet-c", "--corruption", "fog"], 1,
         [f"no fog/5 folder in {only}", "fog/5/<wnid>/"], []),
        (run + ["--data", only, "--datasets", "imagenet-r,imagenet-a"], 1,
         ["dataset imagenet-a:", "none of the 200 expected class folders", "shiftlab download imagenet-a"], []),
        # case 6/7/21: too few OOD images: the ratio that fits, said before torch, no download of the ID set
        (run + ["--data", ood, "--ood", "inaturalist", "--ood-ratio", "1", "--limit", "2"], 1,
         ["asks 5 OOD images for 5 ID images, but inaturalist-ood hold only 2", "--ood-ratio 0.4 or less",
          "even with --limit"], [download_r]),
        # case 12: OOD images that are copies of ID images
        (run + ["--data", ood, "--ood", "places", "--ood-ratio", "0.2"], 1,
         ["2 image(s) of the OOD set(s) are byte for byte images of the in-distribution dataset",
          f"{ood}/Places/copy_"], [download_r]),
        # case 7: a pretrained tag open_clip does not list, records already in --out, a class-name count
        (["run", "--out", out, "--data", only, "--allow-partial", "--model", "RN50", "--pretrained", "opnai"], 1,
         ["model: unknown pretrained tag 'opnai' for model 'RN50' (did you mean openai?)"], []),
        (["run", "--out", str(r["done"]), "--data", only, *TINY], 2,
         [f"{r['done']} already holds records; pass --resume"], []),
        (run + ["--data", str(r["folder"]), "--dataset", "imagefolder", "--classnames", str(r["files"] / "two.txt")],
         1, ["imagefolder: got 2 class names for 3 classes"], []),
        (run + ["--data", only, "--methods", "tda,zeroshoot"], 2,
         ["unknown method zeroshoot (did you mean zeroshot", "`shiftlab methods` lists the"], ["boostadapter"]),
        # case 16: the class-names file
        (run + ["--data", str(r["folder"]), "--dataset", "imagefolder", "--classnames", str(r["files"] / "dup.txt")],
         2, ["'cat' is listed twice (lines 1 and 3"], []),
        (run + ["--data", str(r["folder"]), "--dataset", "imagefolder", "--classnames",
                str(r["files"] / "latin1.txt")], 2, ["not UTF-8 text (byte 0xe9 on line 1)"], []),
        # case 20: an unrelated --out, a feature store inside the dataset's folder, --workers -1
        (["run", "--out", str(r["unrelated"]), "--data", only, *TINY], 2,
         [f"--out {r['unrelated']} is a non-empty folder that is not a shiftlab run directory", "summary.json"], []),
        (run + ["--data", str(r["folder"]), "--dataset", "imagefolder", "--features", str(r["folder"] / "feats")], 2,
         [f"is inside {r['folder']}, the folder imagefolder is read from"], []),
        (["encode", "--data", only + "/imagenet-r", "--features", only + "/imagenet-r/feats", *TINY], 2,
         ["the folder imagenet-r is read from"], []),
        (run + ["--data", only, "--workers", "-1"], 2, ["--workers: must be auto or a number of workers >= 0"], []),
        # case 2: WordNet-ID folders CLIP cannot name
        (run + ["--data", str(r["wnids"]), "--dataset", "imagefolder"], 1,
         ["are WordNet IDs (e.g. n01443537), but not ImageNet-1k wnids: ['n99999999']", "--classnames FILE"], []),
    ]


@pytest.mark.slow
def test_wrong_inputs_are_refused_in_one_line_before_torch(roots):
    cases = _cases(roots)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps([c[0] for c in cases])],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for (argv, code, wanted, unwanted), got in zip(cases, json.loads(proc.stdout)["results"]):
        lines = [line for line in got["err"].strip().splitlines() if "warning:" not in line]
        assert got["code"] == code, (argv, got)
        assert lines and all(line.startswith("shiftlab") and "error: " in line for line in lines), (argv, got["err"])
        assert all(any(f in line for line in lines) for f in wanted), (argv, got["err"])
        assert not any(f in got["err"] for f in unwanted), (argv, got["err"])
        assert "Traceback" not in got["err"] and got["heavy"] == [], (argv, got)
        assert got["seconds"] < 1.0, (argv, got["seconds"])
    assert not (roots["base"] / "new-run").exists() and not (roots["folder"] / "feats").exists()
    assert (roots["unrelated"] / "summary.json").read_text() == '{"mine": true}\n'   # untouched
    assert sorted(p.name for p in roots["unrelated"].iterdir()) == ["summary.json"]


def test_datasets_listing_finds_only_what_a_run_reads(roots):
    """Case 1: `shiftlab datasets --data ROOT` said "found: ROOT" for every OOD set ROOT does not hold."""
    only, ood = roots["only"], roots["ood"]
    for name in ("inaturalist-ood", "sun-ood", "places-ood", "textures-ood", "ninco", "svhn"):
        assert found_under(name, only) is None, name
        with pytest.raises(DatasetError, match=f"{name}: no folder of it under"):
            build_dataset(name, only)
    assert found_under("places-ood", ood) == {"folder": str(ood / "Places"), "layout": "image files", "images": 2}
    assert "no images in" in found_under("sun-ood", ood)["problem"]
    # the folder itself, named for the set, or chosen by a {dataset} template, is read as before
    assert len(build_dataset("places-ood", ood / "Places")) == 2
    make_image_folder(roots["base"] / "food" / "images", ["x"])     # named as the tail of SUN/images only
    with pytest.raises(DatasetError, match="sun-ood: no folder of it under"):
        build_dataset("sun-ood", roots["base"] / "food" / "images")
    (roots["base"] / "tmpl" / "sun_ood").mkdir(parents=True)
    make_image_folder(roots["base"] / "tmpl" / "sun_ood", ["x"])
    assert len(build_dataset("sun-ood", str(roots["base"] / "tmpl" / "{dataset}"))) == 1


def test_wordnet_id_folders_get_clip_names(roots, tmp_path):
    """Case 2: imagefolder over wnid folders prompted CLIP with 'a photo of a n01443537.'"""
    folder = make_image_folder(tmp_path / "in", ["n01443537", "n01440764"])
    assert build_dataset("imagefolder", folder).classnames == ["tench", "goldfish"]   # sorted folders: n0144076 first
    assert build_dataset("imagefolder", folder, classnames=["a", "b"]).classnames == ["a", "b"]
    make_image_folder(tmp_path / "mixed", ["n01443537", "cat"])
    with pytest.raises(DatasetError, match="1 of its 2 folders are not"):
        build_dataset("imagefolder", tmp_path / "mixed")


def test_class_names_file_drops_a_byte_order_mark(roots):
    """Case 16: a UTF-8 BOM stayed in the first class name ('\\ufeffcat')."""
    import argparse

    from shiftlab.cli import build_parser
    from shiftlab.commands.run import config_from_args
    args = build_parser().parse_args(["run", "--data", str(roots["folder"]), "--dataset", "imagefolder", "--out",
                                      str(roots["base"] / "x"), "--classnames", str(roots["files"] / "bom.txt")])
    assert isinstance(args, argparse.Namespace)
    assert config_from_args(args).classnames == ["cat", "dog", "emu"]


def test_a_folders_own_classnames_txt_is_read_as_utf8_without_its_bom(tmp_path):
    folder = make_image_folder(tmp_path / "f", ["a", "b"])
    (folder / "classnames.txt").write_bytes("\ufeffcat\ndog\n".encode("utf-8"))
    assert build_dataset("imagefolder", folder).classnames == ["cat", "dog"]
    (folder / "classnames.txt").write_bytes("caf\xe9\ndog\n".encode("latin-1"))
    with pytest.raises(DatasetError, match=r"classnames.txt: not UTF-8 text \(byte 0xe9 at offset 3\)"):
        build_dataset("imagefolder", folder)


def test_resume_mismatch_names_the_differing_keys_in_full():
    """Case 6: `tpt: views {"augmix": false, …… -> {"augmix": false, ……` read the same on both sides."""
    from shiftlab.rundir.identity import RunIdentityError, check_resume
    views = {"augmix": False, "crop": "random_resized", "interpolation": "bicubic", "n_views": 64,
             "scale": [0.08, 1.0], "flip": True}
    old = {"shared": {"seed": 0, "open_set": {"ood": ["ninco"], "ratio": 0.5, "seed": 0}},
           "methods": {"tpt": {"lr": 0.005, "views": views}}}
    new = {"shared": {"seed": 0, "open_set": {"ood": ["ninco"], "ratio": 0.25, "seed": 0}},
           "methods": {"tpt": {"lr": 0.005, "views": {**views, "n_views": 8}}}}
    with pytest.raises(RunIdentityError) as err:
        check_resume(Path("r"), old, new)
    text = str(err.value)
    assert "tpt: views.n_views 64 -> 8" in text and "open_set ratio 0.5 -> 0.25" in text and "..." not in text
    long_old = {"shared": {"classnames": [f"class {i}" for i in range(40)]}, "methods": {}}
    long_new = {"shared": {"classnames": [f"class {i}" for i in range(39)] + ["other"]}, "methods": {}}
    with pytest.raises(RunIdentityError) as err:
        check_resume(Path("r"), long_old, long_new)
    shown = str(err.value).split("classnames ", 1)[1].split(" -> ")
    assert '"class 39"' in shown[0] and '"other"' in shown[1]          # the part that differs, both sides


def test_table_label_errors_advise_no_download(tmp_path):
    """Case 21: a parquet table with the wrong class list was answered with `shiftlab download imagenet-a`."""
    pytest.importorskip("pyarrow")
    from shiftlab.engine.config import RunConfig
    from shiftlab.engine.prepare import list_dataset
    from test_tables import write_parquet
    write_parquet(tmp_path / "imagenet-a", [[0]], ["x", "y"])
    dataset, problem = list_dataset(RunConfig(dataset="imagenet-a", data=str(tmp_path)), "imagenet-a")
    assert dataset is None and "not shiftlab's 200 imagenet-a classes in order" in problem
    assert "download" not in problem


@pytest.mark.slow   # open_clip's import, in a fast-tier process that may not have it yet
def test_pretrained_tags_read_without_open_clip_equal_open_clips():
    """The table `--pretrained` is checked against before torch (read from open_clip's pretrained.py with ast;
    the subprocess test above shows no torch is imported) is open_clip's own, tag for tag."""
    import open_clip

    from shiftlab.commands.pretrained_check import _pretrained_table
    table = _pretrained_table()
    listed = {m: open_clip.list_pretrained_tags_by_model(m) for m, _ in open_clip.list_pretrained()}
    assert table is not None and {m: list(tags) for m, tags in table.items()} == listed and len(listed) > 100


def test_out_check_knows_run_and_suite_directories(tmp_path):
    """Case 20's check must not refuse shiftlab's own folders: a killed suite holds only its entries' runs."""
    import argparse

    from shiftlab.commands.data_checks import out_problem
    suite = tmp_path / "suite"
    (suite / "fog-5").mkdir(parents=True)
    (suite / "fog-5" / "run.json").write_text("{}")
    (suite / "fog-5" / "records.jsonl").write_text("{}\n")
    entries = ["fog-5", "snow-5"]
    assert out_problem(argparse.Namespace(out=str(suite), resume=True), entries) is None
    assert "fog-5 already holds records; pass --resume" in out_problem(argparse.Namespace(out=str(suite), resume=False),
                                                                        entries)
    assert "not a shiftlab run directory" in out_problem(argparse.Namespace(out=str(suite), resume=True), None)
    failed = tmp_path / "failed"   # a suite whose first write (suite.json) failed and could not remove its temporary
    failed.mkdir()
    (failed / "suite.json~host~123.shiftlab-tmp").write_text("")
    assert out_problem(argparse.Namespace(out=str(failed), resume=True), entries) is None
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / ".DS_Store").write_text("")
    assert out_problem(argparse.Namespace(out=str(tmp_path / "empty"), resume=False), None) is None
    assert out_problem(argparse.Namespace(out=str(tmp_path / "new"), resume=False), None) is None


def test_download_never_fetches_the_id_set_for_a_missing_ood_set(roots, monkeypatch):
    """With --download, a missing OOD set made `list_dataset` download the run's own dataset again."""
    import shiftlab.engine.prepare as prepare_module
    from shiftlab.engine.config import RunConfig

    def refuse(*args, **kwargs):
        raise AssertionError(f"downloaded {args[0]}")
    monkeypatch.setattr(prepare_module, "_download_dataset", refuse)
    config = RunConfig(dataset="imagenet-r", data=str(roots["only"]), ood=["sun-ood"], download=True)
    dataset, problem = prepare_module.list_dataset(config, "imagenet-r")
    assert dataset is None and "sun-ood: no folder of it under" in problem
    assert "shiftlab download sun-ood" in problem and "shiftlab download imagenet-r" not in problem
