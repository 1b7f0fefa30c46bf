"""`shiftlab run --log wandb,mlflow,tensorboard` (issue 34, item 5): each tracker's offline files are written
and read back with the tracker's own reader: W&B's offline transaction log (WANDB_MODE=offline), MLflow's
file store (its client), TensorBoard's event files (its EventAccumulator). The clients are in the `test`
extra, so these tests run wherever the suite runs."""
from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest

from _synthetic import make_imagenet_r
from shiftlab.cli import main as cli_main
from shiftlab.commands import tracking
from shiftlab.report import trackers


def wandb_records(path: Path) -> list:
    """The records of a W&B transaction log (run-<id>.wandb): a 7-byte header (':W&B', magic, version), then
    LevelDB-log framing (32 KiB blocks; chunks of kind full 1, first 2, middle 3, last 4), each record a
    wandb_internal_pb2.Record parsed by W&B's own protobuf classes."""
    from wandb.proto import wandb_internal_pb2 as pb
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pending, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 2):
            pending = chunk
        else:
            pending += chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    root = tmp_path_factory.mktemp("trackers")
    data = make_imagenet_r(root / "data", classes=range(200), per_class=1, size=(32, 24))
    out = root / "run"
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_SILENT", "true")
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    try:
        code = cli_main(["run", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained", "none", "--views",
                         "6", "--workers", "0", "--device", "cpu", "--methods", "zeroshot,mta", "--limit", "4",
                         "--seed", "3", "--no-progress", "--out", str(out), "--log", "wandb,mlflow,tensorboard"])
    finally:
        mp.undo()
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    pngs = sorted((out / "report").glob("*.png"))
    assert pngs and (out / "report" / "report.html").is_file()
    return out, summary, pngs


@pytest.mark.slow
def test_wandb_offline_run_holds_config_metrics_and_figures(logged):
    out, summary, pngs = logged
    [log] = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    records = wandb_records(log)
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert run.project == "shiftlab" and run.display_name == "run"
    assert config["limit"] == 4 and config["seed"] == 3 and config["methods"] == ["zeroshot", "mta"]
    final = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            final |= {u.key or "/".join(u.nested_key): json.loads(u.value_json) for u in r.summary.update}
    for method, m in summary["methods"].items():
        assert final[f"{method}/top1"] == pytest.approx(m["top1"]) and final[f"{method}/ece"] == pytest.approx(m["ece"])
    curves = trackers.running_curves(out)                       # the running top-1 along the stream (issue 40)
    logged_curve: dict[str, list] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            for key in curves:
                if key in row:
                    logged_curve.setdefault(key, []).append((row["stream_position"], row[key]))
    assert set(logged_curve) == set(curves) == {"zeroshot/running_top1", "mta/running_top1"}
    for key, curve in curves.items():
        assert [p for p, _ in logged_curve[key]] == [p for p, _ in curve] == [1, 2, 3, 4]
        assert [v for _, v in logged_curve[key]] == pytest.approx([v for _, v in curve])
    for png in pngs:   # every figure, byte for byte
        assert final[f"figures/{png.stem}/sha256"] == sha256(png)
        assert (log.parent / "files" / final[f"figures/{png.stem}/path"]).read_bytes() == png.read_bytes()


@pytest.mark.slow
def test_mlflow_file_store_read_back_with_its_client(logged, monkeypatch):
    from mlflow.tracking import MlflowClient
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")   # MLflow 3 reads its file store only when asked
    out, summary, pngs = logged
    client = MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
    [experiment] = [e for e in client.search_experiments() if e.name == "shiftlab"]
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "run"
    assert run.data.params["limit"] == "4" and json.loads(run.data.params["methods"]) == ["zeroshot", "mta"]
    for method, m in summary["methods"].items():
        assert run.data.metrics[f"{method}/top1"] == pytest.approx(m["top1"])
        assert run.data.metrics[f"{method}/n"] == m["n"]
    for key, curve in trackers.running_curves(out).items():   # the running top-1 along the stream (issue 40)
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert [p for p, _ in history] == [p for p, _ in curve] == [1, 2, 3, 4]
        assert [v for _, v in history] == pytest.approx([v for _, v in curve])
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "figures")}
    assert artifacts == {f"figures/{p.name}" for p in pngs}
    local = Path(client.download_artifacts(run.info.run_id, "config.json", str(out / "mlflow-read")))
    assert json.loads(local.read_text())["seed"] == 3


@pytest.mark.slow
def test_tensorboard_event_files_read_back(logged):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out, summary, pngs = logged
    events = EventAccumulator(str(out / "tensorboard" / "run"), size_guidance={"images": 0, "scalars": 0,
                                                                               "tensors": 0})
    events.Reload()
    tags = events.Tags()
    for method, m in summary["methods"].items():
        assert events.Scalars(f"{method}/top1")[0].value == pytest.approx(m["top1"], abs=1e-4)
    curves = trackers.running_curves(out)                       # the running top-1 along the stream (issue 40)
    assert set(curves) == {"zeroshot/running_top1", "mta/running_top1"}
    for key, curve in curves.items():
        assert [(e.step, e.value) for e in events.Scalars(key)] == [(p, pytest.approx(v, abs=1e-4)) for p, v in curve]
    assert set(tags["images"]) == {f"figures/{p.stem}" for p in pngs}
    from PIL import Image
    first = pngs[0]
    with Image.open(first) as im:
        assert (events.Images(f"figures/{first.stem}")[0].width, events.Images(f"figures/{first.stem}")[0].height) \
            == im.size
    text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert '"limit": 4' in text


