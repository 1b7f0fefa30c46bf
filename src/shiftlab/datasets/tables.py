"""Hugging Face `datasets` datasets on disk, read with pyarrow alone (the `[hub]` extra): the hub
cache or a `hf download` of a parquet dataset (`data/test-00000-of-00001.parquet`, ...), and a
folder written by `Dataset.save_to_disk` (`dataset_info.json` + `data-*.arrow`).

Rows hold an `image` column (a struct of encoded `bytes` and a `path`, as `datasets.Image` stores
it) and an integer label column (`label`, or the one feature typed `ClassLabel`); the class order is
the `ClassLabel`'s `names`, read from the schema's `huggingface` metadata or `dataset_info.json`.
The test split is read where the files name one (`test`, else `validation`/`val`). A sample's id is
its place in (file name, row) order and its `path` is `<file>#<row>`, the same in every run.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from ..options import say
from .base import DatasetError, FolderDataset
from .imageio import ImageDecodeError, decode_image_bytes
from .specs import DatasetSpec

SPLIT_PREFERENCE = ("test", "validation", "val")


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise DatasetError("reading a Hugging Face parquet/arrow dataset needs pyarrow: "
                           "pip install 'shiftlab[hub]'") from None
    return pyarrow


TABLE_DIRS = ("", "data", "test", "validation", "val", "default", "default/test", "default/validation")


def table_files(directory: Path) -> list[Path]:
    """The parquet or arrow files of the test split where the hub's layouts keep them (the folder,
    `data/`, a split folder, `default/<split>/`); [] when there are none. Bounded: a folder of class
    folders is never walked."""
    files = sorted({p for sub in TABLE_DIRS if (directory / sub).is_dir() for p in (directory / sub).iterdir()
                    if p.suffix in (".parquet", ".arrow") and p.is_file()})
    for split in SPLIT_PREFERENCE:
        chosen = [p for p in files if re.search(rf"(^|[/_.-]){split}([/_.-]|$)", p.relative_to(directory).as_posix())]
        if chosen:
            return chosen
    return files


def _features(directory: Path, schema: Any) -> dict:
    meta = (schema.metadata or {}).get(b"huggingface")
    if meta:
        return json.loads(meta).get("info", {}).get("features", {})
    info = directory / "dataset_info.json"
    return json.loads(info.read_text()).get("features", {}) if info.is_file() else {}


def _columns(features: dict, schema: Any) -> tuple[str, str, list[str] | None]:
    image = next((n for n, f in features.items() if isinstance(f, dict) and f.get("_type") == "Image"), None)
    image = image or ("image" if "image" in schema.names else ("img" if "img" in schema.names else None))
    label = next((n for n, f in features.items() if isinstance(f, dict) and f.get("_type") == "ClassLabel"), None)
    label = label or next((n for n in ("label", "labels", "cls") if n in schema.names), None)
    missing = [what for what, name in (("an image", image), ("a label", label))
               if name is None or name not in schema.names]
    if missing:
        raise DatasetError(f"a table dataset needs {' and '.join(missing)} column; found {schema.names}")
    names = features.get(label, {}).get("names") if isinstance(features.get(label), dict) else None
    return image, label, names


def _read(path: Path) -> Any:
    pa = _pyarrow()
    if path.suffix == ".parquet":
        return pa.parquet.read_table(path)
    with pa.memory_map(str(path)) as source:
        try:
            return pa.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:
            return pa.ipc.open_file(source).read_all()


def _rows_without_image(path: Path, column: str) -> set[int]:
    """Rows whose image cell holds no bytes. A parquet file's statistics say so without reading the
    images; only a file whose statistics report (or do not rule out) nulls has its column read."""
    pa = _pyarrow()
    if path.suffix == ".parquet":
        meta = pa.parquet.ParquetFile(path).metadata
        leaves = {f"{column}.bytes", column}
        stats = [meta.row_group(g).column(c).statistics for g in range(meta.num_row_groups)
                 for c in range(meta.num_columns) if meta.row_group(g).column(c).path_in_schema in leaves]
        if stats and all(st is not None and st.has_null_count and st.null_count == 0 for st in stats):
            return set()
        cells = pa.parquet.read_table(path, columns=[column]).column(column)
    else:
        cells = _read(path).column(column)
    cells = cells.combine_chunks()
    data = cells.field("bytes") if pa.types.is_struct(cells.type) else cells
    nulls = data.is_null().to_pylist()
    if pa.types.is_struct(cells.type):
        nulls = [a or b for a, b in zip(nulls, cells.is_null().to_pylist())]
    return {row for row, null in enumerate(nulls) if null}


@dataclass(repr=False)   # FolderDataset's one-line repr
class TableDataset(FolderDataset):
    """A FolderDataset whose images are cells of parquet/arrow files: `rows[i]` = (file, row)."""
    rows: list[tuple[str, int]] = field(default_factory=list)
    image_column: str = "image"
    found_layout: str = "Hugging Face parquet/arrow table"

    def read_bytes(self, i: int) -> bytes:
        """The cell's encoded image bytes (OSError when the cell holds none)."""
        file, row = self.rows[i]
        cell = self._table(file).column(self.image_column)[row].as_py()
        data = cell.get("bytes") if isinstance(cell, dict) else cell
        if data is None:
            held = f"a path ({cell['path']})" if isinstance(cell, dict) and cell.get("path") else "null"
            raise OSError(f"the cell holds {held}, not the image bytes")
        return data

    def image(self, i: int) -> Image.Image:
        where = str(self.root / self.samples[i][0])
        try:
            data = self.read_bytes(i)
        except OSError as exc:
            raise ImageDecodeError(where, str(exc)) from None
        return decode_image_bytes(data, where)

    def _table(self, file: str) -> Any:
        # one file's image column kept per process (DataLoader workers each read their own), in file order
        cache = self.__dict__.setdefault("_open", {})
        if file not in cache:
            cache.clear()
            cache[file] = _read(self.root / file).select([self.image_column])
        return cache[file]

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_open", None)
        return state


