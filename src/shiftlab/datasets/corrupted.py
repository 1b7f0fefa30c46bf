"""Corrupted datasets: the ones their authors ship (ImageNet-C's folders, CIFAR-10-C / CIFAR-100-C's arrays)
and any dataset corrupted on the fly (`CorruptedDataset`, datasets/corruptions.py).

- ImageNet-C (Hendrycks & Dietterich; Zenodo record 2235448: blur, digital, extra, noise, weather.tar):
  `imagenet-c/<corruption>/<severity>/<wnid>/*.JPEG`, 15 corruptions + the 4 extra ones x severities 1..5,
  each a class-folder set of the 1000 ImageNet classes. One (corruption, severity) is one dataset: its folder
  is read by the class-folder loader.
- CIFAR-10-C / CIFAR-100-C (Zenodo records 2535967 and 3555552): `<corruption>.npy`, uint8 (50000, 32, 32, 3):
  the 10,000 test images at severity 1, then 2, ... 5; `labels.npy` the labels of those 50,000 rows.
  Sample k of severity s is row (s - 1) * 10000 + k; its path is `<corruption>.npy/<severity>/<k>`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..options import say
from .base import DatasetError, FolderDataset
from .corruptions import (
    CORRUPTIONS,
    IMAGENET_C_SIZE,
    check_corruption,
    corrupt_image,
    corruption_seed,
    package_version,
    prepare_like_imagenet_c,
)
from .derived import DerivedDataset
from .imageio import ImageDecodeError

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["CIFAR_C_ROWS", "CifarCDataset", "CorruptedDataset", "stored_corruptions", "corruption_folder",
           "build_cifar_c"]

CIFAR_C_ROWS = 10_000   # test images per severity in CIFAR-10-C / CIFAR-100-C


def stored_corruptions(directory: Path, layout: str) -> list[str]:
    """The corruptions a stored corrupted set holds (in CORRUPTIONS' order): its folders or its .npy files."""
    if layout == "npy":
        return [c for c in CORRUPTIONS if (directory / f"{c}.npy").is_file()]
    return [c for c in CORRUPTIONS if (directory / c).is_dir()]


def corruption_folder(name: str, directory: Path, corruption: str | None, severity: int | None) -> Path:
    """ImageNet-C's `<directory>/<corruption>/<severity>/`, or DatasetError saying what to pick or what is missing."""
    if corruption is None:
        held = stored_corruptions(directory, "folders")
        raise DatasetError(f"{name} holds one dataset per corruption and severity: choose one with "
                           f"{say('corruption', 'NAME')} {say('severity', '1..5')} "
                           f"(found under {directory}: {', '.join(held) or 'none'})")
    check_corruption(corruption, severity)
    folder = directory / corruption / str(severity)
    if not folder.is_dir():
        raise DatasetError(f"{name}: no {corruption}/{severity} folder in {directory} (expected "
                           f"{folder}/<wnid>/*.JPEG; found corruptions: "
                           f"{', '.join(stored_corruptions(directory, 'folders')) or 'none'})")
    return folder


@dataclass(repr=False)   # FolderDataset's one-line repr
class CifarCDataset(FolderDataset):
    """One (corruption, severity) of CIFAR-10-C / CIFAR-100-C: rows of `<corruption>.npy` read by index
    (memory-mapped, so a DataLoader worker opens the file itself)."""
    array_file: Path = Path()
    first_row: int = 0
    _array: Any = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_array"] = None     # each worker maps the file again
        return state

    def read_bytes(self, i: int) -> bytes:
        """The row's pixels (32 x 32 x 3 uint8): what a feature store's content digest covers."""
        import numpy as np
        if self._array is None:
            self._array = np.load(self.array_file, mmap_mode="r")
        return np.ascontiguousarray(self._array[self.first_row + i]).tobytes()

    def image(self, i: int) -> Image.Image:
        import numpy as np
        from PIL import Image as PILImage
        try:
            if self._array is None:
                self._array = np.load(self.array_file, mmap_mode="r")
            return PILImage.fromarray(np.ascontiguousarray(self._array[self.first_row + i]), "RGB")
        except (OSError, ValueError, IndexError) as exc:
            raise ImageDecodeError(self.path(i), f"cannot read row {self.first_row + i} of {self.array_file} "
                                                 f"({exc})") from exc


def build_cifar_c(name: str, directory: Path, classnames: list[str], corruption: str | None,
                  severity: int | None) -> CifarCDataset:
    """CIFAR-10-C / CIFAR-100-C at one corruption and severity; DatasetError when the files are not as shipped."""
    import numpy as np
    if corruption is None:
        raise DatasetError(f"{name} holds one dataset per corruption and severity: choose one with "
                           f"{say('corruption', 'NAME')} {say('severity', '1..5')} (found under {directory}: "
                           f"{', '.join(stored_corruptions(directory, 'npy')) or 'none'})")
    check_corruption(corruption, severity)
    array_file, labels_file = directory / f"{corruption}.npy", directory / "labels.npy"
    for path in (array_file, labels_file):
        if not path.is_file():
            raise DatasetError(f"{name}: {path} is missing (expected <corruption>.npy and labels.npy in {directory})")
    try:
        array = np.load(array_file, mmap_mode="r")
        labels = np.load(labels_file, mmap_mode="r")
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{name}: cannot read {array_file.name} or labels.npy in {directory} ({exc})") from None
    rows = CIFAR_C_ROWS * 5
    if array.dtype != np.uint8 or array.ndim != 4 or array.shape[3] != 3 or len(array) % 5:
        raise DatasetError(f"{name}: {array_file} is {array.dtype} {tuple(array.shape)}, expected uint8 "
                           f"({rows}, 32, 32, 3): five severities of RGB images")
    per_severity = len(array) // 5   # 10,000 as shipped; a smaller file (a test fixture) keeps the layout
    if labels.ndim != 1 or len(labels) != len(array):
        raise DatasetError(f"{name}: labels.npy has {len(labels)} labels for the {len(array)} images of "
                           f"{array_file.name}")
    first = (severity - 1) * per_severity
    chunk = [int(v) for v in labels[first:first + per_severity]]
    bad = [v for v in chunk if not 0 <= v < len(classnames)]
    if bad:
        raise DatasetError(f"{name}: labels.npy holds label {bad[0]}, not one of its {len(classnames)} classes")
    samples = [(f"{corruption}.npy/{severity}/{k}", label) for k, label in enumerate(chunk)]
    present = set(chunk)
    empty = [classnames[c] for c in range(len(classnames)) if c not in present]
    return CifarCDataset(root=directory, samples=samples, classnames=list(classnames), wnids=None, name=name,
                         empty_classes=empty, array_file=array_file, first_row=first,
                         corruption_info=stored_info(corruption, severity))


def stored_info(corruption: str, severity: int) -> dict:
    """run.json's record of a corruption read from its authors' files."""
    return {"name": corruption, "severity": int(severity), "source": "stored"}


class CorruptedDataset(DerivedDataset):
    """A dataset whose every image is corrupted on the fly (`corrupt_image`), seeded per sample by (seed, sample
    id, corruption, severity) after ImageNet-C's resize and crop; same samples, labels and classes as `base`
    (and its files' answers: `DerivedDataset`)."""

    def __init__(self, base: Any, corruption: str, severity: int, seed: int):
        check_corruption(corruption, severity)
        super().__init__(base)
        self.corruption, self.severity, self.seed = corruption, int(severity), int(seed)
        self.corruption_info = {"name": corruption, "severity": self.severity, "source": "generated",
                                "seed": self.seed, "package": package_version(),
                                "prepare": "resize {}, centre crop {}".format(*IMAGENET_C_SIZE)}

    def __repr__(self) -> str:
        return f"CorruptedDataset({self.name}, {self.corruption}, severity {self.severity}, seed {self.seed})"

    def image(self, i: int) -> Image.Image:
        img = prepare_like_imagenet_c(self.base.image(i))
        return corrupt_image(img, self.corruption, self.severity,
                             corruption_seed(self.seed, i, self.corruption, self.severity))
