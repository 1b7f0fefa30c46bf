"""The ImageNet class table shipped with shiftlab (data/imagenet_classes.tsv), CLIP's templates and CoOp's
per-dataset template (data/coop_templates.json).

The table lists the 1000 ImageNet-1k classes in their standard index order (which is also the
sorted order of their WordNet ids), each with CLIP's cleaned class name (identical to
``open_clip.IMAGENET_CLASSNAMES``) and whether the class is one of the 200 of ImageNet-R / ImageNet-A.
Reading it from the package (not from open_clip) keeps the data layer importable without torch.
"""
from __future__ import annotations

import csv
import functools
import json
from collections.abc import Iterable
from importlib import resources
from typing import NamedTuple

__all__ = [
    "ClassRow", "imagenet_classes", "imagenet_wnids", "imagenet_classnames", "imagenet_r_wnids",
    "imagenet_a_wnids", "classnames_for_wnids", "load_templates", "dataset_templates",
]

_TABLE = "imagenet_classes.tsv"
_TEMPLATES = "clip_imagenet_templates.txt"
_COOP_TEMPLATES = "coop_templates.json"


class ClassRow(NamedTuple):
    index: int
    wnid: str
    name: str
    in_imagenet_r: bool
    in_imagenet_a: bool


def _read_data_text(filename: str) -> str:
    return resources.files("shiftlab").joinpath("data", filename).read_text(encoding="utf-8")


@functools.cache
def _rows() -> tuple[ClassRow, ...]:
    reader = csv.DictReader(_read_data_text(_TABLE).splitlines(), delimiter="\t")
    rows = tuple(
        ClassRow(int(r["index"]), r["wnid"], r["name"], r["in_imagenet_r"] == "1", r["in_imagenet_a"] == "1")
        for r in reader
    )
    # A broken table would silently mislabel every sample, so fail loudly here instead.
    if [r.index for r in rows] != list(range(1000)):
        raise RuntimeError(f"shiftlab/data/{_TABLE} must list indices 0..999 in order")
    return rows


@functools.cache
def _wnid_to_row() -> dict[str, ClassRow]:
    return {r.wnid: r for r in _rows()}


def imagenet_classes() -> list[tuple[int, str, str]]:
    """All 1000 ImageNet classes as ``(index, wnid, clip_name)``, in index order."""
    return [(r.index, r.wnid, r.name) for r in _rows()]


def imagenet_wnids() -> list[str]:
    """The 1000 ImageNet wnids in index order (= sorted order)."""
    return [r.wnid for r in _rows()]


def imagenet_classnames() -> list[str]:
    """The 1000 CLIP class names in index order (equal to ``open_clip.IMAGENET_CLASSNAMES``)."""
    return [r.name for r in _rows()]


def imagenet_r_wnids() -> list[str]:
    """The 200 ImageNet-R wnids, sorted; position in this list = ImageNet-R label."""
    return sorted(r.wnid for r in _rows() if r.in_imagenet_r)


def imagenet_a_wnids() -> list[str]:
    """The 200 ImageNet-A wnids, sorted; position in this list = ImageNet-A label."""
    return sorted(r.wnid for r in _rows() if r.in_imagenet_a)


def classnames_for_wnids(wnids: Iterable[str]) -> list[str]:
    """CLIP class names for the given wnids, in the same order. Unknown wnids raise ``KeyError``."""
    table = _wnid_to_row()
    wnids = list(wnids)
    unknown = [w for w in wnids if w not in table]
    if unknown:
        more = f" (+{len(unknown) - 10} more)" if len(unknown) > 10 else ""
        raise KeyError(f"not ImageNet-1k wnids: {unknown[:10]}{more}")
    return [table[w].name for w in wnids]


@functools.cache
def _templates() -> tuple[str, ...]:
    lines = [line.strip() for line in _read_data_text(_TEMPLATES).splitlines()]
    templates = tuple(line for line in lines if line)
    bad = [t for t in templates if t.count("{}") != 1]
    if bad:
        raise RuntimeError(f"shiftlab/data/{_TEMPLATES}: every template needs exactly one '{{}}': {bad[:3]}")
    return templates


def load_templates() -> list[str]:
    """CLIP's 80 ImageNet prompt templates, each with one ``{}`` placeholder for the class name."""
    return list(_templates())


@functools.cache
def _coop_templates() -> dict[str, tuple[str, ...]]:
    table = json.loads(_read_data_text(_COOP_TEMPLATES))["templates"]
    return {dataset: tuple(entry["templates"]) for dataset, entry in table.items()}


def dataset_templates(dataset: str) -> list[str]:
    """CoOp's prompt template for a dataset (canonical name: its zero-shot CLIP's CUSTOM_TEMPLATES,
    trainers/zsclip.py), e.g. ``["{} texture."]`` for ``dtd``; ``["a photo of a {}."]`` for a dataset
    CoOp names none for (``imagefolder``)."""
    return list(_coop_templates().get(dataset, ("a photo of a {}.",)))
