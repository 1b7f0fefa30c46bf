"""The class tables shipped with shiftlab (``data/``), CLIP's templates and CoOp's per-dataset template
(data/coop_templates.json).

A dataset names where its class names are (``DatasetSpec.classes``), as a file under ``data/``:

- ``imagenet_classes.tsv``: the 1000 ImageNet-1k classes in their standard index order (which is
  also the sorted order of their WordNet ids), each with CLIP's cleaned class name (identical to
  ``open_clip.IMAGENET_CLASSNAMES``) and whether it is one of the 200 of ImageNet-R / ImageNet-A;
  ``imagenet_classes.tsv:<column>`` is the rows marked 1 in that column (ImageNet-R's 200), in order.
  These datasets have wnids (their class folders' names);
- ``classes/<name>.txt``: one class name per line in label order (``#`` lines are comments naming the
  source), ``_`` read as a space as the methods' code does.

Reading them from the package (not from open_clip) keeps the data layer importable without torch.
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
    "imagenet_a_wnids", "classnames_for_wnids", "load_templates", "dataset_templates", "source_wnids",
    "source_names", "source_size", "raw_names",
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
    # A broken table would silently mislabel every sample, so fail loudly here instead; a subset's labels
    # are positions in table order, which is then the sorted order of its wnids (as the authors' loaders sort).
    if [r.index for r in rows] != list(range(1000)) or [r.wnid for r in rows] != sorted(r.wnid for r in rows):
        raise RuntimeError(f"shiftlab/data/{_TABLE} must list indices 0..999 in order, its wnids sorted")
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
    return [r.wnid for r in _rows() if r.in_imagenet_r]


def imagenet_a_wnids() -> list[str]:
    """The 200 ImageNet-A wnids, sorted; position in this list = ImageNet-A label."""
    return [r.wnid for r in _rows() if r.in_imagenet_a]


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


# --------------------------------------------------------------------- a dataset's class source

def _split_source(source: str) -> tuple[str, str | None]:
    file, _, column = source.partition(":")
    return file, column or None


def source_wnids(source: str) -> list[str] | None:
    """The wnids of class source ``source`` in label order (see the module docstring), or None when its
    classes have none (a ``.txt`` list)."""
    file, column = _split_source(source)
    if file != _TABLE:
        return None
    if column is None:
        return imagenet_wnids()
    if column not in ClassRow._fields or not column.startswith("in_"):
        raise KeyError(f"{source}: {_TABLE} has no subset column {column!r}")
    return [r.wnid for r in _rows() if getattr(r, column)]


@functools.cache
def _list_file(file: str) -> tuple[str, ...]:
    if not file.endswith(".txt"):
        raise KeyError(f"{file}: a class source is {_TABLE}[:column] or a .txt list under shiftlab/data")
    lines = (line.strip() for line in _read_data_text(file).splitlines())
    return tuple(line for line in lines if line and not line.startswith("#"))


def raw_names(source: str) -> list[str]:
    """The names of a ``.txt`` class source as written there (``_`` kept: a dataset's own files use them)."""
    return list(_list_file(_split_source(source)[0]))


@functools.cache
def _source_names(source: str) -> tuple[str, ...]:
    wnids = source_wnids(source)
    if wnids is not None:
        return tuple(classnames_for_wnids(wnids))
    return tuple(name.replace("_", " ") for name in raw_names(source))


def source_names(source: str) -> list[str]:
    """The CLIP class names of class source ``source`` in label order."""
    return list(_source_names(source))


def source_size(source: str) -> int:
    """How many classes class source ``source`` has."""
    return len(_source_names(source))


@functools.cache
def _coop_templates() -> dict[str, tuple[str, ...]]:
    table = json.loads(_read_data_text(_COOP_TEMPLATES))["templates"]
    return {dataset: tuple(entry["templates"]) for dataset, entry in table.items()}


def dataset_templates(dataset: str) -> list[str]:
    """CoOp's prompt template for a dataset (canonical name: its zero-shot CLIP's CUSTOM_TEMPLATES,
    trainers/zsclip.py), e.g. ``["{} texture."]`` for ``dtd``; ``["a photo of a {}."]`` for a dataset
    CoOp names none for (``imagefolder``)."""
    return list(_coop_templates().get(dataset, ("a photo of a {}.",)))
