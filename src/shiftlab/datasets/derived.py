"""`DerivedDataset`: a dataset made from another one (`base`), the one place that answers what a reader asks of
a dataset (`FolderDataset`'s attributes and methods) for the wrappers: a corruption generated on the fly
(`corrupted.CorruptedDataset`) and an open-set stream (`openset.OpenSetDataset`).

A subclass changes what it changes (its images, its extra samples) and routes each sample to the dataset its
bytes come from (`origin(i) -> (dataset, index)`); the files' answers (`path`, `source`, `read_bytes`,
`content_digest`) follow that route, so a feature store keys a wrapped sample by its source's bytes (the run's
key says what was done to them), and the partial-dataset bookkeeping (`lost`, `warnings`, `empty_classes`,
`missing_samples`) is carried over rather than dropped.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["DerivedDataset"]


class DerivedDataset:
    """`base`'s samples, labels, classes and bookkeeping, answered through `origin`; see the module docstring."""

    def __init__(self, base: Any):
        self.base = base
        self.root, self.samples, self.classnames, self.name = base.root, list(base.samples), base.classnames, base.name
        self.wnids = getattr(base, "wnids", None)
        self.warnings = list(getattr(base, "warnings", []))
        self.empty_classes = list(getattr(base, "empty_classes", []))
        self.missing_samples = getattr(base, "missing_samples", 0)
        self.lost = list(getattr(base, "lost", []))
        self.found_layout = getattr(base, "found_layout", "class folders")
        self.corruption_info = getattr(base, "corruption_info", None)
        self.open_set_info = getattr(base, "open_set_info", None)
        if callable(getattr(base, "is_ood", None)):   # an open-set stream stays one under another wrapper
            self.is_ood = base.is_ood

    def origin(self, i: int) -> tuple[Any, int]:
        """The dataset sample i's bytes come from and its index there (here: `base`, the same index)."""
        return self.base, i

    def __len__(self) -> int:
        return len(self.samples)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {len(self.samples)} samples, {len(self.classnames)} classes)"

    def path(self, i: int) -> Path:
        dataset, j = self.origin(i)
        return dataset.path(j)

    def label(self, i: int) -> Any:
        return self.base.label(i)

    def image(self, i: int) -> Image.Image:
        dataset, j = self.origin(i)
        return dataset.image(j)

    def source(self, i: int) -> str:
        dataset, j = self.origin(i)
        source = getattr(dataset, "source", None)
        return source(j) if callable(source) else str(dataset.path(j))

    def read_bytes(self, i: int) -> bytes:
        dataset, j = self.origin(i)
        read = getattr(dataset, "read_bytes", None)
        return read(j) if callable(read) else Path(dataset.path(j)).read_bytes()

    def content_digest(self, i: int) -> str:
        dataset, j = self.origin(i)
        digest = getattr(dataset, "content_digest", None)
        return digest(j) if callable(digest) else hashlib.sha256(self.read_bytes(i)).hexdigest()

    @property
    def num_classes(self) -> int:
        return len(self.classnames)

    @property
    def labels(self) -> list:
        return [label for _, label in self.samples]

    def require_complete(self, *args: Any, **kwargs: Any) -> None:
        self.base.require_complete(*args, **kwargs)
