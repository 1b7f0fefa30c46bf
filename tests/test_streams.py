"""Stream kinds (shiftlab.rundir.stream): the authors' Dirichlet label shift, class-sorted, OGA's order seeds."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from shiftlab.options import speaking_cli
from shiftlab.rundir.stream import dirichlet_order, order_seeds, stream_order, stream_problem

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "golden" / "streams" / "dirichlet.json"


def test_dirichlet_order_equals_the_authors_sort_by_dirichlet():
    data = json.loads(GOLDEN.read_text())
    assert data["source"].startswith("mariodoebler/test-time-adaptation@") and "data_loading.py:329" in data["source"]
    for case in data["cases"]:
        ours = dirichlet_order(case["labels"], case["delta"], case["seed"])
        assert ours == case["order"], (case["delta"], case["seed"])
        assert sorted(ours) == list(range(len(case["labels"])))


def test_dirichlet_small_delta_makes_long_runs_of_one_class():
    labels = [i % 4 for i in range(80)]
    def switches(order):
        return sum(labels[a] != labels[b] for a, b in zip(order, order[1:]))
    shifted = stream_order(80, "dirichlet", 3, labels=labels, delta=0.01)
    iid = stream_order(80, "shuffled", 3)
    assert sorted(shifted) == list(range(80))
    assert switches(shifted) < switches(iid) / 3


def test_dirichlet_on_a_tiny_dataset_ends_instead_of_timing_out():
    labels = [0, 0, 1, 1, 2]   # under 10 samples per class: the authors' threshold of 10 cannot be met
    order = stream_order(5, "dirichlet", 0, labels=labels, delta=0.1)
    assert sorted(order) == [0, 1, 2, 3, 4]


def test_iid_is_todays_seeded_shuffle_and_class_sorted_is_stable():
    assert stream_order(10, "iid", 4) == torch.randperm(10, generator=torch.Generator().manual_seed(4)).tolist()
    assert stream_order(10, "iid", 4) == stream_order(10, "shuffled", 4)
    labels = [2, 0, 1, 0, 2, 1]
    assert stream_order(6, "class-sorted", 9, labels=labels) == [1, 3, 2, 5, 0, 4]


def test_order_seeds_are_ogas_draw_and_one_order_is_the_run_seed():
    assert order_seeds(5, 1) == [5]
    expected = np.random.default_rng(42).choice(range(10000 * 20), size=20, replace=False).tolist()
    assert order_seeds(42, 20) == expected
    assert len(set(order_seeds(0, 100))) == 100


@pytest.mark.parametrize(("kind", "delta", "orders", "words", "cli_words"), [
    ("dirichlet", None, 1, "delta=D", "--delta D"),
    ("dirichlet", 0.0, 1, "delta must be a finite number > 0", "--delta must be a finite number > 0"),
    ("dirichlet", float("nan"), 1, "must be a finite number > 0", "must be a finite number > 0"),
    ("shuffled", 0.1, 1, "drop delta)", "drop --delta)"),
    ("class-sorted", None, 3, "orders=3: the class-sorted stream has one order only",
     "--orders 3: the class-sorted stream has one order only"),
    ("sorted", None, 2, "use order=shuffled or", "use --order shuffled or"),
    ("shuffled", None, 0, "orders must be an integer >= 1", "--orders must be an integer >= 1"),
    ("zigzag", None, 1, "stream order must be one of", "stream order must be one of"),
])
def test_stream_problems_are_one_line(kind, delta, orders, words, cli_words):
    # the library names its keywords (delta=, orders=), the command line its flags (#34)
    problem = stream_problem(kind, delta, orders)
    assert problem is not None and words in problem and "\n" not in problem and " --" not in problem
    with speaking_cli():
        assert cli_words in stream_problem(kind, delta, orders)


def test_streams_are_permutations_with_counts_kept():
    labels = [i % 3 for i in range(30)]
    for kind, delta in (("shuffled", None), ("sorted", None), ("class-sorted", None), ("dirichlet", 0.5)):
        order = stream_order(30, kind, 1, labels=labels, delta=delta)
        assert Counter(order) == Counter(range(30)), kind


def test_stream_json_is_read_only_as_written(tmp_path, capsys):
    # stream.json decides which ids a merge keeps (the run's schema) and what the report draws: one edited by hand
    # (its ids, its kind) or of the wrong shape is said and not read, never trusted for what it claims
    from shiftlab.rundir.stream import STREAM_FILE, read_stream, write_stream
    write_stream(tmp_path, [2, 0, 1], "shuffled", 7, None, ["tda"], None)
    stream = read_stream(tmp_path)
    assert (stream["ids"], stream["order"], stream["seed"], stream["online"]) == ([2, 0, 1], "shuffled", 7, ["tda"])
    path = tmp_path / STREAM_FILE
    written = json.loads(path.read_text())
    for edit in ({"ids": [2, 0]}, {"order": "sorted"}, {"online": []}):
        path.write_text(json.dumps({**written, **edit}))
        assert read_stream(tmp_path) is None
        assert f"shiftlab: warning: {path} does not match its own checksum" in capsys.readouterr().err
    old = {k: v for k, v in written.items() if k != "self_sha256"}   # written before the checksum: read as before
    path.write_text(json.dumps(old))
    assert read_stream(tmp_path)["ids"] == [2, 0, 1]
    for shape in ({**old, "ids": [1, "x"]}, {**old, "order": 5}, {**old, "online": [3]}, {**old, "delta": "0.1"},
                  [1, 2]):
        path.write_text(json.dumps(shape))
        assert read_stream(tmp_path) is None
        assert f"shiftlab: warning: {path} is not a stream record" in capsys.readouterr().err
