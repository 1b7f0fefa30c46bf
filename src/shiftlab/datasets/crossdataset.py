"""The ten cross-dataset sets of the TPT line of papers, with CoOp's test splits.

Each set is read from CoOp's split file ``split_zhou_<Name>.json`` (``{"test": [[path, label,
classname], ...], ...}``, paths relative to the set's image folder) except FGVCAircraft, whose test
split is the dataset's own ``images_variant_test.txt``. Class names are TPT's lists
(``data/crossdataset_classes.json``), indexed by the split's labels.

Where things are looked for (so that CoOp's, TPT's and CLIP_benchmark's folder layouts all work with
just the data root):

- the set's folder: ``root`` itself, or ``root/<d>`` for each of ``DatasetSpec.dirnames`` (CoOp's name
  first, e.g. ``oxford_flowers``, then TPT's ``ID_to_DIRNAME`` name ``Flower102``, then
  CLIP_benchmark's ``flowers``);
- the image folder inside it: each of ``SplitLayout.image_dirs`` (CoOp's ``jpg``, torchvision's
  ``flowers-102/jpg``, ...); the first one holding the split's first test image wins;
- the split file: in the set's folder, in ``root``, ``root/data_splits`` (TPT's and DMN's
  ``data/data_splits``), ``root/splits``, the folder above ``root``, and ``$SHIFTLAB_SPLITS``.

Every test image must exist; missing ones are dropped, counted in ``warnings`` and
``FolderDataset.missing_samples`` (``require_complete`` refuses more than a few percent).
"""
from __future__ import annotations

import functools
import json
import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PureWindowsPath

from .folders import DATASETS, DatasetError, DatasetSpec, FolderDataset, format_listing, is_inside

__all__ = ["SplitLayout", "SplitFileMissing", "CROSS_DATASETS", "build_split_dataset", "crossdataset_classnames"]

_CLASSES_FILE = "crossdataset_classes.json"
_COOP_DATASETS_MD = "https://github.com/KaiyangZhou/CoOp/blob/main/DATASETS.md"


class SplitFileMissing(DatasetError):
    """The images may be there, but CoOp's split file was not found."""


@dataclass(frozen=True)
class SplitLayout:
    """Where a cross-dataset set's test split and images are.

    ``split_file``: CoOp's split file name (None: FGVCAircraft's own ``images_variant_test.txt``);
    ``image_dirs``: candidate image folders relative to the set's folder, the split's paths start
    there; ``test_size``: the number of test images in CoOp's split (another count = another file).
    """

    split_file: str | None
    image_dirs: tuple[str, ...]
    test_size: int


@functools.cache
def _class_table() -> dict[str, tuple[str, ...]]:
    text = resources.files("shiftlab").joinpath("data", _CLASSES_FILE).read_text(encoding="utf-8")
    return {k: tuple(v) for k, v in json.loads(text).items() if not k.startswith("_")}


def crossdataset_classnames(name: str) -> list[str]:
    """The class names of a cross-dataset set in label order, '_' replaced by ' ' (as the methods' code does)."""
    return [c.replace("_", " ") for c in _class_table()[DATASETS.canonical(name)]]


def _vgg(path: str) -> str:
    return f"https://www.robots.ox.ac.uk/~vgg/data/{path}"


def _manual(what: str) -> str:
    return (what + " Put the result so that {target} holds it (see docs/DATA.md for the layout), "
            "and CoOp's split file next to it (" + _COOP_DATASETS_MD + ").")


