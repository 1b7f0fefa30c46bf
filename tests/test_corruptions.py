"""Common corruptions: generated ones equal the reference package's output for the same seed, in every process;
ImageNet-C and CIFAR-C as their authors ship them; a run over each; the corruption suite's table and mCE;
run.json records the corruption and a resume with another one is refused."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from _imports import lazy_module
from _synthetic import make_imagenet_r, random_image
from shiftlab.cli import main as cli_main
from shiftlab.datasets import DatasetError, build_dataset, classnames
from shiftlab.datasets.corrupted import CorruptedDataset
from shiftlab.datasets.corruptions import (
    COMMON,
    CORRUPTIONS,
    EXTRA,
    corrupt_image,
    corruption_seed,
    prepare_like_imagenet_c,
)
from shiftlab.options import speaking_cli
from shiftlab.results.corruption_table import mean_corruption_error
from shiftlab.rundir import record_files

imagecorruptions = lazy_module("imagecorruptions")   # imported by the first test that reads it


@pytest.fixture(autouse=True)
def _needs_imagecorruptions():
    # every test here is skipped without the package, as the module-level importorskip did, but the ~1 s
    # import happens when a test of this file runs, not when the fast tier is collected
    pytest.importorskip("imagecorruptions")


REPO = Path(__file__).resolve().parents[1]
FAST = ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "motion_blur", "snow", "frost", "fog",
        "contrast", "jpeg_compression", "spatter")


def _reference(img, corruption: str, severity: int, seed: int) -> np.ndarray:
    """imagecorruptions.corrupt called as its README shows, after seeding numpy's global RNG (and handing the two
    functions of the maintained fork that take one their `seed`)."""
    np.random.seed(seed)
    extra = {"seed": seed} if corruption in ("glass_blur", "impulse_noise") else {}
    return np.uint8(imagecorruptions.corrupt(np.asarray(img), severity=severity, corruption_name=corruption, **extra))


def test_the_lists_are_the_papers():
    assert len(COMMON) == 15 and len(EXTRA) == 4
    assert set(CORRUPTIONS) == set(imagecorruptions.get_corruption_names("all"))
    assert list(EXTRA) == imagecorruptions.get_corruption_names("validation")


@pytest.mark.parametrize("corruption", FAST)
def test_generated_corruption_equals_imagecorruptions(corruption):
    img = random_image((48, 40), 3)
    seed = corruption_seed(0, 7, corruption, 5)
    state = np.random.get_state()
    got = np.asarray(corrupt_image(img, corruption, 5, seed))
    assert np.array_equal(np.random.get_state()[1], state[1])           # the global RNG is left as it was
    want = _reference(img, corruption, 5, seed)
    assert got.dtype == np.uint8 and got.shape == (40, 48, 3)
    assert np.array_equal(got, want)
    assert not np.array_equal(got, np.asarray(img))                     # it did corrupt


@pytest.mark.slow
def test_glass_blur_equals_imagecorruptions_with_its_seed():
    """glass_blur is compiled by numba on its first call in a process (seconds) and draws from numba's own RNG,
    seeded through the fork's `seed` argument."""
    img = random_image((40, 32), 5)
    seed = corruption_seed(0, 1, "glass_blur", 2)
    got = np.asarray(corrupt_image(img, "glass_blur", 2, seed))
    assert np.array_equal(got, _reference(img, "glass_blur", 2, seed))
    assert np.array_equal(got, np.asarray(corrupt_image(img, "glass_blur", 2, seed)))
    assert not np.array_equal(got, np.asarray(corrupt_image(img, "glass_blur", 2, seed + 1)))


def test_the_seed_depends_on_each_of_its_four_parts():
    base = corruption_seed(0, 1, "fog", 5)
    assert base == corruption_seed(0, 1, "fog", 5) and 0 <= base < 2 ** 32
    assert len({base, corruption_seed(1, 1, "fog", 5), corruption_seed(0, 2, "fog", 5),
                corruption_seed(0, 1, "snow", 5), corruption_seed(0, 1, "fog", 4)}) == 5


