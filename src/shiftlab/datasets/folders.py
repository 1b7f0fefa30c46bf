"""Folder-per-class datasets (ImageNet-R/-A/-V2/-Sketch, ImageNet val, any image folder).

``build_dataset(name, root)`` lists and validates a dataset folder and returns a
``FolderDataset`` whose sample order is the sorted relative path (deterministic on every
machine, so a sample's index is a stable id across runs and shards).

``root`` may be the dataset folder itself (``.../imagenet-r``) or its parent; the parent form is
used when ``root`` contains one of the dataset's folder names (``DatasetSpec.dirnames``, e.g.
``imagenet-r/``; for ImageNet-V2 also the archive's ``imagenetv2-matched-frequency-format-val/``).

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
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .imageio import decode_image

if TYPE_CHECKING:
    from PIL import Image
from ..registry import Registry
from .classes import classnames_for_wnids, imagenet_a_wnids, imagenet_r_wnids, imagenet_wnids

__all__ = [
    "IMAGE_EXTENSIONS", "DatasetError", "DatasetSpec", "DATASETS", "FolderDataset", "build_dataset",
    "list_datasets", "find_dataset_dir", "MAX_EMPTY_FRACTION",
]

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})
_MAX_LISTED = 10
MAX_EMPTY_FRACTION = 0.05  # more empty classes than this: refused by `shiftlab run` unless --allow-partial


class DatasetError(ValueError):
    """The dataset folder is missing or does not have the expected layout."""


@dataclass(frozen=True)
class DatasetSpec:
    """What a named dataset looks like on disk and where it comes from.

    ``layout``: ``"wnid"`` (class folders named by wnid, labels = position in ``wnids``),
    ``"index"`` (folders ``0``..``N-1``, label = int(folder)), ``"any"`` (imagefolder), or
    ``"split"`` (a test split listed in a file, see crossdataset.py).
    ``archive_dir``: the top-level folder inside the archive; ``dirnames[0]``: the folder name the
    downloader gives it under the data root. ``url=None`` with ``manual`` set means no automatic download.
    ``sha256``/``size`` of the archive are None until recorded from a trusted download (see download.py).
    """

    name: str
    num_classes: int | None
    layout: str
    dirnames: tuple[str, ...] = ()
    url: str | None = None
    archive_name: str | None = None
    archive_dir: str | None = None
    sha256: str | None = None
    size: int | None = None
    manual: str | None = None
    split: Any = None  # crossdataset.SplitLayout for layout "split" (a test split listed in a file)

    def wnids(self) -> list[str] | None:
        if self.name == "imagenet-r":
            return imagenet_r_wnids()
        if self.name == "imagenet-a":
            return imagenet_a_wnids()
        if self.num_classes == 1000:
            return imagenet_wnids()
        return None


_SKETCH_MANUAL = (
    "ImageNet-Sketch has no stable direct-download URL (it is hosted on Google Drive, Kaggle "
    "'wanghaohan/imagenetsketch' and the Hugging Face dataset 'imagenet_sketch', which need a login "
    "or a browser). Download ImageNet-Sketch.zip by hand and either put it at {archive} and rerun, "
    "pass it as --url file:///path/to/ImageNet-Sketch.zip, or unzip it so that {target}/<wnid>/ holds the images."
)
_IMAGENET_MANUAL = (
    "ImageNet requires an account at image-net.org; it cannot be downloaded automatically. Put the "
    "50,000 validation images into one folder per wnid at {target}/<wnid>/*.JPEG (e.g. with the "
    "widely used valprep.sh script)."
)

# Archive sizes/checksums are not hard-coded: none was published by the authors, so they are
# recorded in <root>/<name>.sha256 on the first trusted download (download.py) and verified afterwards.
def _normalize_name(name: str) -> str:
    return name.strip().lower().replace("_", "-")


# Names: shiftlab's own; CLIP_benchmark's (imagenet1k, imagenetv2, imagenet_sketch, imagenet_r, ...) and
# TPT's set ids (I/A/V/R/K) as aliases. Folder names: shiftlab's, then the archive's, then the layouts of
# CoOp's DATASETS.md, TPT's ID_to_DIRNAME and CLIP_benchmark's `--dataset_root root/{dataset}`.
DATASETS: Registry[DatasetSpec] = Registry("dataset", error=DatasetError, normalize=_normalize_name)
for _spec_entry, _aliases in (
    (DatasetSpec(
        "imagenet-r", 200, "wnid", ("imagenet-r", "imagenet-rendition/imagenet-r", "imagenet_r"),
        url="https://people.eecs.berkeley.edu/~hendrycks/imagenet-r.tar",
        archive_name="imagenet-r.tar", archive_dir="imagenet-r"), ("r", "imagenet-rendition")),
    (DatasetSpec(
        "imagenet-a", 200, "wnid", ("imagenet-a", "imagenet-adversarial/imagenet-a", "imagenet_a"),
        url="https://people.eecs.berkeley.edu/~hendrycks/imagenet-a.tar",
        archive_name="imagenet-a.tar", archive_dir="imagenet-a"), ("a", "imagenet-adversarial")),
    (DatasetSpec(
        "imagenet-v2", 1000, "index",
        ("imagenet-v2", "imagenetv2-matched-frequency-format-val",
         "imagenetv2/imagenetv2-matched-frequency-format-val", "imagenetv2/ImageNetV2-matched-frequency",
         "ImageNetV2-matched-frequency"),
        url="https://huggingface.co/datasets/vaishaal/ImageNetV2/resolve/main/imagenetv2-matched-frequency.tar.gz",
        archive_name="imagenetv2-matched-frequency.tar.gz", archive_dir="imagenetv2-matched-frequency-format-val"),
     ("v", "imagenetv2", "imagenetv2-matched-frequency")),
    (DatasetSpec(
        "imagenet-sketch", 1000, "wnid",
        ("imagenet-sketch", "sketch", "imagenet-sketch/images", "ImageNet-Sketch/sketch", "ImageNet-Sketch",
         "imagenet_sketch"),
        archive_name="ImageNet-Sketch.zip", archive_dir="sketch", manual=_SKETCH_MANUAL),
     ("k", "imagenet-s", "imagenetsketch")),
    (DatasetSpec(
        "imagenet", 1000, "wnid",
        ("imagenet-val", "imagenet/val", "val", "imagenet/images/val", "ImageNet/val", "imagenet1k/val"),
        manual=_IMAGENET_MANUAL),
     ("i", "imagenet1k", "imagenet-1k", "imagenet-val")),
    (DatasetSpec("imagefolder", None, "any"), ()),
):
    DATASETS.register(_spec_entry.name, _spec_entry, aliases=_aliases)


def list_datasets() -> list[str]:
    """Names accepted by ``build_dataset``, sorted."""
    return DATASETS.names()


@dataclass
class FolderDataset:
    root: Path  # the dataset folder itself (after resolving a parent root)
    samples: list[tuple[str, int]]  # (relative posix path, label), sorted by path
    classnames: list[str]  # label -> CLIP class name
    wnids: list[str] | None  # label -> wnid (None for imagefolder)
    name: str
    warnings: list[str] = field(default_factory=list)
    empty_classes: list[str] = field(default_factory=list)  # class folders (or class names) without a sample
    missing_samples: int = 0  # listed in a split file but not on disk (split layouts only)

    def __len__(self) -> int:
        return len(self.samples)

    def path(self, i: int) -> Path:
        return self.root / self.samples[i][0]

    def image(self, i: int) -> Image.Image:
        """Sample i decoded to RGB (shiftlab.datasets.imageio: an undecodable file raises ImageDecodeError)."""
        return decode_image(self.path(i))

    def label(self, i: int) -> int:
        return self.samples[i][1]

    @property
    def num_classes(self) -> int:
        return len(self.classnames)

    @property
    def labels(self) -> list[int]:
        return [label for _, label in self.samples]

    def require_complete(self, max_empty_fraction: float = MAX_EMPTY_FRACTION) -> None:
        """Raise ``DatasetError`` when more than ``max_empty_fraction`` of the classes have no sample:
        a partly copied or extracted dataset would otherwise score as if it were the real one."""
        if len(self.empty_classes) > max_empty_fraction * self.num_classes:
            share = len(self.empty_classes) / self.num_classes
            raise DatasetError(
                f"{self.name}: {len(self.empty_classes)} of {self.num_classes} classes ({share:.0%}) have no images "
                f"in {self.root} (more than {max_empty_fraction:.0%}): {format_listing(self.empty_classes)}")
        listed = len(self.samples) + self.missing_samples
        if self.missing_samples > max_empty_fraction * listed:
            raise DatasetError(
                f"{self.name}: {self.missing_samples} of the {listed} test images listed in its split are missing "
                f"from {self.root} ({self.missing_samples / listed:.0%}, more than {max_empty_fraction:.0%})")


def _spec(name: str) -> DatasetSpec:
    return DATASETS.get(name)  # DatasetError naming the known datasets


def find_dataset_dir(name: str, root: str | os.PathLike) -> Path:
    """The dataset folder for ``root``: ``root/<dirname>`` if one exists, else ``root`` itself."""
    root = Path(root).expanduser()
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise DatasetError(f"{name} root {what}: {root}" + _download_hint(name, root))
    for dirname in sorted(_spec(name).dirnames, key=lambda d: -d.count("/")):  # nested layouts first
        if (root / dirname).is_dir():
            return root / dirname
    for alias in DATASETS.aliases(name):   # the hub's CLIP_benchmark shards: wds_imagenet-r, wds_imagenet_sketch
        for dirname in dict.fromkeys((f"wds_{alias}", f"wds_{alias.replace('-', '_')}")):
            if (root / dirname).is_dir():
                return root / dirname
    return root


def _download_hint(name: str, root: Path) -> str:
    spec = DATASETS.get(name) if name in DATASETS else None
    if spec is None or not spec.dirnames:
        return ""
    hint = f" (expected the class folders there or in {root / spec.dirnames[0]}"
    if spec.url:
        hint += f"; get them with: shiftlab download {name} --root {root}"
    return hint + ")"


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


def format_listing(items: Sequence[Any]) -> str:
    """The first few items, and how many there are: 'a, b, c (3)' or 'a, ..., j, ... (25 in total)'."""
    shown = ", ".join(str(item) for item in items[:_MAX_LISTED])
    return shown + (f", ... ({len(items)} in total)" if len(items) > _MAX_LISTED else f" ({len(items)})")


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


def is_inside(root_real: str, path_real: str) -> bool:
    """Whether ``path_real`` is ``root_real`` or below it (both already ``os.path.realpath``'d):
    the one rule for what a dataset may read, used by the folder scan and by split files."""
    return path_real == root_real or path_real.startswith(root_real.rstrip(os.sep) + os.sep)


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
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def expand_root(root: str | os.PathLike, name: str) -> Path:
    """`root` with "{dataset}" replaced by the dataset's folder name (CLIP_benchmark's `--dataset_root
    'DIR/{dataset}'`): the first of its names and aliases, as given or with '_' for '-'
    (imagenet_sketch), that is a folder; the canonical name when none is."""
    text = os.fspath(root)
    if "{dataset}" not in text:
        return Path(text)
    names = [n for alias in DATASETS.aliases(name) for n in dict.fromkeys((alias, alias.replace("-", "_")))]
    for candidate in names:
        path = Path(text.replace("{dataset}", candidate)).expanduser()
        if path.is_dir():
            return path
    return Path(text.replace("{dataset}", name)).expanduser()


def build_dataset(name: str, root: str | os.PathLike, classnames: Sequence[str] | None = None) -> FolderDataset:
    """List and validate dataset ``name`` under ``root``; raise ``DatasetError`` on a bad layout.

    ``classnames`` overrides the class names (one per label, in label order). For ``imagefolder``
    the default is ``<root>/classnames.txt`` (one name per line, in sorted folder order) if it
    exists, else the folder names with ``_`` replaced by spaces.
    """
    spec = _spec(name)
    root = expand_root(root, spec.name)
    if spec.layout == "split":
        from .crossdataset import build_split_dataset
        return build_split_dataset(spec, root, classnames)
    name = spec.name  # the canonical name for an alias
    directory = find_dataset_dir(name, root)
    from .shards import build_shard_dataset, shard_dir
    from .tables import build_table_dataset, table_files
    # the hub's layouts: CLIP_benchmark's webdataset shards, a parquet or save_to_disk dataset
    hub = build_shard_dataset if shard_dir(directory) else build_table_dataset if table_files(directory) else None
    if hub is not None:
        wnids = spec.wnids()
        return hub(spec, directory, classnames_for_wnids(wnids) if wnids else None,
                   list(classnames) if classnames is not None else None)
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
                default = [f.replace("_", " ") for f in found]
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
                                                                 _download_hint(name, Path(root).expanduser())))
        if missing:
            raise DatasetError(
                f"{name}: {directory} lacks {len(missing)} of {len(folders)} class folders: {format_listing(missing)}")
        if extra:
            raise DatasetError(
                f"{name}: unexpected folders in {directory} (not {name} classes): {format_listing(extra)}")
        if classnames is None:
            classnames = classnames_for_wnids(wnids)

    classnames = list(classnames)
    if len(classnames) != len(folders):
        raise DatasetError(f"{name}: got {len(classnames)} class names for {len(folders)} classes in {directory}")

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
