"""What every loader returns and shares: `FolderDataset` (a sorted sample list that answers `image(i)`),
`DatasetError`, the image extensions, the rule for what a dataset may read (`is_inside`) and how a
long list is shortened in a message (`format_listing`)."""
from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["IMAGE_EXTENSIONS", "MAX_EMPTY_FRACTION", "ClassNamesError", "DatasetError", "FolderDataset",
           "format_listing", "is_inside"]

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})
MAX_EMPTY_FRACTION = 0.05  # more empty classes than this: refused by `shiftlab run` unless --allow-partial
_MAX_LISTED = 10


class DatasetError(ValueError):
    """The dataset folder is missing or does not have the expected layout."""


class ClassNamesError(DatasetError):
    """The class names given do not fit the dataset (their count): nothing is missing that a download would bring."""


def format_listing(items: Sequence[Any]) -> str:
    """The first few items, and how many there are: 'a, b, c (3)' or 'a, ..., j, ... (25 in total)'."""
    shown = ", ".join(str(item) for item in items[:_MAX_LISTED])
    return shown + (f", ... ({len(items)} in total)" if len(items) > _MAX_LISTED else f" ({len(items)})")


def is_inside(root_real: str, path_real: str) -> bool:
    """Whether ``path_real`` is ``root_real`` or below it (both already ``os.path.realpath``'d):
    the one rule for what a dataset may read, used by the folder scan and by split files."""
    return path_real == root_real or path_real.startswith(root_real.rstrip(os.sep) + os.sep)


class LabelledSamples:
    """The labels of a dataset holding `samples` ((source, label) pairs) and `classnames` (label -> class name):
    FolderDataset, ObjectDataset."""

    @property
    def num_classes(self) -> int:
        return len(self.classnames)   # type: ignore[attr-defined]

    @property
    def labels(self) -> list[int]:
        return [label for _, label in self.samples]   # type: ignore[attr-defined]

    def label(self, i: int) -> int:
        return self.samples[i][1]   # type: ignore[attr-defined]


@dataclass(repr=False)   # its own one-line __repr__, not the whole sample list
class FolderDataset(LabelledSamples):
    root: Path  # the dataset folder itself (after resolving a parent root)
    samples: list[tuple[str, int]]  # (relative posix path, label), sorted by path
    classnames: list[str]  # label -> CLIP class name
    wnids: list[str] | None  # label -> wnid (None for imagefolder)
    name: str
    warnings: list[str] = field(default_factory=list)
    empty_classes: list[str] = field(default_factory=list)  # class folders (or class names) without a sample
    missing_samples: int = 0  # listed in a split file but not on disk (split layouts only)
    # samples the files promise but cannot deliver (a truncated shard, a null image cell), one line each
    # naming file and offset or row: an error unless --allow-partial, then counted in summary.json
    lost: list[str] = field(default_factory=list)
    found_layout: str = "class folders"   # what the builder found: `shiftlab datasets --data` says it
    corruption_info: dict | None = None  # a stored corrupted set's (corruption, severity): datasets/corrupted.py

    def __len__(self) -> int:
        return len(self.samples)

    def __repr__(self) -> str:
        """One line (not the dataclass's whole sample list)."""
        return (f"{type(self).__name__}({self.name!r}, root={str(self.root)!r}, {len(self.samples)} samples, "
                f"{len(self.classnames)} classes)")

    def path(self, i: int) -> Path:
        return self.root / self.samples[i][0]

    def image(self, i: int) -> Image.Image:
        """Sample i decoded to RGB (shiftlab.datasets.imageio: an undecodable file raises ImageDecodeError)."""
        from .imageio import decode_image  # numpy and PIL, loaded with the first image: the table reads no image
        return decode_image(self.path(i))

    def source(self, i: int) -> str:
        """Where sample i's bytes come from, as a person reads it (a file; `shard.tar/member`; `file#row`)."""
        return str(self.path(i))

    def read_bytes(self, i: int) -> bytes:
        """Sample i's encoded image bytes, as stored (raises OSError when they cannot be read)."""
        return self.path(i).read_bytes()

    def content_digest(self, i: int) -> str:
        """SHA-256 of sample i's encoded bytes: its identity in a feature store, whatever the layout."""
        return hashlib.sha256(self.read_bytes(i)).hexdigest()

    def require_complete(self, max_empty_fraction: float = MAX_EMPTY_FRACTION) -> None:
        """Raise ``DatasetError`` when more than ``max_empty_fraction`` of the classes have no sample:
        a partly copied or extracted dataset would otherwise score as if it were the real one; and when
        any sample the files promise cannot be read (`lost`: a truncated shard, a null table cell)."""
        if self.lost:
            raise DatasetError(f"{self.name}: samples are lost ({len(self.lost)} problem(s)): {self.lost[0]}"
                               + (f" (and {len(self.lost) - 1} more)" if len(self.lost) > 1 else ""))
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