def test_corrupted_dataset_is_imagenet_c_crop_then_the_reference(tmp_path):
    base = build_dataset("imagenet-r", make_imagenet_r(tmp_path, classes=range(3), size=(70, 50)))
    corrupted = CorruptedDataset(base, "gaussian_noise", 3, seed=11)
    assert corrupted.samples == base.samples and corrupted.classnames == base.classnames
    for i in range(len(base)):
        crop = prepare_like_imagenet_c(base.image(i))
        assert crop.size == (224, 224)
        want = _reference(crop, "gaussian_noise", 3, corruption_seed(11, i, "gaussian_noise", 3))
        assert np.array_equal(np.asarray(corrupted.image(i)), want)
    # two samples of the same picture would still get different noise: each sample its own seed
    a, b = (np.asarray(corrupted.image(i)).astype(int) - np.asarray(prepare_like_imagenet_c(base.image(i))) for i in
            (0, 1))
    assert not np.array_equal(a, b)
    assert corrupted.corruption_info == {"name": "gaussian_noise", "severity": 3, "source": "generated", "seed": 11,
                                         "package": corrupted.corruption_info["package"],
                                         "prepare": "resize 256, centre crop 224"}
    assert corrupted.corruption_info["package"].startswith("imagecorruptions")


_DIGESTS = """
import hashlib, sys
from shiftlab.datasets import build_dataset
from shiftlab.datasets.corrupted import CorruptedDataset
base = build_dataset("imagenet-r", sys.argv[1])
for name in sys.argv[2].split(","):
    d = CorruptedDataset(base, name, 5, seed=3)
    print(name, [hashlib.sha256(d.image(i).tobytes()).hexdigest()[:16] for i in range(len(d))])
"""


@pytest.mark.slow
def test_generated_corruptions_are_identical_across_processes(tmp_path):
    data = make_imagenet_r(tmp_path, classes=range(2), size=(40, 30))
    names = "gaussian_noise,impulse_noise,frost,snow"   # numpy's global RNG, skimage's seed, a file picked, motion
    env = {"PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    outs = [subprocess.run([sys.executable, "-c", _DIGESTS, str(data), names], capture_output=True, text=True,
                           env=env, timeout=300) for _ in range(2)]
    assert all(o.returncode == 0 for o in outs), outs[0].stderr[-2000:]
    assert outs[0].stdout == outs[1].stdout and len(outs[0].stdout.splitlines()) == 4
    base = build_dataset("imagenet-r", data)
    here = "".join(f"{n} {[hashlib.sha256(CorruptedDataset(base, n, 5, seed=3).image(i).tobytes()).hexdigest()[:16] for i in range(len(base))]}\n"  # noqa: E501
                   for n in names.split(","))
    assert here == outs[0].stdout


# ------------------------------------------------------------------ stored layouts

def make_imagenet_c(root: Path, corruptions=("gaussian_noise", "fog"), severities=(5,), labels=(0, 1, 2)) -> Path:
    """`root/imagenet-c/<corruption>/<severity>/<wnid>/` with all 1000 class folders, a few holding an image."""
    from shiftlab.datasets.classes import imagenet_wnids
    wnids = imagenet_wnids()
    folder = root / "imagenet-c"
    for c in corruptions:
        for s in severities:
            for label, wnid in enumerate(wnids):
                (folder / c / str(s) / wnid).mkdir(parents=True, exist_ok=True)
                if label in labels:
                    random_image((32, 32), 100 * s + label).save(folder / c / str(s) / wnid / f"{c}_{label}.png")
    return folder


