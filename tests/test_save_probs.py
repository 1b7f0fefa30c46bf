"""`shiftlab run --save-probs`: every prediction record's float16 probability vector
in probs/, consistent with records.jsonl through kills and resumes and torchrun merges; the report's
Brier score from them."""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from _runs import comparable as _strip
from _runs import json_lines as _lines
from shiftlab.datasets import build_dataset
from shiftlab.engine.config import RunConfig
from shiftlab.engine.loop import run
from shiftlab.results import metrics
from shiftlab.rundir import probs
from shiftlab.rundir.records import record_key
from shiftlab.synthetic import make_imagenet_r, tiny_clip

# zero (its own probability vector: votes), tda (online: records held back for the checkpoint)
METHODS = ["zeroshot", "tpt", "zero", "tda"]
CONFIG = {"tpt": {"steps": 1}, "tda": {"text_head": "zeroshot"}}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = make_imagenet_r(tmp_path_factory.mktemp("data"), classes=range(0, 200, 25), per_class=1, size=(72, 64))
    broken = next(p for p in sorted(root.rglob("*")) if p.is_file())
    broken.write_bytes(b"not an image")   # an error record, which has no vector
    return root


@pytest.fixture(scope="module")
def dataset(data):
    return build_dataset("imagenet-r", data)


@pytest.fixture(scope="module")
def model():
    return tiny_clip(0)


def _cfg(out: Path, **kw) -> RunConfig:
    # batches of one: a redone sample is computed alone, as it was the first time (bit-identical)
    base = dict(methods=METHODS, method_config=CONFIG, views=8, workers=0, progress=False, batch_size=1,
                out=str(out), device="cpu", online_checkpoint_seconds=0, save_probs=True)
    return RunConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def whole(tmp_path_factory, model, dataset, one_thread_module) -> Path:
    out = tmp_path_factory.mktemp("whole") / "run"
    run(_cfg(out), model=model, dataset=dataset)
    return out


@pytest.mark.slow
def test_every_prediction_record_has_its_vector(whole, dataset):
    recs = _lines(whole / "records.jsonl")
    vectors = probs.load_probs(whole)
    preds = [r for r in recs if "error" not in r]
    assert len(preds) == len(METHODS) * (len(dataset) - 1) and any("error" in r for r in recs)
    assert set(vectors) == {record_key(r) for r in preds}          # error records have none
    n_classes = len(dataset.classnames)
    for r in preds:
        v = vectors[record_key(r)]
        assert v.dtype == np.float16 and v.shape == (n_classes,)
        assert int(np.argmax(v)) == r["pred"] or v[r["pred"]] == v.max()   # fp16 may tie the top two
        assert abs(float(v[r["label"]]) - r["true_prob"]) <= 2 ** -11 * r["true_prob"] + 1e-7
        assert abs(float(v.max()) - r["confidence"]) <= 2 ** -11 * r["confidence"] + 1e-7
        assert sorted(np.argsort(-v.astype(np.float64), kind="stable")[:5].tolist()) == sorted(r["top5"]) or \
            v[r["top5"][-1]] == np.sort(v)[-5]                            # top-5 up to fp16 ties
        assert abs(float(v.astype(np.float64).sum()) - 1.0) < 1e-3
    files = sorted(p.name for p in (whole / probs.PROBS).iterdir())
    assert files == ["probs.f16", "probs.jsonl"]
    assert (whole / probs.PROBS / "probs.f16").stat().st_size == 2 * n_classes * len(preds)   # no orphans


@pytest.mark.slow
def test_records_are_the_same_with_and_without_save_probs(whole, tmp_path, model, dataset):
    out = tmp_path / "plain"
    run(_cfg(out, save_probs=False), model=model, dataset=dataset)
    assert not (out / probs.PROBS).exists() and probs.load_probs(out) == {}
    plain = (out / "records.jsonl").read_text().splitlines()
    saved = (whole / "records.jsonl").read_text().splitlines()
    strip = [json.dumps({k: v for k, v in json.loads(x).items() if k != "seconds"}) for x in plain]
    assert strip == [json.dumps({k: v for k, v in json.loads(x).items() if k != "seconds"}) for x in saved]


