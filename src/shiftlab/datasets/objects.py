"""`as_dataset(obj)`: any map-style dataset of (image, label) pairs with class names, as a dataset a run reads
(what `shiftlab.run(config, dataset=obj)` does with an object that is not one of shiftlab's).

What `obj` must answer: `len(obj)`, `obj[i] -> (image, label)` (a tuple or list; an image is a PIL image, an
(H, W, 3) / (H, W) uint8 array, or a (3, H, W) / (H, W, 3) array or tensor, uint8 or float in [0, 1]: raw pixels,
not normalised, since shiftlab draws each method's own views from them), and its class names: `classnames=`,
else `obj.classnames`, else `obj.classes` (torchvision's ImageFolder and CIFAR). Labels come from
`obj.targets` (torchvision) or `obj.labels` when they are a sequence of len(obj) ints, else from reading every
sample once. Sample i's id in records is i; its "path" is "#i". Its identity for a feature store is the SHA-256
of its decoded pixels. Sample 0 is converted up front, so that a wrong kind of image is refused in one line
before anything runs.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import DatasetError, LabelledSamples

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["ObjectDataset", "as_dataset", "is_run_dataset"]


def is_run_dataset(obj: Any) -> bool:
    """Whether `obj` already is a dataset a run reads (shiftlab's: a sample list and `image(i)`)."""
    return getattr(obj, "samples", None) is not None and callable(getattr(obj, "image", None)) \
        and getattr(obj, "classnames", None) is not None


def _to_pil(image: Any, where: str) -> Image.Image:
    import numpy as np
    from PIL import Image
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if hasattr(image, "detach"):   # a torch tensor
        image = image.detach().cpu().numpy()
    try:
        array = np.asarray(image)
    except Exception:
        array = None
    if array is None or array.dtype == object or array.ndim not in (2, 3):
        raise DatasetError(f"{where}: the image is a {type(image).__name__}; expected a PIL image, or an (H, W, 3) "
                           "or (3, H, W) array or tensor of raw pixels")
    if array.ndim == 3 and array.shape[0] in (1, 3) and array.shape[-1] not in (1, 3):
        array = array.transpose(1, 2, 0)   # (C, H, W), as a ToTensor transform gives
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.dtype != np.uint8:
        if not np.issubdtype(array.dtype, np.floating) or not (np.isfinite(array).all() and array.min() >= 0
                                                                and array.max() <= 1):
            raise DatasetError(f"{where}: a {array.dtype} image must hold raw pixels in [0, 1] (found "
                               f"[{float(array.min()):.3g}, {float(array.max()):.3g}]); give the dataset without its "
                               "normalising transform: shiftlab draws each method's views and normalises them itself")
        array = np.round(array * 255).astype(np.uint8)
    if array.ndim == 3 and array.shape[-1] != 3:
        raise DatasetError(f"{where}: an image of {array.shape[-1]} channels; expected RGB (3) or grey (1)")
    return Image.fromarray(np.ascontiguousarray(array)).convert("RGB")


class ObjectDataset(LabelledSamples):
    """A map-style dataset object as a run's dataset (see the module docstring); `base` is the object."""

    found_layout = "a dataset object"
    wnids = None
    corruption_info = None

    def __init__(self, base: Any, classnames: Sequence[str], labels: Sequence[int], name: str):
        self.base, self.name = base, name
        self.classnames = list(classnames)
        self.samples = [(f"#{i}", int(label)) for i, label in enumerate(labels)]
        self.root: Path | None = None
        self.warnings: list[str] = []
        self.empty_classes = [c for k, c in enumerate(self.classnames) if k not in set(self.labels)]
        self.missing_samples = 0
        self.lost: list[str] = []

    def __len__(self) -> int:
        return len(self.samples)

    def __repr__(self) -> str:
        return (f"ObjectDataset({self.name!r}, {type(self.base).__name__}, {len(self.samples)} samples, "
                f"{len(self.classnames)} classes)")

    def image(self, i: int) -> Image.Image:
        return _to_pil(self.base[i][0], self.source(i))

    def source(self, i: int) -> str:
        return f"{self.name}[{i}]"

    def read_bytes(self, i: int) -> bytes:
        """Sample i's decoded pixels (RGB, row by row) after a `W x H` header: what identifies it."""
        image = self.image(i)
        return f"{image.width}x{image.height}\n".encode() + image.tobytes()

    def content_digest(self, i: int) -> str:
        return hashlib.sha256(self.read_bytes(i)).hexdigest()

    def require_complete(self, max_empty_fraction: float = 0.0) -> None:
        """Nothing to check: the object holds what it holds."""


def _labels(obj: Any, n: int) -> list[int]:
    for attr in ("targets", "labels"):
        found = getattr(obj, attr, None)
        if found is not None and not isinstance(found, (str, bytes)) and hasattr(found, "__len__") \
                and len(found) == n:
            return [int(x) for x in found]
    return [int(obj[i][1]) for i in range(n)]   # every sample read once


def as_dataset(obj: Any, classnames: Sequence[str] | None = None, name: str | None = None) -> Any:
    """`obj` as a dataset a run reads: itself when it is one already, else an `ObjectDataset` (module docstring);
    a one-line DatasetError (a ValueError) says what is missing."""
    if is_run_dataset(obj):
        return obj
    kind = type(obj).__name__
    if not hasattr(obj, "__len__") or not hasattr(obj, "__getitem__"):
        raise DatasetError(f"dataset: a {kind} is not a map-style dataset (len(dataset) and dataset[i] -> "
                           "(image, label))")
    names = classnames if classnames is not None else getattr(obj, "classnames", None) or getattr(obj, "classes", None)
    if isinstance(names, dict):   # {name: index}, as some datasets keep it
        names = sorted(names, key=names.get)
    if not names or isinstance(names, str) or not all(isinstance(c, str) and c.strip() for c in names):
        raise DatasetError(f"dataset: the {kind} has no class names; pass them: shiftlab.as_dataset(dataset, "
                           "classnames=[...]) (or give it a `classnames` or `classes` list)")
    if len(set(names)) != len(names):
        raise DatasetError(f"dataset: the class names of the {kind} hold duplicates")
    n = len(obj)
    if n == 0:
        raise DatasetError(f"dataset: the {kind} is empty")
    first = obj[0]
    if not isinstance(first, (tuple, list)) or len(first) < 2:
        raise DatasetError(f"dataset: {kind}[0] is a {type(first).__name__}; expected an (image, label) pair")
    labels = _labels(obj, n)
    bad = next((i for i, y in enumerate(labels) if not 0 <= y < len(names)), None)
    if bad is not None:
        raise DatasetError(f"dataset: sample {bad}'s label {labels[bad]} is not a class index in [0, {len(names)})")
    own = getattr(obj, "name", None)
    dataset = ObjectDataset(obj, names, labels, name or (own if isinstance(own, str) and own else kind))
    _to_pil(first[0], dataset.source(0))   # a wrong kind of image, refused before anything runs
    return dataset