# (name, aliases, dirnames, layout, num_classes, url, archive_name, manual)
CROSS_DATASETS: tuple[DatasetSpec, ...] = (
    DatasetSpec("flowers102", 102, "split", ("oxford_flowers", "Flower102", "flowers", "flowers102"),
                url=_vgg("flowers/102/102flowers.tgz"), archive_name="102flowers.tgz",
                split=SplitLayout("split_zhou_OxfordFlowers.json", ("jpg", "flowers-102/jpg", ""), 2463)),
    DatasetSpec("dtd", 47, "split", ("dtd", "DTD"),
                url=_vgg("dtd/download/dtd-r1.0.1.tar.gz"), archive_name="dtd-r1.0.1.tar.gz",
                split=SplitLayout("split_zhou_DescribableTextures.json",
                                  ("images", "dtd/images", "dtd/dtd/images", ""), 1692)),
    DatasetSpec("oxford-pets", 37, "split", ("oxford_pets", "OxfordPets", "pets"),
                url=_vgg("pets/data/images.tar.gz"), archive_name="oxford_pets_images.tar.gz",
                split=SplitLayout("split_zhou_OxfordPets.json", ("images", "oxford-iiit-pet/images", ""), 3669)),
    DatasetSpec("stanford-cars", 196, "split", ("stanford_cars", "StanfordCars", "cars"),
                manual=_manual("Stanford Cars' original download (ai.stanford.edu/~jkrause/cars) is offline; "
                               "get cars_test/ (8,041 images) from a mirror such as Kaggle's "
                               "'jessicali9530/stanford-cars-dataset'."),
                split=SplitLayout("split_zhou_StanfordCars.json", ("", "stanford_cars"), 8041)),
    DatasetSpec("ucf101", 101, "split", ("ucf101", "UCF101"),
                manual=_manual("UCF101 is used as CoOp's middle frames of each video: download "
                               "UCF-101-midframes.zip from the Google Drive link in CoOp's DATASETS.md and unzip it."),
                split=SplitLayout("split_zhou_UCF101.json", ("UCF-101-midframes", ""), 3783)),
    DatasetSpec("caltech101", 100, "split", ("caltech-101", "Caltech101", "caltech101"),
                manual=_manual("Caltech101 is published as a zip holding another archive "
                               "(data.caltech.edu/records/mzrjq-6wc02): extract 101_ObjectCategories.tar.gz from it."),
                split=SplitLayout("split_zhou_Caltech101.json",
                                  ("101_ObjectCategories", "caltech101/101_ObjectCategories", ""), 2465)),
    DatasetSpec("food101", 101, "split", ("food-101", "Food101", "food101"),
                url="http://data.vision.ee.ethz.ch/cvl/food-101.tar.gz", archive_name="food-101.tar.gz",
                split=SplitLayout("split_zhou_Food101.json", ("images", "food-101/images", ""), 30300)),
    DatasetSpec("sun397", 397, "split", ("sun397", "SUN397"),
                url="http://vision.princeton.edu/projects/2010/SUN/SUN397.tar.gz", archive_name="SUN397.tar.gz",
                split=SplitLayout("split_zhou_SUN397.json", ("SUN397", ""), 19850)),
    DatasetSpec("fgvc-aircraft", 100, "split", ("fgvc_aircraft", "fgvc-aircraft-2013b/data", "fgvc-aircraft"),
                url=_vgg("fgvc-aircraft/archives/fgvc-aircraft-2013b.tar.gz"),
                archive_name="fgvc-aircraft-2013b.tar.gz",
                split=SplitLayout(None, ("", "fgvc-aircraft-2013b/data", "data"), 3333)),
    DatasetSpec("eurosat", 10, "split", ("eurosat", "EuroSAT"),
                url="https://huggingface.co/datasets/torchgeo/eurosat/resolve/"
                    "c877bcd43f099cd0196738f714544e355477f3fd/EuroSAT.zip", archive_name="EuroSAT.zip",
                split=SplitLayout("split_zhou_EuroSAT.json", ("2750", "eurosat/2750", ""), 8100)),
)

