"""`--log wandb|mlflow|tensorboard` (the flag and its checks: commands/tracking.py): a finished run's config,
per-method metrics, each method's running top-1 along the stream and the report figures, sent to an
experiment tracker through the tracker's own client (optional extras `shiftlab[wandb]`, `[mlflow]`,
`[tensorboard]`).

What is logged is read back from the run directory after the run, the same files `shiftlab report` reads:
the run's config (summary.json's, the flags and `--config` file included) as the tracker's config or
params, every method's metrics (`<method>/<metric>`, with `<dataset>/` in front for a suite), its running top-1
% along the stream (`<method>/running_top1` at step = stream position, from records.jsonl in stream.json's
order; at most `CURVE_POINTS` evenly spaced points, the last one included) and the report's figures (the
report is built into RUN_DIR/report first). Where each tracker writes:

- wandb: `wandb.init(dir=RUN_DIR)`; online or offline as W&B's own settings say (`WANDB_MODE=offline`
  keeps everything in RUN_DIR/wandb, to `wandb sync` later);
- mlflow: the tracking URI MLflow is given (`MLFLOW_TRACKING_URI`), else a file store in RUN_DIR/mlruns (MLflow 3
  keeps its file backend behind `MLFLOW_ALLOW_FILE_STORE`, which shiftlab sets for that call only);
- tensorboard: event files in RUN_DIR/tensorboard (`tensorboard --logdir RUN_DIR/tensorboard`).
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

METRICS = ("top1", "top5", "ece", "ece20", "nll", "n", "errors", "seconds_per_image")
PROJECT = "shiftlab"
CURVE_POINTS = 200   # points per method's running-accuracy curve: a 30,000-image stream stays a small log
MLFLOW_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}   # one try, bounded

Curves = dict[str, list[tuple[int, float]]]   # '<method>/running_top1' -> [(stream position 1..n, top-1 %)]


def run_config(run_dir: Path) -> dict[str, Any]:
    """The run's config as summary.json holds it (run.json's when the summary is missing)."""
    for name in ("summary.json", "run.json"):
        path = Path(run_dir) / name
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(data.get("config"), dict):
                return data["config"]
    return {}


def run_metrics(run_dir: Path, prefix: str = "") -> dict[str, float]:
    """'{prefix}<method>/<metric>' -> value, from summary.json (clean metrics, and the attacked setting's as
    '<method>/robust_<metric>'); missing and NaN values left out."""
    path = Path(run_dir) / "summary.json"
    summary = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    out: dict[str, float] = {}
    for method, entry in (summary.get("methods") or {}).items():
        for source, label in ((entry, ""), (entry.get("robust") or {}, "robust_")):
            for metric in METRICS:
                value = source.get(metric)
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    out[f"{prefix}{method}/{label}{metric}"] = float(value)
    return out


def running_curves(run_dir: Path, prefix: str = "", points: int = CURVE_POINTS) -> Curves:
    """Each method's running top-1 % along the stream (clean setting; ID samples; error records skipped) at
    most `points` evenly spaced stream positions, the last included; {} for a run without records. The
    order is stream.json's (the run's stream), else the records' sample ids in file order."""
    from ..rundir.record_files import load_records
    from ..rundir.stream import read_stream
    records = load_records(Path(run_dir))
    stream = read_stream(run_dir)
    hits: dict[str, dict[int, bool]] = {}
    for r in records:
        if r.get("setting", "clean") == "clean" and isinstance(r.get("correct"), bool):
            hits.setdefault(r["method"], {})[r["id"]] = r["correct"]
    curves: Curves = {}
    for method, by_id in hits.items():
        order = stream["ids"] if stream else list(by_id)
        seen = [by_id[i] for i in order if i in by_id]
        n = len(seen)
        keep = sorted({round(k * n / points) for k in range(1, points + 1)} if n > points else range(1, n + 1))
        total, curve, at = 0, [], set(keep)
        for position, correct in enumerate(seen, start=1):
            total += correct
            if position in at:
                curve.append((position, 100.0 * total / position))
        curves[f"{prefix}{method}/running_top1"] = curve
    return curves


def flat_params(config: dict[str, Any]) -> dict[str, str]:
    """The config's scalar settings as strings (trackers' params); lists and tables as compact JSON, the
    class-name list left out (it is in the logged config file)."""
    out = {}
    for key, value in config.items():
        if key == "classnames":
            continue
        out[key] = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return out


def figures(report_dir: Path) -> list[Path]:
    return sorted(Path(report_dir).glob("*.png"))


