"""`--log wandb|mlflow|tensorboard` (the flag and its checks: commands/tracking.py): a finished run's config,
per-method metrics and report figures, sent to an
experiment tracker through the tracker's own client (optional extras `shiftlab[wandb]`, `[mlflow]`,
`[tensorboard]`).

What is logged is read back from the run directory after the run, the same files `shiftlab report` reads:
the run's config (summary.json's, the flags and `--config` file included) as the tracker's config or
params, every method's metrics (`<method>/<metric>`, with `<dataset>/` in front for a suite) and the report's
figures (the report is built into RUN_DIR/report first). Where each tracker writes:

- wandb: `wandb.init(dir=RUN_DIR)`; online or offline as W&B's own settings say (`WANDB_MODE=offline`
  keeps everything in RUN_DIR/wandb, to `wandb sync` later);
- mlflow: the tracking URI MLflow is given (`MLFLOW_TRACKING_URI`), else a file store in RUN_DIR/mlruns (MLflow 3
  keeps its file backend behind `MLFLOW_ALLOW_FILE_STORE`, which shiftlab sets for that call only);
- tensorboard: event files in RUN_DIR/tensorboard (`tensorboard --logdir RUN_DIR/tensorboard`).
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

METRICS = ("top1", "top5", "ece", "ece20", "nll", "n", "errors", "seconds_per_image")
PROJECT = "shiftlab"


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
    for d in run_dirs:
        dataset = run_config(d).get("dataset") or d.name
        metrics |= run_metrics(d, prefix=f"{dataset}/" if suite else "")
    report = Path(report_dir) if report_dir is not None else run_dirs[0] / "report"
    build_report(run_dirs, report, n_resamples=200)
    pngs = figures(report)
    where = {}
    for tracker in names:
        where[tracker] = LOGGERS[tracker](run_dirs[0], name, config, metrics, pngs, report / "report.html")
    return where


def _wandb(run_dir: Path, name: str, config: dict, metrics: dict, pngs: list[Path], html: Path) -> str:
    import wandb
    run = wandb.init(project=PROJECT, name=name, dir=str(run_dir), config=config, reinit="finish_previous")
    try:
        run.summary.update(metrics)
        run.log({**metrics, **{f"figures/{p.stem}": wandb.Image(str(p)) for p in pngs}})
        run.save(str(html), base_path=str(html.parent), policy="now")
        return str(Path(run.dir).parent)
    finally:
        run.finish()


def _mlflow(run_dir: Path, name: str, config: dict, metrics: dict, pngs: list[Path], html: Path) -> str:
    import os

    import mlflow
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    allow = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
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
            for png in pngs:
                mlflow.log_artifact(str(png), "figures")
            mlflow.log_artifact(str(html), "report")
    finally:
        mlflow.set_tracking_uri(client_uri)
        if allow is None:
            os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)
        else:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = allow
    return uri


def _tensorboard(run_dir: Path, name: str, config: dict, metrics: dict, pngs: list[Path], html: Path) -> str:
    import numpy as np
    from PIL import Image
    from torch.utils.tensorboard import SummaryWriter
    logdir = run_dir / "tensorboard" / name
    with SummaryWriter(log_dir=str(logdir)) as writer:
        writer.add_text("config", "```\n" + json.dumps(config, indent=1, sort_keys=True, default=str) + "\n```")
        for key, value in metrics.items():
            writer.add_scalar(key, value, 0)
        for png in pngs:
            with Image.open(png) as im:
                writer.add_image(f"figures/{png.stem}", np.asarray(im.convert("RGB")), 0, dataformats="HWC")
    return str(logdir)


LOGGERS = {"wandb": _wandb, "mlflow": _mlflow, "tensorboard": _tensorboard}