# CLIP_benchmark's and TPT's names (and CoOp's class names) for the same sets; '_' and '-' are one.
_ALIASES = {
    "flowers102": ("flowers", "flower102", "oxford-flowers", "oxfordflowers", "flowers-102"),
    "dtd": ("describabletextures", "describable-textures"),
    "oxford-pets": ("pets", "oxfordpets", "oxford-iiit-pet"),
    "stanford-cars": ("cars", "stanfordcars"),
    "ucf101": ("ucf-101",),
    "caltech101": ("caltech-101",),
    "food101": ("food-101",),
    "sun397": ("sun-397",),
    "fgvc-aircraft": ("aircraft", "fgvcaircraft"),
    "eurosat": ("euro-sat",),
}

for _spec in CROSS_DATASETS:
    DATASETS.register(_spec.name, _spec, aliases=_ALIASES[_spec.name])


# ------------------------------------------------------------------------------------------ building

def _existing(paths: Sequence[Path]) -> list[Path]:
    seen, out = set(), []
    for p in paths:
        if p not in seen and p.is_dir():
            seen.add(p)
            out.append(p)
    return out


def dataset_dirs(spec: DatasetSpec, root: Path) -> list[Path]:
    """Existing candidate folders of the set: ``root/<dirname>`` for each dirname, then ``root`` itself."""
    return _existing([root / d for d in spec.dirnames] + [root])


def split_file_places(spec: DatasetSpec, root: Path, extra: Sequence[Path] = ()) -> list[Path]:
    """Where ``split_zhou_<Name>.json`` is looked for, in order."""
    env = os.environ.get("SHIFTLAB_SPLITS")
    places = [*dataset_dirs(spec, root), *extra, root, root / "data_splits", root / "splits", root.parent]
    return _existing([*places, *([Path(env).expanduser()] if env else [])])


def _find_split_file(spec: DatasetSpec, root: Path, extra: Sequence[Path] = ()) -> Path:
    places = split_file_places(spec, root, extra)
    for place in places:
        if (place / spec.split.split_file).is_file():
            return place / spec.split.split_file
    target = root / spec.dirnames[0]
    raise SplitFileMissing(
        f"{spec.name}: CoOp's split file {spec.split.split_file} was not found (looked in "
        f"{', '.join(str(p) for p in places) or root}); download it from the link in {_COOP_DATASETS_MD} "
        f"and put it in {target}/ or {root}/")


def _read_split(path: Path, spec: DatasetSpec) -> list[tuple[str, int]]:
    try:
        test = json.loads(path.read_text(encoding="utf-8"))["test"]
        samples = [(str(item[0]), int(item[1])) for item in test]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise DatasetError(f"{spec.name}: {path} is not a CoOp split file ({exc.__class__.__name__}: {exc})") from None
    _check_test_split(spec, samples, path)
    return samples


def _read_aircraft_split(data_dir: Path, spec: DatasetSpec, classnames: Sequence[str]) -> list[tuple[str, int]]:
    path = data_dir / "images_variant_test.txt"
    index = {name: i for i, name in enumerate(classnames)}
    samples, unknown = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        image_id, _, variant = line.strip().partition(" ")
        if not image_id:
            continue
        if variant not in index:
            unknown.append(variant)
            continue
        samples.append((f"images/{image_id}.jpg", index[variant]))
    if unknown:
        raise DatasetError(
            f"{spec.name}: {path} names variants that are not FGVCAircraft's 100: {format_listing(unknown)}")
    _check_test_split(spec, samples, path)
    return samples


def _check_test_split(spec: DatasetSpec, samples: list[tuple[str, int]], path: Path) -> None:
    bad = [label for _, label in samples if not 0 <= label < spec.num_classes]
    if bad:
        raise DatasetError(f"{spec.name}: {path} has labels outside 0..{spec.num_classes - 1}: {format_listing(bad)}")
    if len(samples) != spec.split.test_size:
        raise DatasetError(f"{spec.name}: {path} lists {len(samples)} test images, CoOp's test split has "
                           f"{spec.split.test_size}; is it the right file?")