# Killed (SIGKILL) inside the records writer: after the 4th write's vectors are on disk and before its
# records line is, the worst moment (vectors without a record). A deterministic point, no timing.
_KILLED = ("import json, os, signal, sys, torch; torch.set_num_threads(1)\n"
           "from shiftlab.rundir import record_files as records\n"
           "from shiftlab.datasets import build_dataset\n"
           "from shiftlab.engine.config import RunConfig\n"
           "from shiftlab.engine.loop import run\n"
           "from shiftlab.synthetic import tiny_clip\n"
           "real, calls = records.RecordWriter.write, [0]\n"
           "def write(self, recs):\n"
           "    if recs and self.probs is not None:\n"
           "        calls[0] += 1\n"
           "        if calls[0] == 4:\n"
           "            self.probs.write([(r.key, r.probs) for r in recs if r.probs is not None])\n"
           "            os.kill(os.getpid(), signal.SIGKILL)\n"
           "    real(self, recs)\n"
           "records.RecordWriter.write = write\n"
           "cfg = RunConfig(**json.loads(sys.argv[2]))\n"
           "run(cfg, model=tiny_clip(0), dataset=build_dataset('imagenet-r', sys.argv[1]))\n")


@pytest.mark.slow
def test_resume_after_a_kill_gives_the_vectors_of_an_uninterrupted_run(whole, tmp_path, model, dataset, data):
    out = tmp_path / "killed"
    cfg = {k: v for k, v in vars(_cfg(out)).items()}
    env = dict(os.environ, OMP_NUM_THREADS="1", SHIFTLAB_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", _KILLED, str(data), json.dumps(cfg)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    index = _lines(out / probs.PROBS / "probs.jsonl")
    written = {record_key(r) for r in _lines(out / "records.jsonl")}
    orphans = [e for e in index if (e["id"], e["method"], e["setting"]) not in written]
    assert orphans, "the kill must leave vectors whose records were never written"

    run(_cfg(out, resume=True, save_probs=False), model=model, dataset=dataset)   # kept on: probs/ exists
    assert _strip(_lines(out / "records.jsonl")) == _strip(_lines(whole / "records.jsonl"))
    got, want = probs.load_probs(out), probs.load_probs(whole)
    assert got.keys() == want.keys()
    for key in want:
        assert np.array_equal(got[key], want[key]), key


@pytest.mark.slow
def test_a_vector_that_disagrees_with_its_record_or_is_damaged_is_not_its_vector(whole, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(whole, out)
    want = probs.load_probs(out)
    key = next(iter(want))
    w = probs.ProbsWriter(out)
    w.write([(key, np.full_like(want[key], 1.0 / want[key].size))])   # a later vector of another computation
    w.close()
    assert np.array_equal(probs.load_probs(out)[key], want[key])
    index = out / probs.PROBS / "probs.jsonl"
    lines = index.read_text().splitlines(keepends=True)
    entry = json.loads(lines[0])
    lines[0] = json.dumps({**entry, "crc32": (entry["crc32"] + 1) % 2 ** 32}) + "\n"
    index.write_text("".join(lines) + '{"id": 1, "meth')               # damaged first entry, torn last line
    got = probs.load_probs(out)
    assert (entry["id"], entry["method"], entry["setting"]) not in got and len(got) == len(want) - 1
    w = probs.ProbsWriter(out)                                           # reopened: torn line cut
    w.close()
    assert index.read_text().endswith("\n")


@pytest.mark.slow
def test_merge_folds_rank_files_into_one(whole, tmp_path, capsys):
    from shiftlab.cli import main as cli_main
    out = tmp_path / "run"
    shutil.copytree(whole, out)
    want = probs.load_probs(out)
    folder = out / probs.PROBS
    index, data = _lines(folder / "probs.jsonl"), (folder / "probs.f16").read_bytes()
    for stem in ("probs", "rank0", "rank1"):
        (folder / f"{stem}.jsonl").unlink(missing_ok=True)
        (folder / f"{stem}.f16").unlink(missing_ok=True)
    for rank in (0, 1):   # split as two ranks would have written them
        w = probs.ProbsWriter(out, probs.stem_for(rank, 2))
        w.write([((e["id"], e["method"], e["setting"]),
                  np.frombuffer(data, np.float16, e["classes"], e["offset"])) for e in index[rank::2]])
        w.close()
    assert cli_main(["merge", str(out)]) == 0
    assert sorted(p.name for p in folder.iterdir()) == ["probs.f16", "probs.jsonl"]
    got = probs.load_probs(out)
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)
    assert cli_main(["merge", str(out)]) == 0                            # idempotent
    assert len(_lines(folder / "probs.jsonl")) == len(want)


@pytest.mark.slow
def test_brier_score_in_the_report(whole, tmp_path, dataset):
    from shiftlab.report.build import build_report
    from shiftlab.report.load import load_run
    vectors = probs.load_probs(whole)
    recs = [r for r in _lines(whole / "records.jsonl") if "error" not in r]
    out = tmp_path / "report"
    build_report([str(whole)], str(out))
    rows = {r["method"]: r for r in csv.DictReader((out / "metrics.csv").open())}
    for method in METHODS:
        mine = [r for r in recs if r["method"] == method]
        p = np.stack([vectors[record_key(r)].astype(np.float64) for r in mine])
        onehot = np.eye(p.shape[1])[[r["label"] for r in mine]]
        want = float(np.mean(np.sum((p - onehot) ** 2, axis=1)))        # the definition, written out
        assert float(rows[method]["brier"]) == pytest.approx(want, rel=1e-9)
    html = (out / "report.html").read_text()
    assert "<th" in html and ">Brier<" in html
    series = load_run(whole).series
    assert all(s.probs is not None and s.probs.shape == (s.n, len(dataset.classnames)) for s in series)


@pytest.mark.slow
def test_report_without_vectors_has_no_brier(whole, tmp_path):
    from shiftlab.report.build import build_report
    run_dir = tmp_path / "run"
    shutil.copytree(whole, run_dir)
    shutil.rmtree(run_dir / probs.PROBS)
    out = tmp_path / "report"
    build_report([str(run_dir)], str(out))
    assert all(r["brier"] == "" for r in csv.DictReader((out / "metrics.csv").open()))
    assert ">Brier<" not in (out / "report.html").read_text()


def test_record_writer_writes_vectors_first_and_a_reopened_writer_cuts_a_torn_tail(tmp_path):

    from shiftlab.methods.base import MethodOutput
    from shiftlab.rundir.record_files import RecordWriter
    from shiftlab.rundir.records import Record
    logits = torch.tensor([[2.0, 0.5, -1.0], [0.0, 3.0, 1.0]])
    recs = [Record.prediction(id=i, path=f"c/{i}.jpg", label=1, setting="clean", method="m",
                              output=MethodOutput(logits[i]), seconds=0.0) for i in range(2)]
    recs.append(Record.failure(id=2, path="c/2.jpg", label=0, setting="clean", method=None, error="bad"))
    with RecordWriter(tmp_path / "records.jsonl", probs=probs.ProbsWriter(tmp_path)) as w:
        w.write(recs)
    got = probs.load_probs(tmp_path)
    assert set(got) == {(0, "m", "clean"), (1, "m", "clean")}
    for i in range(2):
        assert np.array_equal(got[(i, "m", "clean")], logits[i].softmax(-1).half().numpy())
    data = tmp_path / probs.PROBS / "probs.f16"
    with data.open("ab") as fh:
        fh.write(b"\x01\x02\x03")                        # a vector cut off by a kill, never indexed
    w = probs.ProbsWriter(tmp_path)
    w.write([((2, "m", "clean"), np.array([0.5, 0.25, 0.25]))])
    w.close()
    assert data.stat().st_size == 3 * 3 * 2                 # the torn bytes were cut, offsets stay right
    assert len(probs.load_probs(tmp_path)) == 2             # an error record has no vector, whatever is stored


def test_load_probs_says_when_it_returns_fewer_vectors_than_records(tmp_path):
    """Issue 40, 21: a damaged vector made load_probs return fewer without a word (only the HTML said it)."""
    from shiftlab.methods.base import MethodOutput
    from shiftlab.rundir.record_files import RecordWriter
    from shiftlab.rundir.records import Record
    logits = torch.tensor([[2.0, 0.5, -1.0], [0.0, 3.0, 1.0], [1.0, 0.0, 0.0]])
    recs = [Record.prediction(id=i, path=f"c/{i}.jpg", label=1, setting="clean", method="m",
                              output=MethodOutput(logits[i]), seconds=0.0) for i in range(3)]
    with RecordWriter(tmp_path / "records.jsonl", probs=probs.ProbsWriter(tmp_path)) as w:
        w.write(recs)
    said: list[str] = []
    assert len(probs.load_probs(tmp_path, warn=said.append)) == 3 and said == []
    index = tmp_path / probs.PROBS / "probs.jsonl"
    lines = index.read_text().splitlines(keepends=True)
    entry = json.loads(lines[1])
    lines[1] = json.dumps({**entry, "crc32": (entry["crc32"] + 1) % 2 ** 32}) + "\n"
    index.write_text("".join(lines))
    got = probs.load_probs(tmp_path, warn=said.append)
    assert set(got) == {(0, "m", "clean"), (2, "m", "clean")}
    # a Python caller reads the keyword (save_probs=True); the CLI says --save-probs (shiftlab.options.say)
    assert said == [f"shiftlab: 1 of 3 prediction record(s) in {tmp_path} have no intact probability vector in "
                    f"{tmp_path / probs.PROBS} (m 1): damaged, or written without save_probs=True; the vectors "
                    f"returned are fewer than the records"]


def test_brier_of_a_perfect_and_a_uniform_prediction():
    assert metrics.brier(np.eye(3), [0, 1, 2]) == 0.0
    assert metrics.brier(np.eye(3), [1, 2, 0]) == 2.0
    assert metrics.brier(np.full((1, 4), 0.25), [3]) == pytest.approx(0.75)
    with pytest.raises(ValueError):
        metrics.brier(np.eye(3), [0, 1])


@pytest.mark.slow
def test_two_ranks_write_their_own_files_and_the_merge_equals_one_process(whole, tmp_path, model, dataset,
                                                                          monkeypatch):
    from shiftlab.engine import distributed
    from shiftlab.engine import loop as engine
    from shiftlab.engine.distributed import DistContext
    out = tmp_path / "run"
    for rank in (1, 0):   # rank 0 last: it merges
        ctx = DistContext(rank, 2)
        monkeypatch.setattr(distributed, "context", lambda ctx=ctx: ctx)
        monkeypatch.setattr(distributed, "all_gather", lambda c, obj: [obj] * c.world_size)
        engine.run(_cfg(out, resume=True), model=model, dataset=dataset)
        if rank == 1:
            assert sorted(p.name for p in (out / probs.PROBS).iterdir()) == ["rank1.f16", "rank1.jsonl"]
        monkeypatch.undo()
    assert sorted(p.name for p in (out / probs.PROBS).iterdir()) == ["probs.f16", "probs.jsonl"]
    got, want = probs.load_probs(out), probs.load_probs(whole)
    assert got.keys() == want.keys()
    for key in want:   # batches of one sample: each rank computes a sample as the single process did
        assert np.array_equal(got[key], want[key]), key


@pytest.mark.slow
def test_cli_save_probs_and_report(tmp_path, data, tiny_checkpoint):
    from shiftlab.cli import main as cli_main
    out = tmp_path / "run"
    assert cli_main(["run", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained", str(tiny_checkpoint),
                     "--methods", "zeroshot", "--views", "1", "--limit", "3", "--workers", "0", "--device", "cpu",
                     "--no-progress", "--allow-partial", "--save-probs", "--out", str(out)]) == 0
    assert len(probs.load_probs(out)) == sum("error" not in r for r in _lines(out / "records.jsonl")) > 0
    assert cli_main(["report", str(out), "--out", str(tmp_path / "report")]) == 0
    assert ">Brier<" in (tmp_path / "report" / "report.html").read_text()