def test_unknown_and_missing_trackers_are_one_line(capsys, monkeypatch):
    with pytest.raises(SystemExit):
        cli_main(["run", "--data", "d", "--out", "o", "--log", "wandb,neptune"])
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--log: unknown tracker neptune; choose from wandb, mlflow, tensorboard" in err
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name: None)
    assert tracking.missing(["mlflow", "tensorboard"]) == (
        "--log mlflow,tensorboard: the client is not installed (pip install 'shiftlab[mlflow,tensorboard]')")
    assert cli_main(["run", "--data", "d", "--out", "o", "--log", "wandb"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "shiftlab run: error: --log wandb: the client is not installed (pip install 'shiftlab[wandb]')"


def test_metrics_are_read_from_the_summary(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({
        "config": {"dataset": "imagenet-r"},
        "methods": {"tpt": {"top1": 50.0, "ece": float("nan"), "n": 4, "robust": {"top1": 10.0}}}}))
    assert trackers.run_metrics(tmp_path) == {"tpt/top1": 50.0, "tpt/n": 4.0, "tpt/robust_top1": 10.0}
    assert trackers.run_metrics(tmp_path, "imagenet-r/") == {
        "imagenet-r/tpt/top1": 50.0, "imagenet-r/tpt/n": 4.0, "imagenet-r/tpt/robust_top1": 10.0}
    assert trackers.flat_params({"a": 1, "b": "x", "m": ["p", "q"], "classnames": ["c"]}) == {
        "a": "1", "b": "x", "m": '["p", "q"]'}


def _refusing_loopback_uri() -> str:
    """An http URI on 127.0.0.1 at a port nothing listens on (bound, then released): connections are refused."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.mark.timeout(60)
def test_an_unreachable_mlflow_server_is_refused_before_the_run_in_one_line(tmp_path, capsys, monkeypatch):
    """Issue 40 case 14: the run used to go ahead and then hang past 180 s printing urllib3 retries."""
    import time
    data = make_imagenet_r(tmp_path / "data", classes=range(4), size=(32, 24))
    uri = _refusing_loopback_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    start = time.monotonic()
    code = cli_main(["run", "--data", str(data), "--model", "shiftlab-tiny", "--pretrained", "none", "--workers", "0",
                     "--device", "cpu", "--methods", "zeroshot", "--limit", "2", "--no-progress",
                     "--out", str(tmp_path / "run"), "--log", "mlflow"])
    took = time.monotonic() - start
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and took < 10 and len(err) == 1, err
    assert err[0].startswith(f"shiftlab run: error: --log mlflow: the tracking server MLFLOW_TRACKING_URI={uri} "
                             "cannot be reached")
    assert not (tmp_path / "run").exists()                      # refused before any work
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///unchecked.db")   # not a server: nothing to connect to
    assert tracking.unreachable_server(["mlflow"]) is None
    assert tracking.unreachable_server(["wandb"], {"MLFLOW_TRACKING_URI": uri}) is None


@pytest.mark.timeout(60)
def test_a_server_gone_after_the_check_fails_in_one_try(tmp_path, monkeypatch):
    """The server went away during the run: MLflow's client gets one try (MLFLOW_HTTP_REQUEST_MAX_RETRIES=0),
    not minutes of retries; the command then says it in one line (tracking.log_after)."""
    import os
    import time
    monkeypatch.setenv("MLFLOW_TRACKING_URI", _refusing_loopback_uri())
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    html = tmp_path / "report.html"
    html.write_text("<html></html>")
    start = time.monotonic()
    with pytest.raises(Exception, match="127.0.0.1"):
        trackers._mlflow(tmp_path, "run", {"seed": 1}, {"zeroshot/top1": 50.0}, {}, [], html)
    assert time.monotonic() - start < 30
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ    # set for that call only


def test_running_curves_follow_the_stream(tmp_path):
    """Trackers get each method's running top-1 along the stream (issue 40 case 10), in stream.json's order."""
    from shiftlab.rundir.stream import STREAM_FILE
    correct = {0: True, 1: False, 2: True, 3: True}
    lines = [{"id": i, "path": f"c/{i}.jpg", "method": m, "setting": "clean", "label": 0, "pred": 0 if ok else 1,
              "top5": [0, 1] if ok else [1, 0], "confidence": 0.6, "true_prob": 0.6 if ok else 0.4, "correct": ok,
              "seconds": 0.1, "extras": {}} for m in ("zeroshot", "tda") for i, ok in correct.items()]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (tmp_path / STREAM_FILE).write_text(json.dumps({"ids": [3, 1, 0, 2], "online": ["tda"]}))
    curves = trackers.running_curves(tmp_path, prefix="imagenet-r/")
    steps, values = zip(*curves["imagenet-r/tda/running_top1"])
    assert steps == (1, 2, 3, 4)
    assert values == pytest.approx([100.0, 50.0, 200 / 3, 75.0])    # ids 3, 1, 0, 2: right, wrong, right, right
    steps, values = zip(*trackers.running_curves(tmp_path, points=2)["zeroshot/running_top1"])
    assert steps == (2, 4) and values == pytest.approx([50.0, 75.0])
