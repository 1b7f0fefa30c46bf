"""Open-set streams: an in-distribution (ID) dataset mixed with images of one or more out-of-distribution (OOD)
datasets, as in CLIPTTA's open-set setting (MarcLafon/cliptta) and MCM's CLIP OOD benchmark (Ming et al.,
NeurIPS 2022: iNaturalist, SUN, Places, Textures as OOD for ImageNet).

`OpenSetDataset(id_dataset, {name: ood_dataset}, ratio, seed)`: the ID samples keep their ids 0..n_id-1, labels
and classes; after them come round(ratio x n_id) OOD images drawn without replacement from the OOD sets' union,
chosen by (seed, OOD set, path) alone (a SHA-256 rank, so the same images on every machine, whatever the order of
the OOD sets). An OOD sample's label is None (it has no ID class); its path is `ood/<set>/<path in its set>`.
"""
from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Mapping
from typing import Any

from ..options import name_of
from .base import DatasetError, FolderDataset
from .derived import DerivedDataset

__all__ = ["OOD_PREFIX", "OpenSetDataset", "MAX_OOD_RATIO"]

OOD_PREFIX = "ood"
MAX_OOD_RATIO = 10.0   # OOD images per ID image; more would make the ID part a footnote of the stream


def _rank(seed: int, name: str, path: str) -> str:
    return hashlib.sha256(f"{int(seed)}\t{name}\t{path}".encode()).hexdigest()


def _sizes(dataset: Any) -> list[int]:
    """Each sample's size in bytes: a stat for a plain file, else the length of its bytes."""
    plain = type(dataset).read_bytes is FolderDataset.read_bytes
    return [os.stat(dataset.path(i)).st_size if plain else len(dataset.read_bytes(i)) for i in range(len(dataset))]


def identical_images(id_dataset: Any, ood: Mapping[str, Any]) -> list[tuple[tuple[str, str], str]]:
    """The OOD images whose bytes are those of an ID image, as ((OOD set, its source), the ID image's source):
    sizes first, then SHA-256 (`content_digest`) of the images of a size both sides hold, so a run reads
    little more than the sizes. An image that cannot be read is the run's to report, not this check's."""
    try:
        id_sizes = _sizes(id_dataset)
        by_size: dict[int, list[int]] = {}
        for i, size in enumerate(id_sizes):
            by_size.setdefault(size, []).append(i)
        found, digests = [], {}
        for name, ds in ood.items():
            for j, size in enumerate(_sizes(ds)):
                if size not in by_size:
                    continue
                if size not in digests:
                    digests[size] = {id_dataset.content_digest(i): i for i in by_size[size]}
                match = digests[size].get(ds.content_digest(j))
                if match is not None:
                    found.append(((name, ds.source(j)), id_dataset.source(match)))
        return found
    except (OSError, AttributeError, TypeError):   # a dataset object without files or sizes
        return []


class OpenSetDataset(DerivedDataset):
    """ID samples then the drawn OOD samples; `is_ood(i)`, `label(i)` None for OOD, `open_set_info` for run.json.
    Each sample's files answer for the set it comes from (`origin`); the OOD sets' warnings and lost samples are
    the stream's too, named by set."""

    def __init__(self, id_dataset: Any, ood: Mapping[str, Any], ratio: float, seed: int):
        if not ood:
            raise DatasetError("an open-set run needs at least one OOD dataset")
        if not (0 < ratio <= MAX_OOD_RATIO):
            raise DatasetError(f"the OOD ratio must be in (0, {MAX_OOD_RATIO:g}] (OOD images per ID image), "
                               f"got {ratio!r}")
        n_id = len(id_dataset)
        wanted = int(round(ratio * n_id))
        pool = [(name, i, str(ds.samples[i][0])) for name, ds in ood.items() for i in range(len(ds))]
        same = identical_images(id_dataset, ood)
        if same:
            (name, ood_source), id_source = same[0]
            raise DatasetError(f"{len(same)} image(s) of the OOD set(s) are byte for byte images of the "
                               f"in-distribution dataset (e.g. {name}: {ood_source} = {id_source}): detection scores "
                               "on such a stream measure nothing; remove the copies from the OOD folder")
        if wanted < 1:
            raise DatasetError(f"an OOD ratio of {ratio:g} of {n_id} ID images draws no OOD image; raise it")
        if wanted > len(pool):
            most = len(pool) / n_id
            raise DatasetError(f"an OOD ratio of {ratio:g} asks {wanted} OOD images for {n_id} ID images, but "
                               f"{', '.join(ood)} hold only {len(pool)}; lower the ratio ({name_of('ood_ratio')} "
                               f"{math.floor(most * 1000) / 1000:g} or less), or add OOD images or sets "
                               f"({name_of('ood')}). The draw is over all {n_id} ID images even with "
                               f"{name_of('limit')}: a limited run is the start of the full run's stream")
        drawn = sorted(sorted(pool, key=lambda p: _rank(seed, p[0], p[2]))[:wanted], key=lambda p: (p[0], p[2]))
        super().__init__(id_dataset)
        self.id_dataset, self.ood = id_dataset, dict(ood)
        self.n_id, self.drawn = n_id, [(name, i) for name, i, _ in drawn]
        self.samples += [(f"{OOD_PREFIX}/{name}/{path}", None) for name, _, path in drawn]
        self.warnings += [f"OOD {name}: {w}" for name, ds in ood.items() for w in getattr(ds, "warnings", [])]
        self.lost += [f"OOD {name}: {w}" for name, ds in ood.items() for w in getattr(ds, "lost", [])]
        counts = {name: sum(1 for n, _ in self.drawn if n == name) for name in ood}
        self.open_set_info = {"ood": list(ood), "ratio": float(ratio), "seed": int(seed), "n_id": n_id,
                              "n_ood": wanted, "per_dataset": counts}

    def __repr__(self) -> str:
        return (f"OpenSetDataset({self.name}: {self.n_id} ID + {len(self.drawn)} OOD from {', '.join(self.ood)}, "
                f"ratio {self.open_set_info['ratio']:g}, seed {self.open_set_info['seed']})")

    def is_ood(self, i: int) -> bool:
        return i >= self.n_id

    def origin(self, i: int) -> tuple[Any, int]:
        if i < self.n_id:
            return self.id_dataset, i
        name, j = self.drawn[i - self.n_id]
        return self.ood[name], j

    def label(self, i: int) -> int | None:
        return self.id_dataset.label(i) if i < self.n_id else None

    def require_complete(self, *args: Any, **kwargs: Any) -> None:
        """The ID set's rule; and an OOD set whose files cannot deliver every sample is refused the same way."""
        self.id_dataset.require_complete(*args, **kwargs)
        for name, ds in self.ood.items():
            lost = list(getattr(ds, "lost", []))
            if lost:
                raise DatasetError(f"{name} (OOD): samples are lost ({len(lost)} problem(s)): {lost[0]}"
                                   + (f" (and {len(lost) - 1} more)" if len(lost) > 1 else ""))
