"""`build_dataset(name, root)`: the one builder. It finds the dataset's folder under `root` and picks
the loader by the dataset's layout (datasets/specs.py) and what the folder holds:

- layout ``split``: the test split listed in a file (datasets/splits.py);
- otherwise CLIP_benchmark's webdataset shards (datasets/shards.py) or a Hugging Face parquet /
  save_to_disk table (datasets/tables.py) when the folder holds them, else its class folders
  (datasets/folders.py).

``root`` may be the dataset folder itself (``.../imagenet-r``) or its parent; the parent form is
used when ``root`` contains one of the dataset's folder names (``DatasetSpec.dirnames``, e.g.
``imagenet-r/``; for ImageNet-V2 also the archive's ``imagenetv2-matched-frequency-format-val/``)
or the hub's ``wds_<name>``. Every loader returns a ``FolderDataset`` (sorted samples: a sample's
index is its id in every run) that answers ``image(i)``.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..options import cli_speaking, say
from .base import DatasetError, FolderDataset
from .corrupted import build_cifar_c, corruption_folder, stored_info
from .folders import build_folder_dataset, build_image_pool
from .matfile import build_mat_pool, holds_mat
from .shards import build_shard_dataset, shard_dir
from .specs import DATASETS, DatasetSpec
from .splits import build_split_dataset
from .tables import build_table_dataset, table_files

__all__ = ["build_dataset", "find_dataset_dir", "expand_root", "locate", "layout_of"]

# what a folder may hold besides class folders: (its test, its loader), tried in order
_HUB_LOADERS = ((shard_dir, build_shard_dataset), (table_files, build_table_dataset))


def build_dataset(name: str, root: str | os.PathLike, classnames: Sequence[str] | None = None,
                  corruption: str | None = None, severity: int | None = None) -> FolderDataset:
    """List and validate dataset ``name`` (or an alias) under ``root``; raise ``DatasetError`` on a bad layout.

    ``classnames`` overrides the class names (one per label, in label order); for ``imagefolder`` the
    default is ``<root>/classnames.txt`` if it exists, else the folder names with ``_`` as spaces.
    ``corruption``/``severity`` pick one dataset of a stored corrupted set (ImageNet-C, CIFAR-C;
    datasets/corrupted.py); other datasets ignore them (a run corrupts those on the fly).
    """
    spec = DATASETS.get(name)   # DatasetError naming the known datasets (TypeError: not a string)
    if not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"root must be a folder path, got {type(root).__name__}")
    if classnames is not None and (isinstance(classnames, str) or not isinstance(classnames, (list, tuple))
                                   or not all(isinstance(c, str) for c in classnames)):
        raise TypeError(f"classnames must be a list of class names, got {type(classnames).__name__}"
                        + (f" {classnames!r}" if isinstance(classnames, str) else ""))
    named = "{dataset}" in os.fspath(root)   # the template names the folder: it is the dataset's own
    root = expand_root(root, spec.name)
    if spec.layout == "split":
        return build_split_dataset(spec, root, classnames)
    directory = find_dataset_dir(spec.name, root, named=named)
    if spec.corrupted:
        if spec.layout == "npy":
            names = list(classnames) if classnames is not None else spec.classnames()
            return build_cifar_c(spec.name, directory, names, corruption, severity)
        folder = corruption_folder(spec.name, directory, corruption, severity)
        dataset = build_folder_dataset(spec, folder, root.expanduser(), classnames)
        dataset.corruption_info = stored_info(corruption, severity)
        return dataset
    if spec.layout == "images":   # an OOD pool: image files, or SVHN's .mat file as its authors ship it
        return build_mat_pool(spec, directory) if holds_mat(directory) else build_image_pool(spec, directory)
    for holds, load in _HUB_LOADERS:
        if holds(directory):
            expected = spec.classnames() if spec.classes else None
            return load(spec, directory, expected, list(classnames) if classnames is not None else None)
    return build_folder_dataset(spec, directory, root.expanduser(), classnames)


def find_dataset_dir(name: str, root: str | os.PathLike, named: bool = False) -> Path:
    """The dataset folder for ``root``: ``root/<dirname>`` if one exists, else ``root`` itself. An
    out-of-distribution set (layout ``images``: any image below its folder) is read from ``root`` itself only
    when ``root`` is named for it (one of its folder names or aliases, or ``named``: a ``{dataset}`` template
    chose it): any image folder would do, so a data root holding other datasets must never stand in for it."""
    spec = DATASETS.get(name)
    root = Path(root).expanduser()
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        sibling = _hub_sibling(name, root)
        if sibling is not None:   # `--data data/{dataset}` beside the hub's data/wds_imagenet-r
            exc = DatasetError(f"{spec.name} root {what}: {root}, but {sibling} beside it holds the dataset "
                               f"({layout_of(name, sibling)}): pass {say('data')}{_spell(sibling.parent)} or "
                               f"{say('data')}{_spell(sibling)}")
            exc.found_instead = sibling   # nothing to download: said by the CLI's hint
            raise exc
        raise DatasetError(f"{spec.name} root {what}: {root}" + spec.folder_hint(root))
    found = locate(name, root)
    if found is None and spec.layout == "images" and not (named or named_for(name, root)):
        raise DatasetError(f"{spec.name}: no folder of it under {root} (expected {ood_layout(spec, root)})"
                           + (f"; get it with: shiftlab download {spec.name} --root {root}" if spec.url else
                              "; see docs/DATA.md"))
    return found or root


def named_for(name: str, folder: Path) -> bool:
    """Whether `folder` is named as dataset `name`'s folder: its path ends with one of its folder names (all of
    its parts: `SUN/images`, not any `images`), or its name is one of the dataset's names and aliases (case
    and '-'/'_' aside)."""
    def norm(text: str) -> str:
        return text.lower().replace("_", "-")
    parts = [norm(p) for p in folder.expanduser().absolute().parts]
    for dirname in DATASETS.get(name).dirnames:
        tail = [norm(p) for p in dirname.split("/")]
        if parts[-len(tail):] == tail:
            return True
    return bool(parts) and parts[-1] in {norm(a) for a in DATASETS.aliases(name)}


def ood_layout(spec: DatasetSpec, root: Path) -> str:
    """Where an out-of-distribution set's images are expected under `root`, for a refusal."""
    first = root / spec.dirnames[0] if spec.dirnames else root / spec.name
    also = [str(root / d) for d in spec.dirnames[1:]]
    return f"{first}/ holding its images" + (f", or {' or '.join(also)}" if also else "")