def _refuse_outside(spec: DatasetSpec, split_path: Path, listed: list[tuple[str, int]],
                    image_dir: Path | None) -> None:
    """A split file may only name images inside the image folder, resolved (the folder scan's
    rule, ``is_inside``): no absolute path, no ``..`` out of it, no symlink leading out. With
    ``image_dir`` None the names alone are checked, before any is looked up on disk."""
    base = os.path.realpath(image_dir) if image_dir is not None else None
    parents: dict[str, str] = {}          # each folder resolved once (30,000 entries share ~100)
    for rel, _ in listed:
        name = rel.replace("\\", "/")
        norm = posixpath.normpath(name)
        bad = posixpath.isabs(name) or PureWindowsPath(rel).drive != "" or norm == ".." or norm.startswith("../")
        if bad or base is None:
            pass
        elif ".." in name.split("/"):     # '..' after a symlink: only the OS's resolution is right
            bad = not is_inside(base, os.path.realpath(os.path.join(base, name)))
        else:
            folder, leaf = posixpath.split(norm)
            if folder not in parents:
                parents[folder] = os.path.realpath(os.path.join(base, folder))
            target = os.path.join(parents[folder], leaf)
            bad = not is_inside(base, os.path.realpath(target) if os.path.islink(target) else target)
        if bad:
            raise DatasetError(f"{spec.name}: {split_path} lists {rel!r}, which is outside the image folder "
                               f"{image_dir or 'of the dataset'}; refusing to read it")


def _find_image_dir(spec: DatasetSpec, root: Path, probe: str, what: str) -> Path:
    tried = []
    for base in dataset_dirs(spec, root):
        for sub in spec.split.image_dirs:
            candidate = base / sub if sub else base
            tried.append(candidate)
            if (candidate / probe).exists():
                return candidate
    raise DatasetError(f"{spec.name}: {what} {probe!r} is in none of: {format_listing([str(p) for p in tried])}"
                       + (f"; get the images with: shiftlab download {spec.name} --root {root}" if spec.url else
                          f" ({spec.manual.format(target=root / spec.dirnames[0])})" if spec.manual else ""))


def build_split_dataset(spec: DatasetSpec, root: str | os.PathLike, classnames: Sequence[str] | None = None,
                        split_places: Sequence[Path] = ()) -> FolderDataset:
    """List one cross-dataset set's test split under ``root`` (its folder or the data root)."""
    root = Path(root).expanduser()
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise DatasetError(f"{spec.name} root {what}: {root}")
    default_names = crossdataset_classnames(spec.name)
    if spec.split.split_file is None:  # FGVCAircraft: its own test list, next to images/
        image_dir = _find_image_dir(spec, root, "images_variant_test.txt", "FGVCAircraft's test list")
        split_path = image_dir / "images_variant_test.txt"
        listed = _read_aircraft_split(image_dir, spec, _class_table()[spec.name])
    else:
        split_path = _find_split_file(spec, root, split_places)
        listed = _read_split(split_path, spec)
        _refuse_outside(spec, split_path, listed, None)
        image_dir = _find_image_dir(spec, root, listed[0][0], "the split's first test image")
    _refuse_outside(spec, split_path, listed, image_dir)

    classnames = list(default_names if classnames is None else classnames)
    if len(classnames) != spec.num_classes:
        raise DatasetError(f"{spec.name}: got {len(classnames)} class names for {spec.num_classes} classes")
    present = [(rel, label) for rel, label in listed if (image_dir / rel).is_file()]
    missing = len(listed) - len(present)
    if not present:
        raise DatasetError(f"{spec.name}: none of the {len(listed)} test images is in {image_dir}")
    present.sort()
    have = {label for _, label in present}
    empty = [classnames[c] for c in range(spec.num_classes) if c not in have]
    warnings = []
    if missing:
        warnings.append(f"{missing} of {len(listed)} test images are missing from {image_dir}")
    if empty:
        warnings.append(f"{len(empty)} of {spec.num_classes} classes have no test image: {format_listing(empty)}")
    return FolderDataset(root=image_dir, samples=present, classnames=classnames, wnids=None, name=spec.name,
                         warnings=warnings, empty_classes=empty, missing_samples=missing)
