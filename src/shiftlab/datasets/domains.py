"""Several datasets of one class list as one stream of domains: what the `continual` and `mixed` streams
run (shiftlab.rundir.stream, docs/PROTOCOLS.md).

`DomainSequence` is a dataset like any other (samples, classnames, `image(i)`, `path(i)`, `label(i)`): its
samples are each domain's in turn, their paths prefixed by the domain's name (`imagenet-c-fog/n01440764/..`),
so a record says which domain it came from. `domain_index[i]` is sample i's domain (0..D-1, in the order
given).
"""
from __future__ import annotations

import bisect
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from ..options import name_of, say
from .base import DatasetError, FolderDataset

SEPARATOR = "+"   # the run's dataset name: the domains' names joined, in stream order


@dataclass(repr=False)   # FolderDataset's one-line repr
class DomainSequence(FolderDataset):
    parts: list[FolderDataset] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)   # index of each part's first sample
    domains: list[str] = field(default_factory=list)  # each part's name in the stream (a dataset, `fog-5`)

    @property
    def domain_info(self) -> dict[str, dict | None]:
        """Each domain's shift as run.json records it (`shared.domains`): its corruption, or None."""
        return {name: getattr(part, "corruption_info", None) for name, part in zip(self.domains, self.parts)}

    @property
    def domain_index(self) -> list[int]:
        return [d for d, part in enumerate(self.parts) for _ in range(len(part))]

    def _locate(self, i: int) -> tuple[FolderDataset, int]:
        d = bisect.bisect_right(self.starts, i) - 1
        return self.parts[d], i - self.starts[d]

    def path(self, i: int) -> Path:
        part, j = self._locate(i)
        return part.path(j)

    def image(self, i: int) -> Image.Image:
        part, j = self._locate(i)
        return part.image(j)


def domain_sequence(datasets: Mapping[str, FolderDataset], name: str | None = None) -> DomainSequence:
    """The datasets (domain name -> dataset, in stream order) as one dataset of domains named `name` (default:
    the domains' names joined by SEPARATOR); a DatasetError (one line) unless there are two or more and all
    have the same class names in the same order."""
    names, title = list(datasets), name
    if len(names) < 2:
        raise DatasetError(f"a stream of domains needs two datasets or more ({say('datasets', 'a,b')} or "
                           f"{name_of('suite')}), got "
                           f"{len(names)}")
    first = datasets[names[0]]
    for name in names[1:]:
        other = datasets[name]
        if list(other.classnames) != list(first.classnames):
            differ = next((i for i, (a, b) in enumerate(zip(first.classnames, other.classnames)) if a != b),
                          min(len(first.classnames), len(other.classnames)))
            raise DatasetError(f"a stream of domains needs one class list: {name} ({len(other.classnames)} classes) "
                               f"differs from {names[0]} ({len(first.classnames)} classes) at class {differ}; "
                               "choose datasets of the same classes (e.g. corruptions of one dataset)")
    samples, starts, warnings = [], [], []
    for name in names:
        starts.append(len(samples))
        samples += [(f"{name}/{path}", label) for path, label in datasets[name].samples]
        warnings += [f"{name}: {w}" for w in datasets[name].warnings]
    root = Path(os.path.commonpath([str(datasets[n].root) for n in names]))
    return DomainSequence(root=root, samples=samples, classnames=list(first.classnames), wnids=first.wnids,
                          name=title or SEPARATOR.join(names), warnings=warnings, parts=[datasets[n] for n in names],
                          starts=starts, domains=names)
