"""SVHN as its authors distribute it: `test_32x32.mat` (ufldl.stanford.edu/housenumbers), a MATLAB file holding
`X`, the images as a (32, 32, 3, N) uint8 array, and `y`, their digits (N, 1; 10 for the digit 0), read with
`scipy.io.loadmat` as `torchvision.datasets.SVHN` reads it. shiftlab uses SVHN as an out-of-distribution set
(CLIPTTA's open-set streams): the digits are not read, the samples have no label, like the `images` layout's.

A sample's path is `test_32x32.mat#<index>` (zero-padded, so the sorted order is the file's); its bytes, as a
feature store keys them (`content_digest`), are the image's 3,072 raw bytes in the file (height, width, channel).
The array is read on the first image and dropped when the dataset is pickled into a DataLoader worker.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import DatasetError, FolderDataset

if TYPE_CHECKING:
    from PIL import Image

    from .specs import DatasetSpec

__all__ = ["SVHN_FILE", "MatImageDataset", "holds_mat", "build_mat_pool"]

SVHN_FILE = "test_32x32.mat"
SAMPLE_SEP = "#"


def holds_mat(directory: Path) -> bool:
    """Whether `directory` holds SVHN's test split file."""
    return (directory / SVHN_FILE).is_file()


def _load_images(path: Path, name: str) -> Any:
    """`X` of the file as (N, 32, 32, 3) uint8; DatasetError (one line) when it cannot be read as SVHN's."""
    try:
        from scipy.io import loadmat
    except ImportError:
        raise DatasetError(f"{name}: {path} is a MATLAB file, read with scipy, which is not installed: "
                           "pip install 'shiftlab[svhn]'") from None
    try:
        images = loadmat(str(path), variable_names=["X"]).get("X")
    except (OSError, ValueError, TypeError, IndexError, NotImplementedError) as exc:   # scipy: short files
        raise DatasetError(f"{name}: {path} is not a readable MATLAB file ({' '.join(str(exc).split())[:160]})") \
            from None
    if images is None or images.ndim != 4 or images.shape[2] != 3 or str(images.dtype) != "uint8":
        got = "no X" if images is None else f"X of shape {tuple(images.shape)} and type {images.dtype}"
        raise DatasetError(f"{name}: {path} holds {got}; SVHN's file holds X as (32, 32, 3, N) uint8 images")
    return images.transpose(3, 0, 1, 2)


class MatImageDataset(FolderDataset):
    """The images of SVHN's .mat file, without labels (module docstring)."""

    def __post_init__(self) -> None:
        self._images: Any = None

    def _array(self) -> Any:
        if self._images is None:
            self._images = _load_images(self.root / SVHN_FILE, self.name)
        return self._images

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_images": None}   # a worker reads the file itself, not a pickled copy

    def image(self, i: int) -> Image.Image:
        from PIL import Image
        return Image.fromarray(self._array()[i], mode="RGB")

    def source(self, i: int) -> str:
        return str(self.root / self.samples[i][0])

    def read_bytes(self, i: int) -> bytes:
        return self._array()[i].tobytes()

    def content_digest(self, i: int) -> str:
        return hashlib.sha256(self.read_bytes(i)).hexdigest()


def build_mat_pool(spec: DatasetSpec, directory: Path) -> MatImageDataset:
    """SVHN's `test_32x32.mat` under `directory` as an OOD pool (its images read once here to count them)."""
    images = _load_images(directory / SVHN_FILE, spec.name)
    width = len(str(len(images) - 1))
    samples = [(f"{SVHN_FILE}{SAMPLE_SEP}{i:0{width}d}", None) for i in range(len(images))]
    dataset = MatImageDataset(root=directory, samples=samples, classnames=[], wnids=None, name=spec.name,
                              found_layout=f"SVHN's {SVHN_FILE}")
    dataset._images = images
    return dataset
