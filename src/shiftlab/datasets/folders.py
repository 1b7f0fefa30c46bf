"""The class-folder layouts "wnid", "index" and "any" (ImageNet-R/-A/-V2/-Sketch, ImageNet val, any
image folder): one folder per class, images anywhere inside it.

``build_folder_dataset(spec, directory, root)`` lists and validates the dataset folder (datasets/build.py
found it) and returns a ``FolderDataset`` whose sample order is the sorted relative path (deterministic
on every machine, so a sample's index is a stable id across runs and shards).

Validation decisions:
- missing or unexpected class folders, a nonexistent root and a dataset without any image are
  errors (``DatasetError``) naming the path and what was expected;
- a class folder without images is allowed (labels stay fixed by the full class list) and
  reported in ``FolderDataset.warnings`` / ``empty_classes``, so partial/synthetic subsets still load;
  ``FolderDataset.require_complete()`` (what ``shiftlab run`` calls unless ``--allow-partial``)
  refuses a dataset with more than ``MAX_EMPTY_FRACTION`` of its classes empty;
- symlinks are followed only while they stay inside the dataset folder; links pointing outside it,
  dangling links and links looping back into a folder being scanned are skipped and counted in
  ``warnings``;
- files at the dataset's top level (README.txt, classnames.txt) are ignored; inside a class
  folder, images are found recursively, hidden entries are skipped and non-image files are
  counted in ``warnings``.
"""
from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..options import say
from .base import IMAGE_EXTENSIONS, ClassNamesError, DatasetError, FolderDataset, format_listing, is_inside
from .specs import DatasetSpec

__all__ = ["build_folder_dataset", "build_image_pool"]


def _raw_ilsvrc_hint(directory: Path) -> str:
    """A hint when `directory` holds ImageNet's validation images as distributed: one flat folder of
    ILSVRC2012_val_*.JPEG files, not yet sorted into a folder per class."""
    try:
        with os.scandir(directory) as it:
            flat = sum(1 for e, _ in zip(it, range(2000)) if e.name.startswith("ILSVRC2012_val_"))
    except OSError:
        return ""
    if not flat:
        return ""
    return ("; it holds ILSVRC2012_val_*.JPEG files directly: that is the raw ILSVRC2012 validation "
            "layout, sort the images into one folder per wnid first (e.g. with valprep.sh, see docs/DATA.md)")


def _subdirs(directory: Path) -> list[str]:
    names = []
    with os.scandir(directory) as entries:
        for e in entries:
            try:
                if not e.name.startswith(".") and e.is_dir():
                    names.append(e.name)
            except OSError:  # a symlink loop (ELOOP) or an unreadable entry is not a class folder
                continue
    return sorted(names)


@dataclass
class _Scan:
    """What a scan of class folders skipped, for the warnings. Symlinks are followed only while they
    stay inside the dataset folder (``root``), and never back into a folder being scanned (a loop)."""

    root: str  # realpath of the dataset folder
    non_images: int = 0
    outside_links: int = 0
    broken_links: int = 0
    loops: int = 0

    def inside(self, path: str) -> bool:
        return is_inside(self.root, path)

    def warnings(self, directory: Path) -> list[str]:
        out = []
        if self.non_images:
            out.append(f"ignored {self.non_images} non-image files inside class folders of {directory}")
        if self.outside_links:
            out.append(f"ignored {self.outside_links} symlinks in {directory} that point outside it")
        if self.broken_links:
            out.append(f"ignored {self.broken_links} broken symlinks in {directory}")
        if self.loops:
            out.append(f"ignored {self.loops} symlinks in {directory} that loop back into their own folder")
        return out


def _scan_images(directory: Path, prefix: str, out: list[str], scan: _Scan,
                 ancestors: frozenset[str] = frozenset()) -> None:
    """Append relative posix paths of images under ``directory`` to ``out``; count what was skipped."""
    real = os.path.realpath(directory)
    if not scan.inside(real):
        scan.outside_links += 1
        return
    ancestors = ancestors | {scan.root, real}  # a link to the dataset folder itself would rescan everything
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.startswith("."):
                continue
            rel = f"{prefix}/{entry.name}"
            if entry.is_symlink():
                target = os.path.realpath(entry.path)
                if not scan.inside(target):
                    scan.outside_links += 1
                    continue
                try:
                    is_dir = stat.S_ISDIR(os.stat(entry.path).st_mode)
                except OSError:  # dangling, or a loop of links (ELOOP)
                    scan.broken_links += 1
                    continue
                if is_dir and target in ancestors:
                    scan.loops += 1
                    continue
            else:
                is_dir = entry.is_dir(follow_symlinks=False)
            if is_dir:
                _scan_images(Path(entry.path), rel, out, scan, ancestors)
            elif os.path.splitext(entry.name)[1].lower() in IMAGE_EXTENSIONS:
                out.append(rel)
            else:
                scan.non_images += 1