def make_cifar_c(root: Path, name="CIFAR-10-C", corruptions=("gaussian_noise", "fog"), per_severity=4) -> Path:
    """CIFAR-10-C's files, smaller: <corruption>.npy (5 x per_severity, 32, 32, 3) uint8 and labels.npy."""
    folder = root / name
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for c in corruptions:
        np.save(folder / f"{c}.npy", rng.integers(0, 256, (5 * per_severity, 32, 32, 3), dtype=np.uint8))
    np.save(folder / "labels.npy", np.tile(np.arange(per_severity) % 10, 5).astype(np.int64))
    return folder


def test_imagenet_c_layout_is_one_dataset_per_corruption_and_severity(tmp_path):
    make_imagenet_c(tmp_path, severities=(3, 5))
    d = build_dataset("imagenet-c", tmp_path, corruption="fog", severity=3)
    assert d.root == tmp_path / "imagenet-c" / "fog" / "3" and len(d) == 3 and len(d.classnames) == 1000
    assert d.corruption_info == {"name": "fog", "severity": 3, "source": "stored"}
    assert [label for _, label in d.samples] == [0, 1, 2]
    with pytest.raises(DatasetError, match=r"choose one with corruption=NAME severity=1..5 \(found under .*: "
                                           r"gaussian_noise, fog\)"):
        build_dataset("imagenet-c", tmp_path)
    with speaking_cli(), pytest.raises(DatasetError, match=r"choose one with --corruption NAME --severity 1..5 "):
        build_dataset("imagenet-c", tmp_path)
    with pytest.raises(DatasetError, match=r"no fog/1 folder .*found corruptions: gaussian_noise, fog"):
        build_dataset("imagenet-c", tmp_path, corruption="fog", severity=1)


def test_cifar_c_rows_are_severity_blocks(tmp_path):
    folder = make_cifar_c(tmp_path)
    array = np.load(folder / "fog.npy")
    d = build_dataset("cifar10-c", tmp_path, corruption="fog", severity=2)
    assert len(d) == 4 and d.classnames == classnames("cifar10-c") and d.classnames[0] == "airplane"
    for k in range(4):
        assert np.array_equal(np.asarray(d.image(k)), array[4 + k])      # row (severity - 1) * n + k
    assert d.samples[3] == ("fog.npy/2/3", 3)
    np.save(folder / "labels.npy", np.arange(7))
    with pytest.raises(DatasetError, match="labels.npy has 7 labels for the 20 images of fog.npy"):
        build_dataset("cifar10-c", tmp_path, corruption="fog", severity=2)