def log_runs(names: Sequence[str], run_dirs: Sequence[str | Path], name: str,
             report_dir: str | Path | None = None) -> dict[str, str]:
    """Log finished runs (one run, or a suite's datasets) to each tracker in `names`, as one tracked run
    called `name`; the report is built into `report_dir` (default: the first run's report/) for its
    figures. Returns {tracker: where it wrote}."""
    from .build import build_report
    run_dirs = [Path(d) for d in run_dirs]
    config = run_config(run_dirs[0])
    suite = len(run_dirs) > 1
    metrics: dict[str, float] = {}
    curves: Curves = {}
    for d in run_dirs:
        dataset = run_config(d).get("dataset") or d.name
        metrics |= run_metrics(d, prefix=f"{dataset}/" if suite else "")
        curves |= running_curves(d, prefix=f"{dataset}/" if suite else "")
    report = Path(report_dir) if report_dir is not None else run_dirs[0] / "report"
    build_report(run_dirs, report, n_resamples=200)
    pngs = figures(report)
    where = {}
    for tracker in names:
        where[tracker] = LOGGERS[tracker](run_dirs[0], name, config, metrics, curves, pngs, report / "report.html")
    return where


def _by_position(curves: Curves) -> list[tuple[int, dict[str, float]]]:
    steps: dict[int, dict[str, float]] = {}
    for key, curve in curves.items():
        for position, value in curve:
            steps.setdefault(position, {})[key] = value
    return sorted(steps.items())


def _wandb(run_dir: Path, name: str, config: dict, metrics: dict, curves: Curves, pngs: list[Path],
           html: Path) -> str:
    import wandb
    run = wandb.init(project=PROJECT, name=name, dir=str(run_dir), config=config, reinit="finish_previous")
    try:
        run.define_metric("stream_position")
        for key in curves:
            run.define_metric(key, step_metric="stream_position")
        for position, values in _by_position(curves):
            run.log({"stream_position": position, **values})
        run.summary.update(metrics)
        run.log({**metrics, **{f"figures/{p.stem}": wandb.Image(str(p)) for p in pngs}})
        run.save(str(html), base_path=str(html.parent), policy="now")
        return str(Path(run.dir).parent)
    finally:
        run.finish()


def _mlflow(run_dir: Path, name: str, config: dict, metrics: dict, curves: Curves, pngs: list[Path],
            html: Path) -> str:
    import os

    import mlflow
    from mlflow.entities import Metric
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    allow = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    # a server that went away after the pre-run check (commands/tracking.py) fails in one try, not after
    # minutes of urllib3 retries (issue 40 case 14); a value the user set wins
    http = {k: v for k, v in MLFLOW_HTTP.items() if k not in os.environ}
    os.environ.update(http)
    if not uri:
        # shiftlab's default, a file store beside the run: MLflow 3 keeps its file backend in maintenance mode
        # behind this opt-in, which shiftlab gives for this call only (a server or sqlite:///... via
        # MLFLOW_TRACKING_URI is MLflow's recommended backend)
        uri = (run_dir / "mlruns").resolve().as_uri()
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    client_uri = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        mlflow.set_experiment(PROJECT)
        with mlflow.start_run(run_name=name):
            mlflow.log_params(flat_params(config))
            mlflow.log_dict(config, "config.json")
            mlflow.log_metrics({k.replace("@", "_at_"): v for k, v in metrics.items()})
            now = int(time.time() * 1000)
            points = [Metric(k.replace("@", "_at_"), v, now, step) for k, c in curves.items() for step, v in c]
            for i in range(0, len(points), 1000):   # MLflow's limit per batch
                mlflow.tracking.MlflowClient().log_batch(mlflow.active_run().info.run_id, metrics=points[i:i + 1000])
            for png in pngs:
                mlflow.log_artifact(str(png), "figures")
            mlflow.log_artifact(str(html), "report")
    finally:
        for key in http:
            os.environ.pop(key, None)
        mlflow.set_tracking_uri(client_uri)
        if allow is None:
            os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)
        else:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = allow
    return uri


def _tensorboard(run_dir: Path, name: str, config: dict, metrics: dict, curves: Curves, pngs: list[Path],
                 html: Path) -> str:
    import numpy as np
    from PIL import Image
    from torch.utils.tensorboard import SummaryWriter
    logdir = run_dir / "tensorboard" / name
    with SummaryWriter(log_dir=str(logdir)) as writer:
        writer.add_text("config", "```\n" + json.dumps(config, indent=1, sort_keys=True, default=str) + "\n```")
        for key, value in metrics.items():
            writer.add_scalar(key, value, 0)
        for key, curve in curves.items():
            for position, value in curve:
                writer.add_scalar(key, value, position)
        for png in pngs:
            with Image.open(png) as im:
                writer.add_image(f"figures/{png.stem}", np.asarray(im.convert("RGB")), 0, dataformats="HWC")
    return str(logdir)


LOGGERS = {"wandb": _wandb, "mlflow": _mlflow, "tensorboard": _tensorboard}