def build_table_dataset(spec: DatasetSpec, directory: Path, expected: list[str] | None,
                        classnames: list[str] | None = None) -> TableDataset:
    """Index the table files under `directory` (see the module docstring)."""
    files = table_files(directory)
    if not files:
        raise DatasetError(f"{spec.name}: {directory} holds no parquet or arrow files")
    pa = _pyarrow()
    samples, rows, image_col, names, lost = [], [], "image", None, []
    for path in files:
        rel = path.relative_to(directory).as_posix()
        schema = pa.parquet.read_schema(path) if path.suffix == ".parquet" else _read(path).schema
        try:
            image_col, label_col, file_names = _columns(_features(directory, schema), schema)
        except DatasetError as exc:
            raise DatasetError(f"{spec.name}: {rel}: {exc}") from None
        names = names or file_names
        labels = (pa.parquet.read_table(path, columns=[label_col]) if path.suffix == ".parquet"
                  else _read(path).select([label_col])).column(label_col).to_pylist()
        no_image = _rows_without_image(path, image_col)
        for row, label in enumerate(labels):
            if row in no_image or not isinstance(label, int):
                what = "no image bytes (a null cell)" if row in no_image else f"label {label!r}, not a class index"
                lost.append(f"{rel}#{row}: {what}")
                continue
            samples.append((f"{rel}#{row}", int(label)))
            rows.append((rel, row))
    if names is None:
        names = expected or classnames
    if names is None:
        raise DatasetError(f"{spec.name}: {directory}'s label column has no ClassLabel names; pass {say('classnames')}")
    if expected is not None and [n.lower() for n in names] != [n.lower() for n in expected]:
        raise DatasetError(f"{spec.name}: the dataset's {len(names)} class names are not shiftlab's "
                           f"{len(expected)} {spec.name} classes in order (first: {names[:3]})")
    bad = [s for s in samples if not 0 <= s[1] < len(names)]
    if bad:
        raise DatasetError(f"{spec.name}: {bad[0][0]} has label {bad[0][1]}, outside 0..{len(names) - 1}")
    present = {label for _, label in samples}
    return TableDataset(root=directory, samples=samples, classnames=list(classnames or expected or names),
                        wnids=spec.wnids(), name=spec.name, image_column=image_col, rows=rows, lost=lost,
                        empty_classes=[n for i, n in enumerate(names) if i not in present])
