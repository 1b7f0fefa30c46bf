"""CLIP_benchmark's webdataset layout (the hub's wds_<name>): tar shards of <key>.<ext> + <key>.cls."""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

import shiftlab
from shiftlab.datasets import DatasetError, build_dataset
from shiftlab.synthetic import random_image


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_wds(root: Path, labels_per_shard: list[list[int]], names: list[str], fmt: str = "png") -> Path:
    """CLIP_benchmark's convert_dataset layout: classnames.txt, test/<n>.tar with s%07d.<fmt> + .cls."""
    (root / "test").mkdir(parents=True)
    (root / "classnames.txt").write_text("\n".join(names) + "\n")
    index = 0
    for shard, labels in enumerate(labels_per_shard):
        with tarfile.open(root / "test" / f"{shard}.tar", "w") as tar:
            for label in labels:
                buf = io.BytesIO()
                random_image((48, 40), seed=index).save(buf, format=fmt.upper())
                _add(tar, f"s{index:07d}.{fmt}", buf.getvalue())
                _add(tar, f"s{index:07d}.cls", str(label).encode())
                index += 1
    (root / "test" / "nshards.txt").write_text(f"{len(labels_per_shard)}\n")
    return root


def test_shards_are_indexed_in_order_and_read_back_exactly(tmp_path):
    names = shiftlab.classnames("imagenet-r")
    root = write_wds(tmp_path / "wds_imagenet-r", [[3, 0, 7], [199, 3]], names)
    ds = build_dataset("imagenet-r", tmp_path)                   # found under the hub's folder name
    assert ds.root == root and len(ds) == 5 and ds.classnames == names
    assert [label for _, label in ds.samples] == [3, 0, 7, 199, 3]
    assert ds.samples[3][0] == "test/1.tar/s0000003.png"
    for i in range(5):
        want = np.asarray(random_image((48, 40), seed=i).convert("RGB"))
        assert np.array_equal(np.asarray(ds.image(i)), want)
    assert len(ds.empty_classes) == 196


def test_a_class_list_that_is_not_shiftlabs_is_refused(tmp_path):
    names = shiftlab.classnames("imagenet-r")
    swapped = [names[1], names[0], *names[2:]]
    write_wds(tmp_path / "wds", [[0, 1]], swapped)
    with pytest.raises(DatasetError, match=r"not shiftlab's 200 imagenet-r classes in order "
                                           r"\(0: 'great white shark' != 'goldfish'"):
        build_dataset("imagenet-r", tmp_path / "wds")


def test_imagefolder_takes_the_shards_own_names_and_bad_labels_are_refused(tmp_path):
    ds = build_dataset("imagefolder", write_wds(tmp_path / "a", [[0, 1, 1]], ["cat", "dog"]))
    assert ds.classnames == ["cat", "dog"] and ds.labels == [0, 1, 1]
    write_wds(tmp_path / "b", [[0, 5]], ["cat", "dog"])
    with pytest.raises(DatasetError, match=r"s0000001.cls holds label 5, outside 0..1"):
        build_dataset("imagefolder", tmp_path / "b")


@pytest.mark.slow
def test_a_run_on_shards_writes_records_and_a_damaged_image_is_an_error_record(tmp_path, tiny_checkpoint):
    from shiftlab.cli import main as cli_main
    names = shiftlab.classnames("imagenet-r")
    root = write_wds(tmp_path / "wds_imagenet-r", [[0, 1, 2], [3]], names)
    with tarfile.open(root / "test" / "1.tar", "a") as tar:          # a corrupt image in the second shard
        _add(tar, "s0000009.png", b"\x89PNG garbage")
        _add(tar, "s0000009.cls", b"4")
    out = tmp_path / "run"
    argv = ["run", "--dataset", "imagenet-r", "--data", str(tmp_path), "--model", "shiftlab-tiny", "--pretrained",
            str(tiny_checkpoint), "--device", "cpu", "--methods", "zeroshot", "--views", "2", "--out", str(out),
            "--no-progress", "--allow-partial"]
    assert cli_main(argv) == 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(records) == 5 and [r["id"] for r in sorted(records, key=lambda r: r["id"])] == [0, 1, 2, 3, 4]
    bad = next(r for r in records if r.get("error"))
    assert bad["path"] == "test/1.tar/s0000009.png" and "not a recognised image format" in bad["error"]
    assert cli_main(argv + ["--resume"]) == 0                     # nothing left: same records
    assert len((out / "records.jsonl").read_text().splitlines()) == 5


