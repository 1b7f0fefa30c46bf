"""The record contract (shiftlab.rundir.records): schema vs docs, constructors, reader, writer, scoring."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from shiftlab.methods.base import MethodOutput
from shiftlab.results import metrics, scoring
from shiftlab.rundir import record_files, records
from shiftlab.rundir.records import Record

DOCS = Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md"


def _records_section() -> str:
    text = DOCS.read_text()
    return text[text.index("**records.jsonl**"):text.index("**The run directory**")]


def test_docs_schema_matches_the_record_type():
    section = _records_section()
    examples = [json.loads(block) for block in re.findall(r"```json\n(.*?)\n```", section, re.S)]
    documented = set().union(*examples) | set(re.findall(r"^- `(\w+)`", section, re.M)) \
        | set(re.findall(r"(?:;|,) `(\w+)`", section))
    assert documented == set(records.schema_fields())
    for example in examples:   # every documented example is a record and round-trips unchanged
        assert Record.from_dict(example).to_dict() == example


def test_prediction_record_from_an_output():
    logits = torch.tensor([0.0, 3.0, 1.0, -1.0, 2.0, 0.5])
    rec = Record.prediction(id=4, path="a/b.jpg", label=4, setting="clean", method="m",
                            output=MethodOutput(logits, extras={"x": 1.0}), seconds=0.5)
    probs = logits.softmax(-1)
    assert rec.pred == 1 and rec.correct is False and rec.top5 == [1, 4, 2, 5, 0]
    assert rec.confidence == pytest.approx(float(probs[1])) and rec.true_prob == pytest.approx(float(probs[4]))
    d = rec.with_attack({"name": "pgd", "flipped": True}).to_dict()
    assert d["attack"] == {"name": "pgd", "flipped": True} and "error" not in d
    assert Record.failure(id=1, path="p", label=0, setting="clean", method=None, error="bad").to_dict() == {
        "id": 1, "path": "p", "label": 0, "setting": "clean", "method": None, "error": "bad"}


def _good(sid: int = 0, **kw) -> dict:
    """A complete prediction record (what Record.prediction writes)."""
    return {"id": sid, "path": f"c/{sid}.jpg", "label": 1, "setting": "clean", "method": "m", "pred": 1,
            "top5": [1, 0], "confidence": 0.75, "true_prob": 0.75, "correct": True, "seconds": 0.5, **kw}


def test_reader_skips_damage_and_counts_it_when_asked(tmp_path):
    path = tmp_path / "records.jsonl"
    good = _good()
    path.write_bytes((json.dumps(good) + "\n").encode() + b"garbage\n" + b"\0" * 40 + b"\n"
                     + b'{"id": "x"}\n' + (json.dumps({**good, "id": 2}) + "\n").encode() + b'{"id": 3, "me')
    assert [r["id"] for r in record_files.iter_records(path)] == [0, 2]
    lines = list(record_files.scan(path, include_torn=True))
    assert [(ln.number, ln.record is None) for ln in lines] == [(1, False), (2, True), (3, True), (4, True),
                                                                 (5, False), (6, True)]


def test_score_matches_the_metric_definitions():
    labels, correct = [0, 1, 2, 1], [True, False, True, True]
    top5 = [[0, 1], [2, 0], [2, 1], [0, 1]]
    conf, prob = [0.9, 0.6, 0.7, 0.4], [0.9, 0.1, 0.7, 0.3]
    got = scoring.score(labels, correct, top5, conf, prob)
    assert got == {"top1": 75.0, "top5": 75.0, "ece": metrics.ece(conf, correct),
                   "ece20": metrics.ece(conf, correct, n_bins=20), "nll": metrics.nll(prob), "n": 4}
    recs = [{"label": y, "pred": y if c else -1, "correct": c, "top5": t, "confidence": f, "true_prob": p}
            for y, c, t, f, p in zip(labels, correct, top5, conf, prob)]
    assert scoring.score_records(recs) == got
    partial = scoring.score(labels, correct, None, [0.9, np.nan, 0.7, 0.4], prob)
    assert math.isnan(partial["top5"]) and math.isnan(partial["ece"]) and math.isnan(partial["ece20"])
    assert partial["nll"] == got["nll"]


def test_writer_names_the_path_when_the_folder_is_a_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(record_files.RunDirError, match=re.escape(str(blocker / "run"))):
        record_files.ensure_run_dir(blocker / "run")


def test_a_run_folder_that_cannot_be_made_says_only_what_failed(tmp_path):
    """`shiftlab run --out /proc/x` said "(then rerun with --resume: the records written so far are kept)" when
    the folder could not even be made: nothing was written."""
    from shiftlab.options import speaking_cli
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with speaking_cli(), pytest.raises(record_files.RunDirError) as info:
        record_files.ensure_run_dir(blocker / "run")
    assert str(info.value) == f"{blocker / 'run'}: {info.value.strerror}"


@pytest.mark.parametrize("change,reason", [
    ({"label": None}, "label must be an integer >= 0"),
    ({"id": True}, "id must be an integer >= 0"),
    ({"id": -1}, "id must be an integer >= 0"),
    ({"path": 3}, "path must be a string"),
    ({"method": None}, "method must be a method name"),
    ({"setting": ""}, "setting must be a non-empty string"),
    ({"pred": 1.0}, "pred must be an integer"),
    ({"top5": []}, "top5 must be a non-empty list"),
    ({"top5": [1, "2"]}, "top5 must be a non-empty list"),
    ({"confidence": 1.5}, "confidence must be a probability"),
    ({"true_prob": -0.1}, "true_prob must be a probability"),
    ({"correct": False}, "correct must be pred == label"),
    ({"correct": 1}, "correct must be pred == label"),
    ({"seconds": -1}, "seconds must be a number of seconds >= 0"),
    ({"extras": [1]}, "extras must be an object"),
    ({"extras": {"loss": float("inf")}}, "extras holds a non-finite number"),
    ({"colour": "red"}, "unknown field(s): colour"),
    ({"error": "boom"}, "an error record has no pred, top5"),
], ids=lambda v: str(v)[:30])
def test_schema_refuses_each_broken_field(change, reason):
    Record.from_dict(_good())                                  # the unbroken record is one
    with pytest.raises(ValueError, match=re.escape(reason)):
        Record.from_dict({**_good(), **change})


def test_schema_requires_every_field_of_each_kind():
    for name in records.BASE_FIELDS + records.PREDICTION_FIELDS:
        with pytest.raises(ValueError, match=f"missing field.*{name}"):
            records.check_record({k: v for k, v in _good().items() if k != name})
    error = {"id": 1, "path": "p", "label": 0, "setting": "clean", "method": None, "error": "bad"}
    assert records.check_record(error).error == "bad"
    for name in records.BASE_FIELDS:
        with pytest.raises(ValueError, match=f"missing field.*{name}"):
            records.check_record({k: v for k, v in error.items() if k != name})
    with pytest.raises(ValueError, match="missing field.*label"):     # a hand-edited line that names only a key
        records.check_record({"id": 5, "method": "tda"})


def test_the_run_schema_refuses_other_runs_records():
    schema = records.RecordSchema(methods=frozenset({"m"}), settings=frozenset({"clean"}), n_samples=4,
                                  ids=frozenset({0, 2}), n_classes=3)
    assert schema.check(_good(2)).id == 2
    for change, reason in [({"method": "tda"}, "method 'tda' is not one of the run's methods"),
                           ({"setting": "pgd"}, "setting 'pgd' is not one of the run's (clean)"),
                           ({"id": 4}, "id 4 is not one of the run's 4 samples"),
                           ({"id": 1}, "sample 1 is not in the run's stream"),
                           ({"top5": [1, 3]}, "class 3 is not one of the run's 3 classes")]:
        with pytest.raises(ValueError, match=re.escape(reason)):
            schema.check({**_good(2), **change})
    with_samples = records.RecordSchema(samples=[("c/0.jpg", 1), ("c/1.jpg", 0)])
    assert with_samples.check(_good(0)).path == "c/0.jpg"
    with pytest.raises(ValueError, match="are not sample 1's"):
        with_samples.check(_good(1))                            # sample 1's label is 0
    with pytest.raises(ValueError, match="id 2 is not one of the run's 2 samples"):
        with_samples.check(_good(2))
    error = {"id": 0, "path": "c/0.jpg", "label": 1, "setting": "clean", "method": None, "error": "decode"}
    assert schema.check(error).method is None                   # a decode error covers every method


def test_the_run_schema_refuses_records_of_another_attack_config():
    # a record says what attacked its sample (eps, steps...): one of another budget is not this run's, whatever
    # file it sits in (records of an eps=4/255 run copied into an eps=1/255 one were resumed and scored as 1/255)
    ident = {"shared": {"attack": {"name": "pgd", "eps": 1 / 255, "steps": 7, "alpha": None}, "n_samples": 4},
             "methods": {"m": {}}}
    schema = records.RecordSchema.of_run(ident)
    hit = {**_good(2), "setting": "pgd", "attack": {"name": "pgd", "eps": 1 / 255, "steps": 7, "flipped": False}}
    assert schema.check(hit).id == 2
    for change, reason in [({"eps": 4 / 255}, "its attack's eps 0.0156"), ({"steps": 2}, "its attack's steps 2"),
                           ({"name": "fgsm"}, "attack 'fgsm' is not the run's (pgd)")]:
        with pytest.raises(ValueError, match=re.escape(reason)):
            schema.check({**hit, "attack": {**hit["attack"], **change}})
    listed = records.RecordSchema.of_run({**ident, "shared": {**ident["shared"], "attack": {
        "name": "pgd", "eps": [1 / 255, 4 / 255], "steps": 7}}})
    four = {**hit, "setting": "pgd@eps4", "attack": {**hit["attack"], "eps": 4 / 255}}
    assert listed.check(four).setting == "pgd@eps4"
    with pytest.raises(ValueError, match=re.escape("its attack's eps 0.0039")):
        listed.check({**four, "attack": {**four["attack"], "eps": 1 / 255}})   # the eps1 budget's under eps4


def test_reader_refuses_nan_and_infinity_literals(tmp_path):
    path = tmp_path / "records.jsonl"
    good = json.dumps(_good())
    path.write_text("\n".join([good, good.replace("0.75,", "NaN,", 1), good.replace("0.5", "Infinity"),
                               good.replace("0.5", "-Infinity"), good.replace("0.5", "1e400"), ""]))
    lines = list(record_files.scan(path))
    assert [ln.record is None for ln in lines] == [False, True, True, True, True]
    assert [ln.problem for ln in lines[1:4]] == ["NaN is not JSON", "Infinity is not JSON", "-Infinity is not JSON"]
    assert "seconds must be" in lines[4].problem


def test_non_finite_scores_are_an_error_record_and_never_written_as_nan():
    logits = torch.tensor([0.0, float("nan"), 1.0])
    rec = Record.prediction(id=4, path="a/b.jpg", label=2, setting="pgd", method="tpt",
                            output=MethodOutput(logits), seconds=0.5, attack={"name": "pgd", "flipped": False})
    assert rec.error == "non-finite scores from tpt: 1 NaN of 3 logits" and rec.pred is None
    assert rec.attack == {"name": "pgd", "flipped": False}
    assert Record.from_dict(json.loads(records.dumps(rec))) == rec
    inf = Record.prediction(id=4, path="a/b.jpg", label=2, setting="clean", method="tpt",
                            output=MethodOutput(torch.tensor([0.0, float("inf"), -float("inf")])), seconds=0.5)
    assert inf.error == "non-finite scores from tpt: 1 +inf of 3 logits"
    ruled_out = Record.prediction(id=4, path="a/b.jpg", label=0, setting="clean", method="m",
                                  output=MethodOutput(torch.tensor([0.0, -float("inf")])), seconds=0.5)
    assert ruled_out.error is None and ruled_out.pred == 0      # a class ruled out (-inf) is a score
    extras = Record.prediction(id=4, path="a/b.jpg", label=0, setting="clean", method="m",
                               output=MethodOutput(torch.zeros(2), extras={"loss": math.nan}), seconds=0.5)
    assert extras.error == "non-finite scores from m: non-finite extras (loss)"
    with pytest.raises(ValueError, match="not JSON compliant"):
        records.dumps({**_good(), "confidence": math.nan})
