"""Records are validated where they are read: resume and `shiftlab merge` quarantine what is not one
of the run's records and go on; one function finishes a run, so `merge` writes the summary the run
wrote; the "N of M samples already done" count is honest.

Each test damages a run directory the way a hand edit, a torn write or a mixed-up copy would, since a
record taken at face value would be counted in a summary it does not belong to."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from _runs import comparable as _strip
from _runs import json_lines as _lines
from shiftlab.cli import main as cli_main
from shiftlab.datasets import build_dataset
from shiftlab.engine.config import RunConfig
from shiftlab.engine.loop import RunHooks, run
from shiftlab.engine.step import Evaluator
from shiftlab.methods.base import MethodOutput
from shiftlab.report.load import load_run
from shiftlab.rundir import record_files, records
from shiftlab.rundir.stream import stream_order
from shiftlab.synthetic import make_imagenet_r, tiny_clip

N = 10      # samples in the dataset
LIMIT = 6   # of which the runs evaluate the first LIMIT of the stream


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = make_imagenet_r(tmp_path_factory.mktemp("data"), classes=range(0, 200, 20), per_class=1, size=(72, 64))
    return build_dataset("imagenet-r", root)


@pytest.fixture(scope="module")
def model():
    return tiny_clip(0)


def _cfg(out: Path, **kw) -> RunConfig:
    # batches of one: a redone sample is encoded alone, as it was the first time (bit-identical records)
    base = dict(methods=["zeroshot", "tpt"], views=8, workers=0, progress=False, batch_size=1, limit=LIMIT,
                out=str(out), device="cpu", method_config={"tpt": {"steps": 1}})
    return RunConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def finished(tmp_path_factory, model, dataset, one_thread_module) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    run(_cfg(out), model=model, dataset=dataset)
    return out


def _copy(finished: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out


def _replace_line(path: Path, index: int, text: str) -> dict:
    lines = path.read_text().splitlines(keepends=True)
    gone = json.loads(lines[index])
    lines[index] = text + "\n"
    path.write_text("".join(lines))
    return gone


class _Count(RunHooks):
    def __init__(self):
        self.samples: list[int] = []
        self.records = 0

    def before_step(self, ids):
        self.samples += ids

    def after_step(self, ids, recs):
        self.records += len(recs)


# -- a well-formed line that is not one of the run's records ------------------------------------

def test_a_wellformed_non_record_is_quarantined_by_resume_and_redone(finished, tmp_path, model, dataset, capsys):
    out = _copy(finished, tmp_path)
    path = out / "records.jsonl"
    gone = _replace_line(path, 4, '{"id": 5, "method": "tpt"}')        # valid JSON, not a record
    capsys.readouterr()
    hooks = _Count()
    run(_cfg(out, resume=True), model=model, dataset=dataset, hooks=hooks)
    err = capsys.readouterr().err
    assert f"{path}:5: damaged record (missing field(s): path, label" in err
    assert hooks.samples == [gone["id"]] and hooks.records == 1
    assert _strip(_lines(path)) == _strip(_lines(finished / "records.jsonl"))
    (q,) = _lines(out / record_files.QUARANTINE)
    assert (q["file"], q["line"], q["text"]) == ("records.jsonl", 5, '{"id": 5, "method": "tpt"}')


def test_merge_quarantines_a_wellformed_non_record_without_a_traceback(finished, tmp_path, capsys):
    out = _copy(finished, tmp_path)
    _replace_line(out / "records.jsonl", 4, '{"id": 5, "method": "tpt"}')   # valid JSON, not a record
    assert cli_main(["merge", str(out)]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "missing field(s): path, label" in captured.err
    summary = json.loads((out / "summary.json").read_text())
    assert sum(m["n"] for m in summary["methods"].values()) == 2 * LIMIT - 1
    assert cli_main(["merge", str(out)]) == 0                               # not stuck: merges again
    assert len(_lines(out / record_files.QUARANTINE)) == 1


def test_records_of_samples_outside_the_run_are_quarantined(finished, tmp_path, model, dataset, capsys):
    out = _copy(finished, tmp_path)
    path = out / "records.jsonl"
    template = next(r for r in _lines(path) if r["method"] == "zeroshot")
    outside = next(sid for sid in stream_order(N, "shuffled", 0)[LIMIT:])    # a sample past --limit
    extra = [{**template, "id": N}, {**template, "id": outside}]            # would count zeroshot n=LIMIT + 2
    path.write_text(path.read_text() + "".join(records.dumps(r) for r in extra))
    merged = tmp_path / "merged"
    shutil.copytree(out, merged)
    assert cli_main(["merge", str(merged)]) == 0
    assert json.loads((merged / "summary.json").read_text())["methods"]["zeroshot"]["n"] == LIMIT
    problems = [q["problem"] for q in _lines(merged / record_files.QUARANTINE)]
    assert problems == [f"id {N} is not one of the run's {N} samples",
                        f"sample {outside} is not in the run's stream (its --limit)"]
    # resume knows the sample list too: a record whose path or label is not its sample's goes as well
    wrong = next(r for r in _lines(path) if r["method"] == "tpt")
    _replace_line(path, 0, json.dumps({**wrong, "id": _lines(path)[0]["id"], "path": "elsewhere.jpg"}))
    summary = run(_cfg(out, resume=True), model=model, dataset=dataset)
    assert summary["methods"]["zeroshot"]["n"] == summary["methods"]["tpt"]["n"] == LIMIT
    assert sum("are not sample" in q["problem"] for q in _lines(out / record_files.QUARANTINE)) == 1
    assert _strip(_lines(path)) == _strip(_lines(finished / "records.jsonl"))


def test_a_method_run_json_does_not_list_is_not_the_runs(finished, tmp_path, model, dataset):
    out = _copy(finished, tmp_path)
    path = out / "records.jsonl"
    stray = {**next(r for r in _lines(path) if r["method"] == "tpt"), "method": "mta"}
    path.write_text(path.read_text() + records.dumps(stray))
    summary = run(_cfg(out, resume=True, methods=["zeroshot", "tpt", "mta"]), model=model, dataset=dataset)
    assert summary["methods"]["mta"]["n"] == LIMIT                          # computed, the stray record not kept
    (q,) = _lines(out / record_files.QUARANTINE)
    assert q["problem"] == "method 'mta' is not one of the run's methods (run.json)"


def test_non_finite_scores_are_error_records_in_strict_json(tmp_path, model, dataset, monkeypatch):
    real = Evaluator.predict

    def diverged(self, name, ctxs):   # what a diverged step (e.g. lr=inf) gives: NaN logits
        outs = real(self, name, ctxs)
        return [MethodOutput(torch.full_like(o.logits, float("nan"))) for o in outs] if name == "tpt" else outs
    monkeypatch.setattr(Evaluator, "predict", diverged)
    out = tmp_path / "run"
    summary = run(_cfg(out), model=model, dataset=dataset)
    text = (out / "records.jsonl").read_text()
    recs = [json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in records.jsonl")) for line in
            text.splitlines()]
    tpt = [r for r in recs if r["method"] == "tpt"]
    assert len(tpt) == LIMIT and all(r["error"].startswith("non-finite scores from tpt: ") for r in tpt)
    assert "tpt" not in summary["methods"] and summary["errors"] == LIMIT
    assert summary["methods"]["zeroshot"]["n"] == LIMIT


# -- one function finishes a run ----------------------------------------------------------------

def _without_timings(summary: dict) -> dict:
    methods = {n: {k: v for k, v in m.items() if k != "seconds_per_image"} for n, m in summary["methods"].items()}
    return {**summary, "timings": None, "methods": methods}


def _without_seconds_column(md: str) -> list[str]:
    return [" | ".join(c for i, c in enumerate(line.split(" | ")) if i != 7) for line in md.splitlines()]


def test_merge_after_a_stopped_torchrun_job_writes_the_runs_own_summary(finished, tmp_path, capsys):
    out = _copy(finished, tmp_path)
    engine_json = json.loads((out / "summary.json").read_text())
    engine_md = (out / "summary.md").read_text()
    # as a stopped 2-rank job leaves it: shards, no merged file, no summary
    recs = (out / "records.jsonl").read_text().splitlines(keepends=True)
    (out / "shards").mkdir()
    (out / "shards" / "records-rank0.jsonl").write_text("".join(recs[0::2]))
    (out / "shards" / "records-rank1.jsonl").write_text("".join(recs[1::2]))
    for name in ("records.jsonl", "summary.json", "summary.md"):
        (out / name).unlink()
    assert cli_main(["merge", str(out)]) == 0
    merged_json = json.loads((out / "summary.json").read_text())
    merged_md = (out / "summary.md").read_text()
    assert _without_timings(merged_json) == _without_timings(engine_json)    # labels, config, identity, scores
    assert merged_md.splitlines()[0] == engine_md.splitlines()[0] and "?" not in merged_md.splitlines()[0]
    assert _without_seconds_column(merged_md) == _without_seconds_column(engine_md)
    assert merged_json["config"]["method_settings"]["tpt"]["steps"] == 1
    # and on a finished run it is the same function: the same summary, timings included
    assert cli_main(["merge", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text()) == merged_json
    capsys.readouterr()


def test_merge_of_a_run_json_without_a_config_section_still_labels_it(finished, tmp_path):
    out = _copy(finished, tmp_path)
    ident = json.loads((out / "run.json").read_text())
    del ident["config"]                       # a run.json written before it held the summary's config
    del ident["self_sha256"]                  # (and so before its checksum of itself)
    (out / "run.json").write_text(json.dumps(ident))
    (out / "summary.json").unlink()
    assert cli_main(["merge", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["dataset"] == "imagenet-r" and summary["config"]["model"] == "shiftlab-tiny"
    assert set(summary["config"]["method_settings"]) == {"zeroshot", "tpt"}
    assert (out / "summary.md").read_text().startswith("### imagenet-r · shiftlab-tiny")


# -- an honest "N of M samples already done" ---------------------------------------------------

def test_resume_count_after_a_deleted_middle_line_is_what_is_redone(finished, tmp_path, model, dataset, capsys):
    out = _copy(finished, tmp_path)
    path = out / "records.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    gone = json.loads(lines[len(lines) // 2])
    path.write_text("".join(lines[:len(lines) // 2] + lines[len(lines) // 2 + 1:]))
    capsys.readouterr()
    hooks = _Count()
    run(_cfg(out, resume=True), model=model, dataset=dataset, hooks=hooks)
    assert f"{LIMIT - 1} of {LIMIT} samples already done" in capsys.readouterr().err
    assert hooks.samples == [gone["id"]] and hooks.records == 1


def test_resume_count_says_apart_records_restored_from_the_online_checkpoint(tmp_path, model, dataset, capsys):
    cfg = dict(methods=["tda", "zeroshot"], method_config={"tda": {"text_head": "zeroshot"}}, views=4)
    out = tmp_path / "run"
    run(_cfg(out, **cfg), model=model, dataset=dataset)        # one checkpoint, at the end: it holds every tda record
    path = out / "records.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if json.loads(line)["method"] == "tda" and i > 2)
    path.write_text("".join(lines[:index] + lines[index + 1:]))
    capsys.readouterr()
    hooks = _Count()
    run(_cfg(out, resume=True, **cfg), model=model, dataset=dataset, hooks=hooks)
    err = capsys.readouterr().err
    # each method's count where they differ (issue 40 case 4): the lost line is tda's
    assert (f"{LIMIT - 1} of {LIMIT} samples already done (records on disk: tda {LIMIT - 1}, zeroshot {LIMIT} of "
            f"{LIMIT}); 1 online record(s) restored from the last checkpoint (now {LIMIT} of {LIMIT})") in err
    assert hooks.records == 0 and sorted(path.read_text().splitlines()) == sorted(ln.rstrip("\n") for ln in lines)


# -- the report reads with the same schema -----------------------------------------------------

def test_report_skips_lines_that_are_not_the_runs_records_and_names_them(finished, tmp_path):
    out = _copy(finished, tmp_path)
    path = out / "records.jsonl"
    template = next(r for r in _lines(path) if r["method"] == "zeroshot")
    path.write_text(path.read_text() + records.dumps({**template, "id": N}) + '{"id": 5, "method": "tpt"}\n')
    loaded = load_run(out)
    assert loaded.bad_lines == 2
    (warning,) = [w for w in loaded.warnings if "skipped" in w]
    assert f"{path}:{2 * LIMIT + 1}: id {N} is not one of the run's {N} samples" in warning
    assert f"{path}:{2 * LIMIT + 2}: missing field(s): path, label" in warning
    assert {s.method: s.n for s in loaded.series} == {"tpt": LIMIT, "zeroshot": LIMIT}