# --- a shard never loses a sample without a word (issue 29 finding 4) ---------------------------------


def test_a_shard_cut_at_a_member_boundary_is_said_with_its_offset(tmp_path):
    """Issue 29 finding 4: 8 samples, the tar cut where a header begins: tar itself reads the first ones
    and stops without a word; the dataset says the shard and the byte where it ends."""
    names = shiftlab.classnames("imagenet-r")
    root = write_wds(tmp_path / "wds_imagenet-r", [list(range(8))], names)
    shard = root / "test" / "0.tar"
    data = shard.read_bytes()
    with tarfile.open(shard) as tar:
        cut = [m.offset for m in tar.getmembers()][10]          # the header of sample 5's image
    shard.write_bytes(data[:cut])
    ds = build_dataset("imagenet-r", tmp_path)
    assert len(ds) == 5 and ds.lost and all(str(cut) in line for line in ds.lost)
    assert any(line.startswith("test/0.tar:") and "truncated" in line for line in ds.lost)
    with pytest.raises(DatasetError, match=rf"samples are lost .*test/0.tar.* {cut}"):
        ds.require_complete()


def test_a_shard_cut_inside_an_image_loses_that_sample_by_name(tmp_path):
    names = shiftlab.classnames("imagenet-r")
    root = write_wds(tmp_path / "wds_imagenet-r", [list(range(4))], names)
    shard = root / "test" / "0.tar"
    with tarfile.open(shard) as tar:
        member = tar.getmember("s0000002.png")
    shard.write_bytes(shard.read_bytes()[:member.offset_data + 10])
    ds = build_dataset("imagenet-r", tmp_path)
    assert [p for p, _ in ds.samples] == ["test/0.tar/s0000000.png", "test/0.tar/s0000001.png"]
    assert ds.lost[0].startswith("test/0.tar/s0000002.png: the shard is truncated at byte "
                                 f"{member.offset_data + 10}")


@pytest.mark.parametrize("where", ["within", "across"])
def test_a_duplicate_key_is_refused_naming_both_members(tmp_path, where):
    names = ["cat", "dog"]
    root = write_wds(tmp_path / "d", [[0, 1], [1]], names)
    victim = root / "test" / ("0.tar" if where == "within" else "1.tar")
    with tarfile.open(victim, "a") as tar:
        _add(tar, "s0000000.png", b"another image under the same key")
    first = "test/0.tar/s0000000.png"
    second = f"{victim.relative_to(root).as_posix()}/s0000000.png"
    with pytest.raises(DatasetError, match=rf"duplicate sample key 's0000000': {first} and {second}"):
        build_dataset("imagefolder", root)


@pytest.mark.slow
def test_lost_samples_stop_a_run_unless_allow_partial_then_are_reported(tmp_path, tiny_checkpoint, capsys):
    """A truncated shard is one line naming the shard and the offset; with --allow-partial the run goes on
    and summary.json, summary.md and report.html say how many problems lost samples."""
    from shiftlab.cli import main as cli_main
    names = shiftlab.classnames("imagenet-r")
    root = write_wds(tmp_path / "wds_imagenet-r", [list(range(0, 200, 20))], names)
    shard = root / "test" / "0.tar"
    with tarfile.open(shard) as tar:
        cut = [m.offset for m in tar.getmembers()][8]             # the header of sample 4's image
    shard.write_bytes(shard.read_bytes()[:cut])
    argv = ["run", "--dataset", "imagenet-r", "--data", str(tmp_path), "--model", "shiftlab-tiny", "--pretrained",
            str(tiny_checkpoint), "--methods", "zeroshot", "--workers", "0", "--no-progress", "--out",
            str(tmp_path / "run")]
    capsys.readouterr()
    assert cli_main(argv) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "test/0.tar" in err[0] and str(cut) in err[0] and "Traceback" not in err[0]
    assert cli_main([*argv, "--allow-partial"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    lost = summary["config"]["dataset_lost"]
    assert lost and all(str(cut) in line for line in lost) and summary["methods"]["zeroshot"]["n"] == 4
    assert f"LOST SAMPLES: {len(lost)} problem(s)" in (tmp_path / "run" / "summary.md").read_text()
    assert cli_main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "rep")]) == 0
    assert "Samples lost: " in (tmp_path / "rep" / "report.html").read_text()
