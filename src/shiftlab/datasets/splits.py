"""The "split" layout: a test split listed in a file, as the ten cross-dataset sets of the TPT line of
papers are read with CoOp's test splits (their entries: datasets/specs.py).

Each set is read from CoOp's split file ``split_zhou_<Name>.json`` (``{"test": [[path, label,
classname], ...], ...}``, paths relative to the set's image folder) except FGVCAircraft, whose test
split is the dataset's own ``images_variant_test.txt``. Class names are the spec's class file
(TPT's lists), indexed by the split's labels.

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

import json
import os
import posixpath
from collections.abc import Sequence
from pathlib import Path, PureWindowsPath

from .base import IMAGE_EXTENSIONS, ClassNamesError, DatasetError, FolderDataset, format_listing, is_inside
from .classes import raw_names
from .specs import COOP_DATASETS_MD, DatasetSpec

__all__ = ["SplitFileMissing", "build_split_dataset", "dataset_dirs", "split_images_in"]


class SplitFileMissing(DatasetError):
    """The images may be there, but CoOp's split file was not found."""


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


def split_images_in(spec: DatasetSpec, folder: Path) -> bool:
    """Whether one of the set's candidate image folders under ``folder`` holds at least one image."""
    for base in dataset_dirs(spec, folder):
        for sub in spec.split.image_dirs:
            candidate = base / sub if sub else base
            if sub and candidate.is_dir():
                for _dirpath, _dirs, files in os.walk(candidate):
                    if any(os.path.splitext(f)[1].lower() in IMAGE_EXTENSIONS for f in files):
                        return True
    return False


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
        f"{', '.join(str(p) for p in places) or root}); download it from the link in {COOP_DATASETS_MD} "
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
    n = spec.num_classes
    bad = [label for _, label in samples if not 0 <= label < n]
    if bad:
        raise DatasetError(f"{spec.name}: {path} has labels outside 0..{n - 1}: {format_listing(bad)}")
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
    default_names = spec.classnames()
    if spec.split.split_file is None:  # FGVCAircraft: its own test list, next to images/
        image_dir = _find_image_dir(spec, root, "images_variant_test.txt", "FGVCAircraft's test list")
        split_path = image_dir / "images_variant_test.txt"
        listed = _read_aircraft_split(image_dir, spec, raw_names(spec.classes))
    else:
        split_path = _find_split_file(spec, root, split_places)
        listed = _read_split(split_path, spec)
        _refuse_outside(spec, split_path, listed, None)
        image_dir = _find_image_dir(spec, root, listed[0][0], "the split's first test image")
    _refuse_outside(spec, split_path, listed, image_dir)

    classnames = list(default_names if classnames is None else classnames)
    if len(classnames) != spec.num_classes:
        raise ClassNamesError(f"{spec.name}: got {len(classnames)} class names for {spec.num_classes} classes")
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
                         warnings=warnings, empty_classes=empty, missing_samples=missing,
                         found_layout="test split file")
