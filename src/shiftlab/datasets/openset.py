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
from collections.abc import Mapping
from typing import Any

from .base import DatasetError
from .derived import DerivedDataset

__all__ = ["OOD_PREFIX", "OpenSetDataset", "MAX_OOD_RATIO"]

OOD_PREFIX = "ood"
MAX_OOD_RATIO = 10.0   # OOD images per ID image; more would make the ID part a footnote of the stream


def _rank(seed: int, name: str, path: str) -> str:
    return hashlib.sha256(f"{int(seed)}\t{name}\t{path}".encode()).hexdigest()


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
        if wanted < 1:
            raise DatasetError(f"an OOD ratio of {ratio:g} of {n_id} ID images draws no OOD image; raise it")
        if wanted > len(pool):
            raise DatasetError(f"an OOD ratio of {ratio:g} asks {wanted} OOD images for {n_id} ID images, but "
                               f"{', '.join(ood)} hold only {len(pool)}; lower the ratio")
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
