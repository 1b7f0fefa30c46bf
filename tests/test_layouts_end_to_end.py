"""Every dataset layout works with every feature (issue 34 item 1): tiny class-folder, CoOp-split,
webdataset and parquet datasets each go through `datasets --data`, `run --features` twice (the second
run encodes nothing), `sweep` from the same store and `report`."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import shiftlab
from _synthetic import make_split_dataset
from shiftlab.cli import main as cli_main
from shiftlab.synthetic import make_imagenet_r
from test_shards import write_wds
from test_tables import write_parquet

pytest.importorskip("pyarrow")


def _layouts(root: Path) -> dict[str, tuple[str, Path, Path, str, int]]:
    """layout -> (dataset, --data, the folder `datasets` must find, the layout it must say, images)."""
    names = shiftlab.classnames("imagenet-r")
    folders = make_imagenet_r(root / "folders", classes=range(0, 200, 50), size=(48, 40))
    image_dir, _ = make_split_dataset(root / "coop", "eurosat", with_images=range(4), real_images=True)
    wds = write_wds(root / "hub" / "wds_imagenet-r", [[0, 50], [100, 150]], names)
    table = write_parquet(root / "parquet" / "imagenet-r", [[0, 50, 100, 150]], names)
    return {"folders": ("imagenet-r", root / "folders", folders, "class folders", 4),
            "coop": ("eurosat", root / "coop", image_dir.parent, "test split file", 4),
            "wds": ("imagenet-r", root / "hub", wds, "webdataset shards", 4),
            "parquet": ("imagenet-r", root / "parquet", table, "Hugging Face parquet/arrow table", 4)}


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["folders", "coop", "wds", "parquet"])
def test_every_layout_is_found_read_back_from_the_store_swept_and_reported(tmp_path, tiny_checkpoint, capsys,
                                                                         layout):
    dataset, data, folder, said, n = _layouts(tmp_path / "data")[layout]
    assert cli_main(["datasets", "--data", str(data), "--json"]) == 0
    row = next(r for r in json.loads(capsys.readouterr().out) if r["name"] == dataset)
    assert (row["found"], row["found_layout"], row["found_images"]) == (str(folder), said, n)
    common = ["--dataset", dataset, "--data", str(data), "--model", "shiftlab-tiny", "--pretrained",
              str(tiny_checkpoint), "--views", "4", "--workers", "0", "--no-progress", "--allow-partial",
              "--features", str(tmp_path / "fs"), "--features-dtype", "fp32", "--batch-size", "1"]
    for k, (read, encoded) in enumerate([(0, n), (n, 0)]):
        assert cli_main(["run", *common, "--methods", "zeroshot,tda", "--out", str(tmp_path / f"run{k}")]) == 0
        err = capsys.readouterr().err
        assert f"{read} sample(s) read from the store {tmp_path / 'fs'}, {encoded} encoded" in err, err
    recs = [{(r["id"], r["method"]): {k: v for k, v in r.items() if k != "seconds"}
             for r in map(json.loads, (tmp_path / f"run{k}" / "records.jsonl").read_text().splitlines())}
            for k in (0, 1)]
    assert recs[0] == recs[1] and len(recs[0]) == 2 * n
    assert cli_main(["sweep", *common, "--grid", "tda.pos_alpha=1,4", "--out", str(tmp_path / "sweep")]) == 0
    assert f"{n} sample(s) read from the store" in capsys.readouterr().err
    assert cli_main(["report", str(tmp_path / "run1"), str(tmp_path / "sweep"), "--out", str(tmp_path / "rep")]) == 0
    html = (tmp_path / "rep" / "report.html").read_text()
    assert re.search(r'<section id="sweep">.*tda.pos_alpha=4.0.*</section>', html, re.S)
