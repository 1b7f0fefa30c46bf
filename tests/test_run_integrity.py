"""A run directory says exactly what ran: run identity and resume, one writer per directory, damaged
records quarantined, clear errors for unwritable run directories. A resume that mixed settings, two
writers or a damaged line taken at face value would each yield numbers no single run produced."""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import shiftlab
from _gate import GatedRun, child_env
from _runs import comparable as _strip
from _runs import json_lines as _lines
from shiftlab.cli import main as cli_main
from shiftlab.datasets import build_dataset
from shiftlab.engine.config import RunConfig
from shiftlab.engine.loop import run
from shiftlab.rundir import identity, record_files, records
from shiftlab.rundir.identity import RunIdentityError
from shiftlab.rundir.lock import RunLock, RunLockedError
from shiftlab.rundir.record_files import RunDirError
from shiftlab.rundir.stream import stream_order
from shiftlab.synthetic import make_imagenet_r, tiny_clip

FAST = {"tda": {"text_head": "zeroshot"}, "dmn_zs": {"text_head": "zeroshot"}}   # skips the 80-template head


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_imagenet_r(tmp_path_factory.mktemp("data"), classes=range(0, 200, 20), per_class=1, size=(72, 64))


@pytest.fixture(scope="module")
def dataset(data):
    return build_dataset("imagenet-r", data)


@pytest.fixture(scope="module")
def model():
    return tiny_clip(0)


def _cfg(out: Path, **kw) -> RunConfig:
    # batches of one: a redone sample is encoded alone, as it was the first time (bit-identical records)
    base = dict(methods=["zeroshot", "tpt"], views=8, workers=0, progress=False, batch_size=1, limit=6,
                out=str(out), device="cpu", method_config={"tpt": {"steps": 1}})
    return RunConfig(**{**base, **kw})


# -- 1. run identity ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def finished(tmp_path_factory, model, dataset, one_thread_module) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    run(_cfg(out), model=model, dataset=dataset)
    return out


@pytest.mark.parametrize("change,expected", [
    ({"views": 16}, "views 8 -> 16"),
    ({"seed": 1}, "seed 0 -> 1"),
    ({"pretrained": "other.pt"}, 'pretrained "openai" -> "other.pt"'),
    ({"limit": 3}, "limit 6 -> 3"),
    ({"method_config": {"tpt": {"steps": 1, "lr": 0.01}}}, "tpt: lr 0.005 -> 0.01"),
    ({"order": "sorted"}, 'order "shuffled" -> "sorted"'),
], ids=["views", "seed", "pretrained", "limit-lower", "set-tpt-lr", "order"])
def test_resume_with_other_settings_is_refused_and_changes_nothing(finished, tmp_path, model, dataset, change,
                                                                   expected):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "run.lock"}
    with pytest.raises(RunIdentityError, match="cannot resume") as info:
        run(_cfg(out, resume=True, **change), model=model, dataset=dataset)
    assert expected in str(info.value) and "\n" not in str(info.value)
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "run.lock"}
    assert after == before


