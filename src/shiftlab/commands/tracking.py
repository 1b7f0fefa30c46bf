"""`shiftlab run --log wandb|mlflow|tensorboard`: after the run, its config, metrics and report figures go to
the trackers (shiftlab.report.trackers, imported only then). Kept out of commands/run.py: the run command
calls `check` before any work (no torch, no matplotlib: this module imports neither) and `log_after` when the
records are complete."""
from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TRACKERS = ("wandb", "mlflow", "tensorboard")
# the module each tracker's client provides, and the extra of shiftlab that installs it
PACKAGES = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow"), "tensorboard": ("tensorboard", "tensorboard")}


class TrackerError(ValueError):
    """An unknown tracker name; one line."""


def parse(text: str) -> list[str]:
    """'wandb,tensorboard' -> ['wandb', 'tensorboard']; an unknown name is a TrackerError."""
    names = [t.strip().lower() for t in str(text).split(",") if t.strip()]
    unknown = [n for n in names if n not in TRACKERS]
    if unknown or not names:
        raise TrackerError(f"unknown tracker {', '.join(unknown) or repr(text)}; choose from {', '.join(TRACKERS)} "
                           "(comma-separated for several)")
    return list(dict.fromkeys(names))


def missing(names: Sequence[str]) -> str | None:
    """One line naming the trackers whose client is not installed (and how to install it), or None."""
    absent = [n for n in names if importlib.util.find_spec(PACKAGES[n][0]) is None]
    if not absent:
        return None
    extras = ",".join(PACKAGES[n][1] for n in absent)
    return f"--log {','.join(absent)}: the client is not installed (pip install 'shiftlab[{extras}]')"


def _trackers(text: str) -> list[str]:
    try:
        return parse(text)
    except TrackerError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log", type=_trackers, default=None, metavar="TRACKER",
                   help="after the run, log its config, per-method metrics and report figures to wandb, mlflow "
                        "or tensorboard (comma-separated for several; extras shiftlab[wandb], [mlflow], "
                        "[tensorboard]; docs/CONFIG.md)")


SERVER_TIMEOUT_S = 5.0   # a tracking server that does not answer a TCP connection in this long is unreachable


def unreachable_server(names: Sequence[str], environ: Any = None) -> str | None:
    """One line when --log mlflow would write to an http(s) MLFLOW_TRACKING_URI whose server does not accept a
    connection (refused, unknown host, no answer in SERVER_TIMEOUT_S), else None: said before any work, instead
    of MLflow's minutes of retries after the run (issue 40 case 14). A file or database URI is not checked."""
    import os
    import socket
    from urllib.parse import urlsplit
    uri = (environ if environ is not None else os.environ).get("MLFLOW_TRACKING_URI", "")
    if "mlflow" not in names or not uri:
        return None
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        socket.create_connection((parts.hostname, port), timeout=SERVER_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        return (f"--log mlflow: the tracking server MLFLOW_TRACKING_URI={uri} cannot be reached ({reason}); start "
                "it, or unset MLFLOW_TRACKING_URI to log into a file store beside the run (OUT/mlruns)")
    return None


def check(args: argparse.Namespace) -> str | None:
    """A tracker whose client is missing, or an unreachable MLflow server, as one line (before any work), or None."""
    if not getattr(args, "log", None):
        return None
    return missing(args.log) or unreachable_server(args.log)


def log_after(args: argparse.Namespace, out: str | Path, run_dirs: list[Path] | None = None) -> int:
    """Log the finished run (or a suite's datasets, `run_dirs`) to every --log tracker; 0, or 1 with one line."""
    if not getattr(args, "log", None):
        return 0
    from ..report.trackers import log_runs
    out = Path(out)
    try:
        where: dict[str, Any] = log_runs(args.log, run_dirs or [out], name=out.name, report_dir=out / "report")
    except Exception as exc:   # the tracker's own failure (network, disk): the records are complete regardless
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"shiftlab run: error: --log {','.join(args.log)}: {message} (the run's records are complete; "
              f"`shiftlab report {out}` shows them)", file=sys.stderr)
        return 1
    for tracker, place in where.items():
        print(f"shiftlab run: logged to {tracker}: {place}", file=sys.stderr)
    return 0