def _read_classnames_file(path: Path) -> list[str]:
    """classnames.txt: one name per line, UTF-8 (a byte-order mark dropped)."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
                           "save it as UTF-8, one class name per line") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


_WNID = re.compile(r"n\d{8}")


def _wnid_names(directory: Path, folders: list[str]) -> list[str] | None:
    """CLIP's ImageNet class names (data/imagenet_classes.tsv) of class folders named by WordNet ID, or None
    when no folder is: CLIP cannot read 'a photo of a n01443537.', so a folder of wnids is named as the
    ImageNet family is. Some folders wnids and some not, or a wnid outside ImageNet-1k: DatasetError."""
    wnids = [f for f in folders if _WNID.fullmatch(f)]
    if not wnids:
        return None
    from .classes import classnames_for_wnids
    try:
        if len(wnids) != len(folders):
            raise KeyError(f"{len(folders) - len(wnids)} of its {len(folders)} folders are not")
        return classnames_for_wnids(folders)
    except KeyError as exc:
        raise DatasetError(f"imagefolder: the class folders of {directory} are WordNet IDs (e.g. {wnids[0]}), but "
                           f"{exc.args[0]}, so they cannot be named from ImageNet's class names: give the names with "
                           f"{say('classnames')} (one per folder, in sorted folder order)") from None


def build_folder_dataset(spec: DatasetSpec, directory: Path, root: Path,
                         classnames: Sequence[str] | None = None) -> FolderDataset:
    """List and validate the class folders of dataset ``spec`` in ``directory`` (``root``: the folder the
    user named, for hints); raise ``DatasetError`` on a bad layout.

    ``classnames`` overrides the class names (one per label, in label order). For the ``any`` layout
    the default is ``<directory>/classnames.txt`` (one name per line, in sorted folder order) if it
    exists, else CLIP's ImageNet names when the folders are ImageNet WordNet IDs (n01443537 -> goldfish),
    else the folder names with ``_`` replaced by spaces.
    """
    name = spec.name
    found = _subdirs(directory)

    if spec.layout == "any":
        if not found:
            raise DatasetError(f"imagefolder: no class folders in {directory} (expected {directory}/<class>/<image>)")
        folders, wnids = found, None
        if classnames is None:
            names_file = directory / "classnames.txt"
            if names_file.is_file():
                default = _read_classnames_file(names_file)
            else:
                default = _wnid_names(directory, found) or [f.replace("_", " ") for f in found]
            if len(default) != len(found):
                raise DatasetError(
                    f"{names_file} lists {len(default)} names but {directory} has {len(found)} class folders")
            classnames = default
    else:
        wnids = spec.wnids()
        folders = [str(i) for i in range(spec.num_classes)] if spec.layout == "index" else list(wnids)
        expected, present = set(folders), set(found)
        missing = [f for f in folders if f not in present]
        extra = [f for f in found if f not in expected]
        if missing and len(missing) == len(folders):
            raise DatasetError(
                f"{name}: none of the {len(folders)} expected class folders is in {directory} "
                f"(expected e.g. {directory / folders[0]}/)" + (_raw_ilsvrc_hint(directory) or
                                                                 spec.folder_hint(root)))
        if missing:
            raise DatasetError(
                f"{name}: {directory} lacks {len(missing)} of {len(folders)} class folders: {format_listing(missing)}")
        if extra:
            raise DatasetError(
                f"{name}: unexpected folders in {directory} (not {name} classes): {format_listing(extra)}")
        if classnames is None:
            classnames = spec.classnames()

    classnames = list(classnames)
    if len(classnames) != len(folders):
        raise ClassNamesError(f"{name}: got {len(classnames)} class names for {len(folders)} classes in {directory}")

    samples: list[tuple[str, int]] = []
    empty: list[str] = []
    scan = _Scan(os.path.realpath(directory))
    for label_of_folder, folder in _labelled(spec, folders):
        paths: list[str] = []
        _scan_images(directory / folder, folder, paths, scan)
        if not paths:
            empty.append(folder)
        samples.extend((p, label_of_folder) for p in paths)
    if not samples:
        raise DatasetError(
            f"{name}: no images in {directory} (looked for {', '.join(sorted(IMAGE_EXTENSIONS))} files "
            f"inside {len(folders)} class folders)")
    samples.sort()

    warnings = []
    if empty:
        warnings.append(f"{len(empty)} of {len(folders)} class folders have no images: {format_listing(empty)}")
    warnings += scan.warnings(directory)
    return FolderDataset(root=directory, samples=samples, classnames=classnames, wnids=wnids, name=name,
                         warnings=warnings, empty_classes=empty)


def _labelled(spec: DatasetSpec, folders: list[str]):
    if spec.layout == "index":
        return ((int(f), f) for f in folders)
    return enumerate(folders)


def build_image_pool(spec: DatasetSpec, directory: Path) -> FolderDataset:
    """Layout ``images``: every image below ``directory`` (recursively, the same link rules), without labels:
    an out-of-distribution set (MCM's iNaturalist/SUN/Places, NINCO, SVHN) whose images an open-set run draws
    (datasets/openset.py). Its samples' labels are None and it has no classes."""
    if not directory.is_dir():
        raise DatasetError(f"{spec.name}: {directory} is not a directory" + spec.folder_hint(directory))
    paths: list[str] = []
    scan = _Scan(os.path.realpath(directory))
    with os.scandir(directory) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name.startswith("."):
                continue
            if entry.is_dir():
                _scan_images(Path(entry.path), entry.name, paths, scan)
            elif os.path.splitext(entry.name)[1].lower() in IMAGE_EXTENSIONS:
                paths.append(entry.name)
    if not paths:
        raise DatasetError(f"{spec.name}: no images in {directory} (looked for {', '.join(sorted(IMAGE_EXTENSIONS))} "
                           "files in it and its folders)")
    return FolderDataset(root=directory, samples=[(p, None) for p in sorted(paths)], classnames=[], wnids=None,
                         name=spec.name, warnings=scan.warnings(directory), found_layout="image files")
