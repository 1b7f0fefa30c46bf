"""Every registered method's records equal the stored ones (tests/fixtures/records/<method>.json).

The check that a change which moves code (a method into its folder, shared maths into common/, the engine's
steps) keeps behaviour: one small run of every method (tests/_records.py: its spec's offline + test config, 8
views, 4 synthetic images, the tiny random CLIP, one thread) through the engine, compared record by record with
what the same run wrote when the fixture was made. Ids, labels, predictions, top-5, correctness, paths and every
discrete extra exactly; floats within tests/_records.py's ABS_TOL / REL_TOL (bit-identical on the machine that
made them; the tolerance is for another CPU's float32 summation order).

A method registered after the fixtures were made has no file yet: its test is skipped with a message naming the
method and the command that writes its file (`python tests/fixtures/records/make_records.py NAME`), so that adding
a method stays one folder + its test + its fixtures. A change meant to change a method's records regenerates that
method's file and says so in its commit.
"""
from __future__ import annotations

import json

import pytest

import shiftlab
from _records import REGENERATE, differences, fixture_path, load_fixture, records_run

METHODS = shiftlab.list_methods()


@pytest.fixture(scope="module")
def run_records(tmp_path_factory):
    # only the methods with stored records run: a method added since (and not yet stored) cannot fail the others
    return records_run(tmp_path_factory.mktemp("records"), [n for n in METHODS if fixture_path(n).is_file()])


@pytest.mark.slow
@pytest.mark.parametrize("name", METHODS)
def test_records_equal_the_stored_ones(run_records, name):
    want = load_fixture(name)
    if want is None:
        pytest.skip(f"{name}: no stored records ({fixture_path(name).name}); make them with `{REGENERATE} {name}`")
    got = run_records[name]
    assert got, f"{name}: the run wrote no records"
    diffs = differences(got, want, name)
    assert not diffs, f"{name}: {len(diffs)} differences from the stored records, first: " + "; ".join(diffs[:5])


def test_every_stored_file_is_a_registered_method():
    # a file left behind by a renamed or removed method would never be compared
    stored = {p.stem for p in fixture_path("x").parent.glob("*.json")}
    assert stored <= set(METHODS), sorted(stored - set(METHODS))
    for name in stored:
        assert json.loads(fixture_path(name).read_text())["method"] == name


def test_differences_sees_what_a_refactor_could_change():
    rec = {"pred": 3, "top5": [3, 1, 0, 2, 4], "confidence": 0.25, "extras": {"loss": 5.1, "stored": True}}
    assert differences(rec, rec) == []
    assert differences({**rec, "confidence": 0.25 + 5e-6}, rec) == []          # float32 rounding elsewhere
    assert differences({**rec, "confidence": 0.2501}, rec)                       # a real change
    assert differences({**rec, "pred": 1}, rec) and differences({**rec, "top5": [3, 1, 0, 4, 2]}, rec)
    assert differences({**rec, "extras": {"loss": 5.1, "stored": False}}, rec)
    assert differences({**rec, "extras": {"loss": 5.1}}, rec)                    # a field gone
    assert differences({**rec, "pred": 3.0}, rec)                                # an int became a float
    assert differences([rec], [rec, rec])