def test_resume_refused_for_every_field_of_the_identity(model, dataset):
    """The property: whatever field of the identity differs, a resume is refused and names it."""
    methods = {n: shiftlab.create_method(n, model, dataset.classnames) for n in ("zeroshot", "tpt")}
    old = identity.build(_cfg(Path("x")), model, dataset, methods, "0.1.0")
    assert set(old["shared"]) >= {"dataset", "samples_sha256", "model", "checkpoint_sha256", "protocol", "views",
                                  "seed", "order", "limit", "attack", "augmix", "precision"}
    assert old["methods"]["tpt"] == identity.jsonable(dataclasses.asdict(methods["tpt"].config))
    docs = (Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md").read_text()
    assert all(f"`{key}`" in docs for key in old["shared"]), "docs/ARCHITECTURE.md lists run.json's fields"
    for key, value in old["shared"].items():
        new = json.loads(json.dumps(old))
        # an integer goes down (a higher limit is allowed, a lower one is not), anything else changes
        new["shared"][key] = value - 1 if isinstance(value, int) and not isinstance(value, bool) else "changed"
        with pytest.raises(RunIdentityError, match=f"{key} "):
            identity.check_resume("RUN", old, new)
    for name, cfg in old["methods"].items():
        for field in cfg:
            new = json.loads(json.dumps(old))
            new["methods"][name][field] = ["changed"]
            with pytest.raises(RunIdentityError, match=f"{name}: {field} "):
                identity.check_resume("RUN", old, new)
    # allowed: the same identity; another shiftlab version; more methods; a higher limit
    new = json.loads(json.dumps(old))
    new["shiftlab"] = "9.9"
    new["methods"]["mta"] = {"steps": 5}
    new["shared"]["limit"] = None
    ok = identity.check_resume("RUN", old, new)
    assert ok.added_methods == ["mta"] and ok.limit_raised == (6, None)
    assert ok.identity["shared"]["limit"] is None and set(ok.identity["methods"]) == {"zeroshot", "tpt", "mta"}


def test_a_resume_that_would_encode_differently_is_refused(finished, tmp_path, model, dataset):
    """Issue 40 case 18: a step encodes its batch's views together, for every method beside the others, so a
    resume with another batch size, or other methods while records are missing, was accepted (and rewrote
    run.json) though its records differ from the first session's in the last float bits. Refused before
    anything is written; methods are still added to a finished run (test_adding_methods_... below)."""
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    path = out / "records.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(ln for ln in lines if json.loads(ln) != json.loads(lines[-1])))   # one record gone
    gone = json.loads(lines[-1])["method"]
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "run.lock"}
    with pytest.raises(RunIdentityError, match=r"with batch_size 2: its records were made with 1, and a batch's "
                                               r"views are encoded together"):
        run(_cfg(out, resume=True, batch_size=2), model=model, dataset=dataset)
    for methods in (["zeroshot"], ["zeroshot", "tpt", "mta"]):
        with pytest.raises(RunIdentityError, match=rf"with other methods \({', '.join(methods)}\) while records of "
                                                   rf"{gone} are missing: they were computed beside tpt, zeroshot"):
            run(_cfg(out, resume=True, methods=methods), model=model, dataset=dataset)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "run.lock"} == before
    run(_cfg(out, resume=True), model=model, dataset=dataset)   # its own methods and batch size: completed
    strip = [sorted(json.dumps({k: v for k, v in json.loads(ln).items() if k != "seconds"}) for ln in text)
             for text in (path.read_text().splitlines(), lines)]
    assert strip[0] == strip[1]