def _hub_sibling(name: str, root: Path) -> Path | None:
    """A folder beside a missing `root` that holds dataset `name` in a hub layout (webdataset shards
    as `wds_<name>`, or parquet/arrow files under the dataset's own name)."""
    parent = root.parent
    if not parent.is_dir():
        return None
    folder = locate(name, parent)
    if folder is not None and folder != root and (shard_dir(folder) is not None or table_files(folder)):
        return folder
    return None


def locate(name: str, root: str | os.PathLike) -> Path | None:
    """The folder named for dataset ``name`` under ``root`` (``{dataset}`` expanded): one of its
    folder names (nested layouts first), or the hub's ``wds_<alias>``; None when there is none."""
    root = expand_root(root, name)
    for dirname in sorted(DATASETS.get(name).dirnames, key=lambda d: -d.count("/")):  # nested layouts first
        if (root / dirname).is_dir():
            return root / dirname
    for alias in DATASETS.aliases(name):   # the hub's CLIP_benchmark shards: wds_imagenet-r, wds_imagenet_sketch
        for dirname in dict.fromkeys((f"wds_{alias}", f"wds_{alias.replace('-', '_')}")):
            if (root / dirname).is_dir():
                return root / dirname
    return None


def layout_of(name: str, directory: Path) -> str:
    """Which loader `build_dataset` picks for `directory` (said by `shiftlab datasets --data`)."""
    if DATASETS.get(name).layout == "split":
        return "test split file"
    if DATASETS.get(name).layout == "images":
        return "image files" if not holds_mat(directory) else "SVHN's test_32x32.mat"
    if shard_dir(directory) is not None:
        return "webdataset shards"
    if table_files(directory):
        return "Hugging Face parquet/arrow table"
    return "class folders"


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


def _spell(path: Path) -> str:
    """A path as the caller writes it after `--data ` or `data=`."""
    return f" {path}" if cli_speaking() else repr(str(path))
