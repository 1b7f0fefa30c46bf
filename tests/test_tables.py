"""Hugging Face `datasets` folders read with pyarrow: parquet files (the hub) and save_to_disk arrow files."""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

import shiftlab
from shiftlab.datasets import DatasetError, build_dataset
from shiftlab.synthetic import random_image

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    random_image((40, 36), seed=seed).save(buf, format="PNG")
    return buf.getvalue()


def _table(labels: list[int], names: list[str], start: int = 0):
    features = {"image": {"_type": "Image"}, "label": {"names": names, "_type": "ClassLabel"}}
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    images = pa.array([{"bytes": _png(start + i), "path": None} for i in range(len(labels))], type=image_type)
    table = pa.table({"image": images, "label": pa.array(labels, pa.int64())})
    return table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})


def write_parquet(root: Path, shards: list[list[int]], names: list[str]) -> Path:
    """The hub's parquet layout: data/test-0000N-of-0000M.parquet (+ a train split that must be ignored)."""
    (root / "data").mkdir(parents=True)
    start = 0
    for k, labels in enumerate(shards):
        pq.write_table(_table(labels, names, start), root / "data" / f"test-{k:05d}-of-{len(shards):05d}.parquet")
        start += len(labels)
    pq.write_table(_table([0], names, 99), root / "data" / "train-00000-of-00001.parquet")
    return root


def test_parquet_test_split_in_order_with_the_classlabel_names(tmp_path):
    names = shiftlab.classnames("imagenet-r")
    root = write_parquet(tmp_path / "imagenet-r", [[5, 0], [199]], names)
    ds = build_dataset("imagenet-r", tmp_path)
    assert ds.root == root and ds.labels == [5, 0, 199] and ds.classnames == names
    assert ds.samples[2][0] == "data/test-00001-of-00002.parquet#0"
    for i in range(3):
        assert np.array_equal(np.asarray(ds.image(i)), np.asarray(random_image((40, 36), seed=i).convert("RGB")))


def test_save_to_disk_arrow_files_and_wrong_class_lists(tmp_path):
    root = tmp_path / "saved"
    root.mkdir()
    table = _table([1, 0, 1], ["cat", "dog"])
    with pa.OSFile(str(root / "data-00000-of-00001.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    ds = build_dataset("imagefolder", root)
    assert ds.classnames == ["cat", "dog"] and ds.labels == [1, 0, 1]
    assert np.array_equal(np.asarray(ds.image(1)), np.asarray(random_image((40, 36), seed=1).convert("RGB")))
    write_parquet(tmp_path / "imagenet-a", [[0]], ["x", "y"])
    with pytest.raises(DatasetError, match="not shiftlab's 200 imagenet-a classes in order"):
        build_dataset("imagenet-a", tmp_path / "imagenet-a")


# --- a table never loses a sample without a word (issue 29 item 2) -------------------------------------


def test_null_image_cells_and_labels_are_counted_and_missing_columns_named(tmp_path):
    names = ["cat", "dog", "fox"]
    root = tmp_path / "t"
    (root / "data").mkdir(parents=True)
    table = _table([0, 1, 2, 1], names)
    rows = table.to_pylist()
    rows[1]["image"]["bytes"] = None
    rows[3]["label"] = None
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), root / "data" / "test-00000-of-00001.parquet")
    ds = build_dataset("imagefolder", root)
    assert [p for p, _ in ds.samples] == ["data/test-00000-of-00001.parquet#0", "data/test-00000-of-00001.parquet#2"]
    assert ds.lost == ["data/test-00000-of-00001.parquet#1: no image bytes (a null cell)",
                       "data/test-00000-of-00001.parquet#3: label None, not a class index"]
    with pytest.raises(DatasetError, match=r"samples are lost \(2 problem\(s\)\): data/test-00000-of-00001.parquet#1"):
        ds.require_complete()
    pq.write_table(table.drop_columns(["label"]), root / "data" / "test-00000-of-00001.parquet")
    with pytest.raises(DatasetError, match=r"^imagefolder: data/test-00000-of-00001.parquet: a table dataset needs "
                                           r"a label column; found \['image'\]$"):
        build_dataset("imagefolder", root)
