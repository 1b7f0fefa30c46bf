"""The record contract (shiftlab.records): schema vs docs, constructors, reader, writer, scoring."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from shiftlab import metrics, records
from shiftlab.methods.base import MethodOutput
from shiftlab.records import Record

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
    assert [r["id"] for r in records.iter_records(path)] == [0, 2]
    lines = list(records.scan(path, include_torn=True))
    assert [(ln.number, ln.record is None) for ln in lines] == [(1, False), (2, True), (3, True), (4, True),
                                                                 (5, False), (6, True)]


def test_score_matches_the_metric_definitions():
    labels, correct = [0, 1, 2, 1], [True, False, True, True]
    top5 = [[0, 1], [2, 0], [2, 1], [0, 1]]
    conf, prob = [0.9, 0.6, 0.7, 0.4], [0.9, 0.1, 0.7, 0.3]
    got = records.score(labels, correct, top5, conf, prob)
    assert got == {"top1": 75.0, "top5": 75.0, "ece": metrics.ece(conf, correct),
                   "ece20": metrics.ece(conf, correct, n_bins=20), "nll": metrics.nll(prob), "n": 4}
    recs = [{"label": y, "pred": y if c else -1, "correct": c, "top5": t, "confidence": f, "true_prob": p}
            for y, c, t, f, p in zip(labels, correct, top5, conf, prob)]
    assert records.score_records(recs) == got
    partial = records.score(labels, correct, None, [0.9, np.nan, 0.7, 0.4], prob)
    assert math.isnan(partial["top5"]) and math.isnan(partial["ece"]) and math.isnan(partial["ece20"])
    assert partial["nll"] == got["nll"]


def test_writer_names_the_path_when_the_folder_is_a_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(records.RunDirError, match=re.escape(str(blocker / "run"))):
        records.ensure_run_dir(blocker / "run")
