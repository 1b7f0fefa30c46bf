"""A dataset made from another (a corruption generated on the fly, an open-set stream) answers every question a
reader asks of a dataset as its source does (leftover of #31/#34: the two wrappers each copied a few of
FolderDataset's attributes, and both had lost `lost`, `found_layout`, `source` and `content_digest`, so an
open-set or corrupted run never read a webdataset sample back from a feature store and dropped the lost-sample
count from summary.json)."""
from __future__ import annotations

import hashlib

import pytest
from PIL import Image

from shiftlab.datasets.base import DatasetError, FolderDataset
from shiftlab.datasets.corrupted import CorruptedDataset
from shiftlab.datasets.openset import OpenSetDataset


def _folder(root, name, n, label_of=lambda i: i % 2, lost=(), layout="class folders"):
    root.mkdir(parents=True)
    samples = []
    for i in range(n):
        rel = f"c{label_of(i)}/{name}{i}.png" if label_of(i) is not None else f"x/{name}{i}.png"
        (root / rel).parent.mkdir(exist_ok=True)
        Image.new("RGB", (8, 8), (i * 20 % 256, 40, sum(map(ord, name)) % 256)).save(root / rel)   # ID != OOD bytes
        samples.append((rel, label_of(i)))
    return FolderDataset(root, sorted(samples), ["a", "b"], None, name, lost=list(lost), found_layout=layout)


@pytest.fixture
def parts(tmp_path):
    id_set = _folder(tmp_path / "id", "id", 4, lost=["s.tar: member 9 truncated"], layout="webdataset shards")
    ood = _folder(tmp_path / "ood", "o", 3, label_of=lambda i: None, lost=["o.tar: member 2 truncated"])
    return id_set, ood


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_generated_corruption_answers_as_its_source(parts):
    base, _ = parts
    corrupted = CorruptedDataset(base, "fog", 3, seed=0)
    assert corrupted.lost == base.lost and corrupted.found_layout == "webdataset shards"
    for i in range(len(base)):
        # the source's bytes: the feature store's key says what was done to them (the corruption)
        assert corrupted.content_digest(i) == base.content_digest(i) == _digest(base.path(i))
        assert corrupted.source(i) == base.source(i) and corrupted.read_bytes(i) == base.read_bytes(i)
        assert corrupted.label(i) == base.label(i) and corrupted.path(i) == base.path(i)
    assert (len(corrupted), corrupted.num_classes, corrupted.labels) == (4, 2, base.labels)
    with pytest.raises(DatasetError, match="samples are lost"):
        corrupted.require_complete()


def test_an_open_set_stream_answers_for_its_id_and_ood_samples(parts):
    id_set, ood = parts
    mixed = OpenSetDataset(id_set, {"ninco": ood}, ratio=0.5, seed=0)
    assert mixed.found_layout == "webdataset shards"
    assert mixed.lost == ["s.tar: member 9 truncated", "OOD ninco: o.tar: member 2 truncated"]
    for i in range(len(mixed)):
        origin, j = (id_set, i) if i < 4 else (ood, mixed.drawn[i - 4][1])
        assert mixed.content_digest(i) == origin.content_digest(j) and mixed.source(i) == origin.source(j)
        assert mixed.read_bytes(i) == origin.read_bytes(j) and mixed.path(i) == origin.path(j)
        assert mixed.label(i) == (id_set.label(i) if i < 4 else None) and mixed.is_ood(i) == (i >= 4)
    # an open-set stream corrupted on the fly stays open-set, and keeps every answer
    both = CorruptedDataset(mixed, "fog", 3, seed=0)
    assert both.is_ood(5) and both.open_set_info == mixed.open_set_info and both.lost == mixed.lost
    assert both.content_digest(5) == mixed.content_digest(5)


def test_lost_ood_samples_are_refused_without_allow_partial(parts):
    id_set, ood = parts
    id_set.lost.clear()
    mixed = OpenSetDataset(id_set, {"ninco": ood}, ratio=0.5, seed=0)
    with pytest.raises(DatasetError, match=r"^ninco \(OOD\): samples are lost \(1 problem\(s\)\): o.tar: member 2"):
        mixed.require_complete()
    ood.lost.clear()
    mixed.require_complete()


@pytest.mark.slow
def test_an_open_set_run_over_shards_is_read_back_from_the_feature_store(tmp_path, tiny_checkpoint, capsys):
    """The symptom: an open-set run over CLIP_benchmark's webdataset shards encoded every sample on every run
    (the wrapper had no content digest, a shard member is no file), as #34 finding 1 was for plain runs."""
    import shiftlab
    from shiftlab.cli import main as cli_main
    from test_shards import write_wds
    wds_root = tmp_path / "data"
    write_wds(wds_root / "wds_imagenet-r", [[0, 50], [100, 150]], shiftlab.classnames("imagenet-r"))
    ninco = wds_root / "NINCO" / "NINCO_OOD_classes" / "some_class"
    ninco.mkdir(parents=True)
    for k in range(4):
        Image.new("RGB", (40, 32), (30 * k, 90, 20)).save(ninco / f"x{k}.png")
    common = ["--dataset", "imagenet-r", "--data", str(wds_root), "--model", "shiftlab-tiny", "--pretrained",
              str(tiny_checkpoint), "--views", "1", "--workers", "0", "--no-progress", "--allow-partial",
              "--features", str(tmp_path / "fs"), "--features-dtype", "fp32", "--ood", "ninco", "--methods",
              "zeroshot"]
    for k, (read, encoded) in enumerate([(0, 8), (8, 0)]):
        assert cli_main(["run", *common, "--out", str(tmp_path / f"run{k}")]) == 0
        err = capsys.readouterr().err
        assert f"{read} sample(s) read from the store {tmp_path / 'fs'}, {encoded} encoded" in err, err