def test_adding_methods_and_nothing_left_to_do(finished, tmp_path, model, dataset, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    first = json.loads((out / "summary.json").read_text())
    assert set(first["config"]["method_settings"]) == {"zeroshot", "tpt"}       # what `merge` labels by
    assert first["config"]["method_settings"]["tpt"]["steps"] == 1
    assert first["identity"]["shared"]["samples_sha256"] == identity.samples_fingerprint(dataset)

    capsys.readouterr()
    again = run(_cfg(out, resume=True), model=model, dataset=dataset)         # nothing left to do
    assert "resuming" in (err := capsys.readouterr().err) and "6 of 6 samples already done" in err
    assert again["timings"] == first["timings"] and again["timings"]["shared_seconds_per_image"] > 0
    assert json.loads((out / "summary.json").read_text())["methods"] == first["methods"]

    added = run(_cfg(out, resume=True, methods=["zeroshot", "tpt", "mta"]), model=model, dataset=dataset)
    assert "adding method(s) mta (same samples and shared settings)" in capsys.readouterr().err
    scores = ("top1", "top5", "ece", "nll", "n")
    assert added["methods"]["mta"]["n"] == 6
    assert {k: added["methods"]["tpt"][k] for k in scores} == {k: first["methods"]["tpt"][k] for k in scores}
    assert set(added["config"]["method_settings"]) == {"zeroshot", "tpt", "mta"}
    assert added["timings"]["images"] == first["timings"]["images"] + 6       # the earlier session's kept too


def test_report_pairs_runs_only_on_the_same_sample_list(tmp_path, model):
    from shiftlab.report.load import load_runs
    outs = []
    for i, classes in enumerate([range(0, 200, 40), range(5, 200, 40), range(0, 200, 40)]):
        data = make_imagenet_r(tmp_path / f"data{i}", classes=classes, per_class=1, size=(64, 64))
        ds = build_dataset("imagenet-r", data)
        outs.append(tmp_path / f"run{i}")
        run(_cfg(outs[-1], methods=["zeroshot"], limit=None), model=model, dataset=ds)
    a, b, c = load_runs(outs)
    assert a.dataset == c.dataset != b.dataset                 # same name, other images: not paired
    assert any("different sample list" in w for w in b.warnings)


# -- 3. one writer per run directory -----------------------------------------------------------

def test_a_file_a_methods_config_names_is_in_the_identity_by_its_content(tmp_path, model, monkeypatch):
    # a CuPL file replaced by another (same classes, other sentences) under the same path must not resume a run
    names = ["cat", "dog"]
    methods = []
    for k, word in enumerate(("small", "large")):
        path = tmp_path / f"cupl{k}.json"
        path.write_text(json.dumps({n: [f"a {word} photo of a {n}."] for n in names}))
        methods.append(shiftlab.create_method("dmn_zs", model, names, text_head="tip_cupl", cupl_file=str(path)))
    entries = [identity.method_config(m) for m in methods]
    assert [e["cupl_file_sha256"] for e in entries] == [
        identity.file_sha256(tmp_path / f"cupl{k}.json") for k in range(2)]
    assert entries[0]["cupl_file_sha256"] != entries[1]["cupl_file_sha256"]
    # a setting that merely names an existing file in the working folder is not read as one
    (tmp_path / "ensemble").write_text("x")
    monkeypatch.chdir(tmp_path)
    plain = identity.method_config(shiftlab.create_method("dmn_zs", model, names))
    assert not [k for k in plain if k.endswith("_sha256")]


def test_a_second_writer_is_refused_at_once(tmp_path, model, dataset):
    out = tmp_path / "run"
    out.mkdir()
    with RunLock(out):
        with pytest.raises(RunLockedError, match=rf"pid {os.getpid()} on .*, started 20"):
            run(_cfg(out), model=model, dataset=dataset)
        assert not (out / "records.jsonl").exists()
        assert cli_main(["merge", str(out)]) == 2                    # nothing to merge: said before locking
        (out / "records.jsonl").write_text("")
        assert cli_main(["merge", str(out)]) == 2                    # merge respects the lock too
    run(_cfg(out, resume=True), model=model, dataset=dataset)        # released: the directory is usable


@pytest.mark.slow
def test_two_concurrent_runs_second_refused_no_records_lost(tmp_path, data):
    ckpt = tmp_path / "tiny.pt"
    torch.save(tiny_clip(0).clip.state_dict(), ckpt)
    argv = ["run", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained", str(ckpt),
            "--methods", "zeroshot,mta", "--views", "5", "--workers", "0", "--batch-size", "1", "--device", "cpu",
            "--no-progress", "--allow-partial"]
    out = tmp_path / "run"
    # the first run holds after its first sample's records, with the directory locked
    with GatedRun(tmp_path / "gate", [*argv, "--out", str(out)], at="after_step:1") as first:
        (pid,) = first.wait_reached().values()
        assert len(_lines(out / "records.jsonl")) == 2
        second = subprocess.run([sys.executable, "-m", "shiftlab", *argv, "--out", str(out), "--resume"],
                                env=child_env(), capture_output=True, text=True, timeout=120)
        assert second.returncode == 2
        assert f"pid {pid} on" in second.stderr and "started" in second.stderr
        refusal = [ln for ln in second.stderr.splitlines() if "in use by another shiftlab process" in ln]
        assert len(refusal) == 1 and refusal[0].startswith("shiftlab run: ")
        assert first.running(), "the first run must still be running for this test to mean anything"
        first.release()
        assert first.wait(timeout=180) == 0, first.stderr[-2000:]
    recs = _lines(out / "records.jsonl")
    assert len(recs) == 2 * 10 and len({records.record_key(r) for r in recs}) == 20


# -- 4. damaged records are quarantined --------------------------------------------------------

def test_damaged_lines_are_quarantined_and_redone(finished, tmp_path, model, dataset, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    path = out / "records.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lost = json.loads(lines[4])
    damaged = lines[:4] + [b"\x00" * 60 + b"\n"] + lines[5:8] + [b"garbage {\n"] + lines[8:]
    path.write_bytes(b"".join(damaged))
    assert cli_main(["merge", str(out)]) == 0                                # merge does not crash on it
    err = capsys.readouterr().err
    assert f"{path}:5: damaged record" in err and f"{path}:9: damaged record" in err
    quarantined = _lines(out / record_files.QUARANTINE)
    assert [(q["file"], q["line"]) for q in quarantined] == [("records.jsonl", 5), ("records.jsonl", 9)]
    assert quarantined[1]["text"] == "garbage {"
    assert records.record_key(lost) not in {records.record_key(r) for r in _lines(path)}

    run(_cfg(out, resume=True), model=model, dataset=dataset)                # the sample is redone
    assert _strip(_lines(path)) == _strip(_lines(finished / "records.jsonl"))


def test_resume_quarantines_and_names_file_and_line(finished, tmp_path, model, dataset, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    path = out / "records.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:2] + [b"{not json\n"] + lines[3:]))
    capsys.readouterr()
    run(_cfg(out, resume=True), model=model, dataset=dataset)
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if "damaged record" in ln]
    assert len(warnings) == 1 and f"{path}:3:" in warnings[0]
    assert _strip(_lines(path)) == _strip(_lines(finished / "records.jsonl"))


def test_two_different_records_of_one_key_are_both_quarantined_and_redone(finished, tmp_path, model, dataset,
                                                                          capsys):
    # shards of a merge that disagree (one swapped in from another run, or edited): keeping whichever file sorts
    # first would trust a record by its place; an identical copy (its seconds aside) is only a duplicate
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    path = out / "records.jsonl"
    recs = _lines(path)
    kept, duplicated = [r for r in recs if r["method"] == "zeroshot"][:2]
    other = next(c for c in kept["top5"] if c != kept["pred"])
    forged = {**kept, "pred": other, "top5": [other] + [c for c in kept["top5"] if c != other],
              "correct": other == kept["label"], "true_prob": 0.0 if other != kept["label"] else kept["confidence"]}
    (out / "shards").mkdir()
    (out / "shards" / "rank000.jsonl").write_text(json.dumps(forged) + "\n")
    (out / "shards" / "rank001.jsonl").write_text(json.dumps({**duplicated, "seconds": 9.0}) + "\n")
    assert cli_main(["merge", str(out)]) == 0
    err = capsys.readouterr().err
    line = 1 + recs.index(kept)
    assert (f"{path}:{line}: damaged record (another record of its sample, method and setting differs: "
            "shards/rank000.jsonl; neither is kept)") in err
    assert f"{out / 'shards' / 'rank000.jsonl'}:1: damaged record (another record of its sample, method and setting " \
           "differs: records.jsonl; neither is kept)" in err
    assert sorted((q["file"], q["line"]) for q in _lines(out / record_files.QUARANTINE)) == [
        ("records.jsonl", line), ("shards/rank000.jsonl", 1)]
    merged = _lines(path)
    assert records.record_key(kept) not in {records.record_key(r) for r in merged}
    assert [r["seconds"] for r in merged if records.record_key(r) == records.record_key(duplicated)] == [
        duplicated["seconds"]]
    run(_cfg(out, resume=True), model=model, dataset=dataset)                # the sample is redone
    assert _strip(_lines(path)) == _strip(_lines(finished / "records.jsonl"))


def test_a_stream_json_edited_by_hand_does_not_decide_which_records_a_merge_keeps(finished, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    stream = json.loads((out / "stream.json").read_text())
    (out / "stream.json").write_text(json.dumps({**stream, "ids": stream["ids"][:2]}))   # four samples "not in it"
    before = _lines(out / "records.jsonl")
    assert cli_main(["merge", str(out)]) == 0
    assert "stream.json does not match its own checksum" in capsys.readouterr().err
    assert not (out / record_files.QUARANTINE).exists() and _lines(out / "records.jsonl") == before


def test_online_record_deleted_mid_stream_is_redone_by_replaying_the_stream(tmp_path, model, dataset, capsys):
    cfg = dict(methods=["tda", "dmn_zs", "zeroshot"], method_config=FAST, views=4, limit=None,
               online_checkpoint_seconds=0)
    whole = tmp_path / "whole"
    run(_cfg(whole, **cfg), model=model, dataset=dataset)
    out = tmp_path / "run"
    shutil.copytree(whole, out)
    order = stream_order(len(dataset), "shuffled", 0)
    victim = order[4]
    path = out / "records.jsonl"
    kept = [r for r in _lines(path) if not (r["id"] == victim and r["method"] == "dmn_zs")]
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
    capsys.readouterr()
    run(_cfg(out, resume=True, **cfg), model=model, dataset=dataset)
    assert "replay" in capsys.readouterr().err
    assert _strip(_lines(path)) == _strip(_lines(whole / "records.jsonl"))   # as if never lost
    state = torch.load(out / "online_state.pt", weights_only=True)
    assert state["processed"] == order                                       # every sample entered once
    want = torch.load(whole / "online_state.pt", weights_only=True)
    for name in ("tda", "dmn_zs"):
        _assert_equal(state["states"][name], want["states"][name])


def _assert_equal(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_equal(x, y)
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    else:
        assert a == b


# -- unwritable run directories: clear errors naming the path ------------------------------------

def test_out_under_a_regular_file_names_the_path(tmp_path, model, dataset):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(RunDirError) as info:
        run(_cfg(blocker / "run"), model=model, dataset=dataset)
    assert info.value.errno == errno.ENOTDIR and info.value.filename == str(blocker / "run")


def test_read_only_out_names_the_path(tmp_path, model, dataset, monkeypatch):
    out = tmp_path / "ro"
    out.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == out else real_access(p, mode, **kw))
    with pytest.raises(RunDirError, match="not writable") as info:
        run(_cfg(out), model=model, dataset=dataset)
    assert info.value.errno == errno.EACCES and info.value.filename == str(out)


def test_disk_full_names_the_file():
    """A failed write() carries no file name of its own; the writer's error names the records file."""
    writer = record_files.RecordWriter(Path("/dev/full"))
    with pytest.raises(RunDirError) as info:
        writer.write([{"id": 0, "method": "m", "setting": "clean"}])
    assert info.value.errno == errno.ENOSPC and info.value.filename == "/dev/full"
    writer.close()


def test_bad_method_setting_leaves_no_run_directory(tmp_path, model, dataset):
    out = tmp_path / "run"
    with pytest.raises((TypeError, ValueError), match="nosuch"):
        run(_cfg(out, method_config={"tpt": {"nosuch": 1}}), model=model, dataset=dataset)
    assert not out.exists()


def test_a_run_that_wrote_nothing_is_reused_with_other_settings(tmp_path, model, dataset):
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"shared": {"views": 2}, "methods": {}}))   # failed before any record
    summary = run(_cfg(out, resume=True), model=model, dataset=dataset)
    assert summary["methods"]["tpt"]["n"] == 6
    assert json.loads((out / "run.json").read_text())["shared"]["views"] == 8


def test_a_run_json_from_before_weights_source_resumes_and_records_it(model, dataset):
    methods = {"zeroshot": shiftlab.create_method("zeroshot", model, dataset.classnames)}
    new = identity.build(_cfg(Path("x")), model, dataset, methods, "0.1.0")
    new["shared"]["weights_source"] = "hf-hub:timm/resnet50_clip.openai"
    old = json.loads(json.dumps(new))
    del old["shared"]["weights_source"]
    resumed = identity.check_resume("RUN", old, new).identity
    assert resumed["shared"]["weights_source"] == "hf-hub:timm/resnet50_clip.openai"
    old["shared"]["weights_source"] = "openai-url"   # recorded and different: refused like any field
    with pytest.raises(RunIdentityError, match="weights_source "):
        identity.check_resume("RUN", old, new)
