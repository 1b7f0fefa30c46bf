"""The report's stream sections: accuracy over the recorded stream per online method, and a box per method
over `--orders K` with its table (mean, std, worst, ETA, sign test against zero-shot)."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from _runs import json_lines
from _synthetic import make_image_folder
from shiftlab.datasets.build import build_dataset
from shiftlab.engine.config import RunConfig, run_stream
from shiftlab.engine.loop import run
from shiftlab.report import build_report
from shiftlab.report.streams import running_accuracy
from shiftlab.rundir.stream import STREAM_FILE, read_stream

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def orders_run(tmp_path_factory, tiny_model):
    tmp = tmp_path_factory.mktemp("report_streams")
    data = build_dataset("imagefolder", make_image_folder(tmp / "data", ["cat", "dog", "fox"], per_class=3,
                                                          size=(48, 40)))
    config = RunConfig(dataset="imagefolder", methods=["zeroshot", "tda"], workers=0, progress=False, batch_size=2,
                       seed=5, views=4, out=str(tmp / "run"), device="cpu", orders=3, order="dirichlet", delta=0.5)
    run(config, model=tiny_model, dataset=data)
    return tmp / "run", config, data


@pytest.mark.slow
def test_stream_json_records_the_order_the_online_method_saw(orders_run):
    out, config, data = orders_run
    stream = read_stream(out)
    seed = json.loads((out / "run.json").read_text())["shared"]["stream_seed"]
    from dataclasses import replace
    assert stream["ids"] == run_stream(replace(config, stream_seed=seed), data)
    assert (stream["order"], stream["delta"], stream["online"], stream["seed"]) == ("dirichlet", 0.5, ["tda"], seed)
    # the online method's records were made in that order: its state counts what it has seen
    tda = [r["id"] for r in json_lines(out / "records.jsonl") if r["method"] == "tda"]
    assert sorted(tda) == sorted(stream["ids"])


@pytest.mark.slow
def test_report_draws_accuracy_over_the_stream_and_the_orders(orders_run, tmp_path):
    out, _, _ = orders_run
    html = build_report([out], tmp_path / "report").read_text()
    section = re.search(r'<section id="stream">.*?</section>', html, re.S).group(0)
    assert "tda" in section and "<img" in section and "dirichlet, delta 0.5" in section
    orders = re.search(r'<section id="orders">.*?</section>', html, re.S).group(0)
    table = json.loads((out / "orders.json").read_text())
    for name in ("zeroshot", "tda"):
        assert f"{table['methods'][name]['eta']:.2f}" in orders
    assert "<img" in orders and list((tmp_path / "report").glob("orders_*.png"))
    # a run without stream.json (made before streams were recorded) is named, not drawn
    (out / STREAM_FILE).rename(out / "stream.json.bak")
    try:
        html = build_report([out], tmp_path / "report2").read_text()
    finally:
        (out / "stream.json.bak").rename(out / STREAM_FILE)
    assert '<section id="stream">' not in html


def test_running_accuracy_is_the_cumulative_mean_in_stream_order(tmp_path):
    from shiftlab.report.load import Series
    ids = np.array([0, 1, 2, 3, 4])
    correct = np.array([True, False, True, True, False])
    s = Series(run=None, method="m", setting="clean", setting_label="clean", attack_eps=None, ids=ids,
               labels=ids, preds=ids, correct=correct, confidence=ids.astype(float), true_prob=ids.astype(float),
               top5=None, paths=[""] * 5, seconds=ids.astype(float))
    order = [3, 1, 4, 0, 7, 2]   # 7: no prediction (an error record), skipped
    x, y = running_accuracy(s, order)
    hits = [1, 0, 0, 1, 1]
    assert x.tolist() == [1, 2, 3, 4, 5]
    assert y.tolist() == pytest.approx([100 * sum(hits[:k]) / k for k in range(1, 6)])
