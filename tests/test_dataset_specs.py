"""The dataset table (shiftlab.datasets.specs): every entry is complete, and a dataset added as one entry
plus its class file is built, listed, named and titled with nothing else changed."""
from __future__ import annotations

import pytest

from _synthetic import make_image_folder
from shiftlab.commands.datasets import dataset_rows
from shiftlab.datasets import DATASETS, DatasetError, build_dataset, classnames
from shiftlab.datasets.classes import source_names, source_wnids
from shiftlab.datasets.specs import DatasetSpec, SplitLayout
from shiftlab.results.suite_table import column_title


@pytest.mark.parametrize("name", DATASETS.names())
def test_every_entry_names_its_classes_folders_and_title(name):
    spec = DATASETS.get(name)
    if spec.layout == "any":        # imagefolder: names and classes come from the folders
        assert spec.classes is None and spec.num_classes is None and not spec.dirnames
        with pytest.raises(DatasetError, match="its class names come from its folders"):
            classnames(name)
        return
    if spec.layout == "images":     # an out-of-distribution set (--ood): images without classes
        assert spec.classes is None and spec.num_classes is None and spec.short and spec.dirnames
        assert spec.url or spec.manual
        with pytest.raises(DatasetError, match="has no classes: it is an out-of-distribution set"):
            classnames(name)
        return
    names = classnames(name)
    assert len(names) == spec.num_classes > 1 and all(n and "_" not in n for n in names)
    assert spec.short and spec.dirnames and (spec.url or spec.manual)
    wnids = spec.wnids()
    if spec.layout == "wnid":       # its class folders are named by these
        assert wnids is not None and len(wnids) == len(names) and wnids == sorted(wnids)
    if spec.layout == "split":
        assert wnids is None and spec.split.test_size > 0


def test_column_titles_come_from_the_table():
    assert [column_title(d) for d in ("imagenet", "imagenet-r", "fgvc-aircraft", "oxford-pets")] == [
        "ImageNet", "-R", "Aircraft", "Pets"]
    assert column_title("average") == "Average" and column_title("my-own") == "my-own"


def test_class_sources_are_read_as_data():
    assert len(source_wnids("imagenet_classes.tsv")) == 1000
    assert len(source_wnids("imagenet_classes.tsv:in_imagenet_a")) == 200
    assert source_wnids("classes/dtd.txt") is None
    assert source_names("classes/oxford-pets.txt")[1] == "american bulldog"   # '_' read as a space
    with pytest.raises(KeyError, match="no subset column"):
        source_wnids("imagenet_classes.tsv:name")


def test_a_layout_and_its_split_go_together():
    with pytest.raises(ValueError, match="layout 'flat' is not one of"):
        DatasetSpec(name="x", layout="flat", classes=None)
    with pytest.raises(ValueError, match="needs its SplitLayout"):
        DatasetSpec(name="x", layout="split", classes="classes/dtd.txt")
    with pytest.raises(ValueError, match="needs its SplitLayout"):
        DatasetSpec(name="x", layout="index", classes="classes/dtd.txt", split=SplitLayout(None, ("",), 1))


def test_a_new_dataset_is_one_entry_plus_its_class_file(tmp_path):
    # EuroSAT's class file stands in for a new one: folders 0..9 under the entry's own folder name
    spec = DatasetSpec(name="eurosat-folders", layout="index", classes="classes/eurosat.txt", short="ES-F",
                       aliases=("esf",), dirnames=("eurosat_folders",), manual="by hand into {target}")
    DATASETS.register(spec.name, spec, aliases=spec.aliases)
    try:
        make_image_folder(tmp_path / "eurosat_folders", [str(i) for i in range(10)], per_class=2)
        ds = build_dataset("ESF", tmp_path)
        assert ds.name == "eurosat-folders" and ds.root == tmp_path / "eurosat_folders" and len(ds) == 20
        assert ds.classnames == classnames("esf") and ds.classnames[9] == "Sea or Lake"
        assert [label for _, label in ds.samples] == sorted(list(range(10)) * 2)
        assert column_title("eurosat-folders") == "ES-F"
        row = next(r for r in dataset_rows(str(tmp_path)) if r["name"] == "eurosat-folders")
        assert row["classes"] == 10 and row["found"] == str(tmp_path / "eurosat_folders")
        for image in (tmp_path / "eurosat_folders" / "9").iterdir():
            image.unlink()
        (tmp_path / "eurosat_folders" / "9").rmdir()
        with pytest.raises(DatasetError, match="lacks 1 of 10 class folders: 9"):
            build_dataset("esf", tmp_path)
    finally:
        DATASETS.pop(spec.name)
    assert "esf" not in DATASETS


def test_loaders_read_the_table_and_never_each_other():
    from test_layering import graph
    loaders = {f"shiftlab.datasets.{m}" for m in ("folders", "splits", "shards", "tables")}
    edges = graph()
    for loader in sorted(loaders):
        imported = {target for target, _ in edges[loader]}
        assert "shiftlab.datasets.specs" in imported and not imported & loaders, (loader, sorted(imported))
    assert loaders <= {target for target, _ in edges["shiftlab.datasets.build"]}   # the one builder picks them