def test_shiftlab_datasets_lists_the_stored_corruptions(tmp_path, capsys):
    make_imagenet_c(tmp_path, corruptions=("fog",))
    make_cifar_c(tmp_path, corruptions=("snow",))
    assert cli_main(["datasets", "--data", str(tmp_path), "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["imagenet-c"]["corruptions"] == ["fog"] and rows["cifar10-c"]["corruptions"] == ["snow"]
    assert "<corruption>/<severity 1-5>/" in rows["imagenet-c"]["layout"]
    assert rows["cifar10-c"]["download"] == "shiftlab download" and "cifar100-c" in rows


def test_mce_is_hendrycks_ratio_of_summed_errors():
    errors = {"fog": {1: 20.0, 2: 40.0}, "snow": {1: 50.0, 2: 50.0}}
    reference = {"fog": {1: 30.0, 2: 30.0}, "snow": {1: 50.0, 2: 150.0}}
    assert mean_corruption_error(errors, reference) == pytest.approx(100 * (60 / 60 + 100 / 200) / 2)
    assert mean_corruption_error(errors, errors) == pytest.approx(100.0)
    assert mean_corruption_error(errors, {"fog": {1: 0.0, 2: 0.0}, "snow": {1: 1.0, 2: 1.0}}) is None


# ------------------------------------------------------------------ runs

def _run(data, ckpt, out, *extra):
    return cli_main(["run", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained", str(ckpt),
                     "--views", "2", "--workers", "0", "--no-progress", "--out", str(out), "--allow-partial",
                     "--batch-size", "4", *extra])


def _records(out: Path) -> dict:
    return {(r["id"], r["method"]): r for r in record_files.iter_records(out / "records.jsonl")}


@pytest.mark.slow
def test_a_generated_corruption_runs_as_the_same_images_stored(tmp_path, tiny_checkpoint):
    """A run with --corruption on imagenet-r gives the records of a clean run over those corrupted images
    written to disk (PNG, lossless): the corrupted image is the sample the views are drawn from."""
    data = make_imagenet_r(tmp_path / "data", classes=range(0, 200, 50), size=(60, 48))
    assert _run(tmp_path / "data", tiny_checkpoint, tmp_path / "gen", "--dataset", "imagenet-r", "--methods",
                "zeroshot,mta", "--views", "6", "--corruption", "contrast", "--severity", "4", "--seed", "2") == 0
    corrupted = CorruptedDataset(build_dataset("imagenet-r", data), "contrast", 4, seed=2)
    copy = tmp_path / "copy" / "imagenet-r"
    for i, (path, _) in enumerate(corrupted.samples):
        target = (copy / path).with_suffix(".png")    # lossless; the same order of samples
        target.parent.mkdir(parents=True, exist_ok=True)
        corrupted.image(i).save(target)
    for folder in (data.iterdir()):
        (copy / folder.name).mkdir(parents=True, exist_ok=True)
    assert _run(tmp_path / "copy", tiny_checkpoint, tmp_path / "disk", "--dataset", "imagenet-r", "--methods",
                "zeroshot,mta", "--views", "6", "--seed", "2") == 0
    gen, disk = _records(tmp_path / "gen"), _records(tmp_path / "disk")
    assert set(gen) == set(disk) and len(gen) == 8
    for key in gen:
        assert gen[key]["pred"] == disk[key]["pred"]
        assert gen[key]["confidence"] == disk[key]["confidence"] and gen[key]["top5"] == disk[key]["top5"]
    shared = json.loads((tmp_path / "gen" / "run.json").read_text())["shared"]
    assert shared["corruption"]["name"] == "contrast" and shared["corruption"]["severity"] == 4
    assert shared["corruption"]["source"] == "generated" and shared["corruption"]["seed"] == 2
    assert json.loads((tmp_path / "disk" / "run.json").read_text())["shared"]["corruption"] is None
    assert "contrast severity 4 (generated)" in (tmp_path / "gen" / "summary.md").read_text()


@pytest.mark.slow
def test_resume_with_another_corruption_is_refused_naming_it(tmp_path, tiny_checkpoint, capsys):
    data = tmp_path / "data"
    make_imagenet_r(data, classes=range(0, 200, 50), size=(40, 30))
    base = ["--dataset", "imagenet-r", "--methods", "zeroshot", "--limit", "2"]
    assert _run(data, tiny_checkpoint, tmp_path / "r", *base, "--corruption", "fog") == 0
    capsys.readouterr()
    for change, words in ((["--corruption", "fog", "--severity", "3"], "corruption severity 5 -> 3"),
                          (["--corruption", "snow"], 'corruption name "fog" -> "snow"'),
                          (["--corruption", "fog", "--seed", "1"], "corruption seed 0 -> 1"),
                          ([], "corruption {")):
        assert _run(data, tiny_checkpoint, tmp_path / "r", *base, *change, "--resume") == 2
        err = capsys.readouterr().err
        assert words in err and "these define a different stream of samples" in err, err
    # the same corruption resumes (and raising --limit finishes the run)
    assert _run(data, tiny_checkpoint, tmp_path / "r", *base[:-1], "4", "--corruption", "fog", "--resume") == 0
    assert len(_records(tmp_path / "r")) == 4


@pytest.mark.slow
def test_a_run_from_a_stored_imagenet_c_layout(tmp_path, tiny_checkpoint):
    make_imagenet_c(tmp_path, corruptions=("gaussian_noise",))
    assert _run(tmp_path, tiny_checkpoint, tmp_path / "run", "--dataset", "imagenet-c", "--corruption",
                "gaussian_noise", "--methods", "zeroshot") == 0
    recs = _records(tmp_path / "run")
    assert sorted(r["path"] for r in recs.values())[0].endswith("gaussian_noise_0.png") and len(recs) == 3
    shared = json.loads((tmp_path / "run" / "run.json").read_text())["shared"]
    assert shared["corruption"] == {"name": "gaussian_noise", "severity": 5, "source": "stored"}


def test_stored_sets_need_a_corruption_and_ood_sets_are_not_runs(tmp_path, capsys):
    assert cli_main(["run", "--dataset", "imagenet-c", "--data", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "choose one with --corruption NAME --severity 1..5, or run them all with --suite corruption" in \
        capsys.readouterr().err
    assert cli_main(["run", "--dataset", "ninco", "--data", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "it is an out-of-distribution set" in capsys.readouterr().err
    assert cli_main(["run", "--data", str(tmp_path), "--out", str(tmp_path / "o"), "--severity", "all"]) == 2
    assert "--severity all runs every severity as a suite" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["run", "--data", str(tmp_path), "--out", str(tmp_path / "o"), "--corruption", "rain"])
    assert "unknown corruption 'rain'" in capsys.readouterr().err


@pytest.mark.slow
def test_corruption_suite_table_from_cifar_c(tmp_path, tiny_checkpoint):
    make_cifar_c(tmp_path, corruptions=("gaussian_noise", "fog", "snow"))
    out = tmp_path / "suite"
    assert _run(tmp_path, tiny_checkpoint, out, "--suite", "corruption", "--dataset", "cifar10-c",
                "--corruptions", "gaussian_noise,fog", "--severity", "all", "--methods", "zeroshot,tda") == 0
    entries = [f"{c}-{s}" for c in ("gaussian_noise", "fog") for s in range(1, 6)]
    manifest = json.loads((out / "suite.json").read_text())
    assert manifest["datasets"] == entries and manifest["kind"] == "corruption" and manifest["base"] == "cifar10-c"
    top1 = {e: json.loads((out / e / "summary.json").read_text())["methods"] for e in entries}
    for e in entries:
        shared = json.loads((out / e / "run.json").read_text())["shared"]
        c, s = e.rsplit("-", 1)
        assert shared["corruption"] == {"name": c, "severity": int(s), "source": "stored"}
    md = (out / "suite.md").read_text()
    assert "| method | gaussian_noise | fog | mean | mCE |" in md

    def acc(m, c):
        return sum(top1[f"{c}-{s}"][m]["top1"] for s in range(1, 6)) / 5

    def ce(m, c):
        return (sum(100 - top1[f"{c}-{s}"][m]["top1"] for s in range(1, 6))
                / sum(100 - top1[f"{c}-{s}"]["zeroshot"]["top1"] for s in range(1, 6)))
    for m in ("zeroshot", "tda"):
        accs = [acc(m, c) for c in ("gaussian_noise", "fog")]
        mce = 100 * (ce(m, "gaussian_noise") + ce(m, "fog")) / 2
        row = f"| {m} | {accs[0]:.2f} | {accs[1]:.2f} | {sum(accs) / 2:.2f} | {mce:.2f} |"
        assert row in md, (row, md)
    assert "| zeroshot |" in md and md.count("100.00 |") >= 1
    rows = (out / "suite.csv").read_text().splitlines()
    assert rows[0].startswith("suite,kind,method") and any(",mce," in r for r in rows)
    # the report's suite section shows the same table (its page is built from these sections)
    from shiftlab.report.data import ReportData
    from shiftlab.report.sections import suite_section
    from shiftlab.results.suite_table import suite_table
    _, _, html = suite_section(ReportData([], {}, [], tmp_path, 20, 0, [suite_table(out)]))
    assert "mean corruption error with zero-shot CLIP as the reference" in html and ">mCE<" in html
    assert ">gaussian_noise<" in html and ">fog<" in html


@pytest.mark.slow
def test_corruption_suite_of_every_method_from_generated_corruptions(tmp_path, tiny_checkpoint):
    """The issue's command, `--suite corruption --methods all`, over corruptions generated from an ImageNet-layout
    folder: every registered method gets a row of accuracies, a mean and an mCE (zero-shot's own is 100)."""
    import shiftlab
    make_imagenet_r(tmp_path, classes=range(0, 200, 50), size=(48, 40))
    rlcf = [f"rlcf.{k}={v}" for k, v in {"reward_model": "shiftlab-tiny", "reward_pretrained": "none",
                                         "reward_seed": 1}.items()]   # its offline stand-in: no download
    # COSMIC's offline DINOv2 (random weights, the small architecture)
    rlcf += ["cosmic.dino_pretrained=none", "cosmic.dino_model=vit_small_patch14_reg4_dinov2"]
    rlcf += ["difftpt.n_diffusion=0"]   # DiffTPT without a folder of generated views (else `all` leaves it out)
    out = tmp_path / "suite"
    assert _run(tmp_path, tiny_checkpoint, out, "--suite", "corruption", "--dataset", "imagenet-r", "--corruptions",
                "fog,contrast", "--methods", "all", "--views", "8", *[a for s in rlcf for a in ("--set", s)]) == 0
    for entry in ("fog-5", "contrast-5"):
        shared = json.loads((out / entry / "run.json").read_text())["shared"]
        assert shared["corruption"]["source"] == "generated" and f"{shared['corruption']['name']}-5" == entry
    md = (out / "suite.md").read_text()
    rows = {line.split(" | ")[0].strip("| "): line for line in md.splitlines() if line.startswith("| ")}
    from shiftlab.methods.base import get_method_class
    resnet = [n for n in shiftlab.list_methods() if "resnet" in get_method_class(n).spec.towers]
    assert not set(shiftlab.list_methods()) - set(resnet) & set(rows)   # ViT-only methods (TCA) left out of `all`
    for name in resnet:   # every method that runs on the tiny ResNet
        cells = rows[name].strip("| ").split(" | ")
        assert len(cells) == 5 and all(c != "—" for c in cells[1:]), rows[name]   # fog, contrast, mean, mCE
    assert rows["zeroshot"].rstrip(" |").endswith("100.00")


@pytest.mark.slow
@pytest.mark.parametrize("which", ["generated", "cifar-c"])
def test_corrupted_samples_are_read_back_from_a_feature_store(tmp_path, tiny_checkpoint, capsys, which):
    """A corruption made on the fly (its samples are the clean files, the key names the corruption) and
    CIFAR-C's array rows (their identity is the row's pixels) are stored once and read back."""
    if which == "generated":
        make_imagenet_r(tmp_path / "data", classes=range(0, 200, 50), size=(60, 48))
        flags = ["--dataset", "imagenet-r", "--corruption", "contrast", "--severity", "4"]
    else:
        make_cifar_c(tmp_path / "data")
        flags = ["--dataset", "cifar10-c", "--corruption", "fog", "--severity", "2"]
    store = ["--features", str(tmp_path / "fs"), "--features-dtype", "fp32", "--methods", "zeroshot"]
    for k, said in enumerate(["0 sample(s) read from the store", "4 sample(s) read from the store"]):
        capsys.readouterr()
        assert _run(tmp_path / "data", tiny_checkpoint, tmp_path / f"run{k}", *flags, *store) == 0
        assert said in capsys.readouterr().err
    assert _records(tmp_path / "run0").keys() == _records(tmp_path / "run1").keys()
