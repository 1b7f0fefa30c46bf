"""`shiftlab demo`: an offline smoke run of every method on synthetic data with a random-weight model."""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

from . import checks


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="offline smoke run: synthetic ImageNet-R, random weights, every method")
    p.add_argument("--out", type=Path, default=None,
                   help="run folder to write (default: a new folder under the system's temporary directory, "
                        "named when the demo starts and kept)")
    p.add_argument("--images", type=checks.int_in(1), default=12, metavar="N",
                   help="synthetic images to evaluate (default 12)")
    p.add_argument("--views", type=checks.int_in(1, checks.MAX_VIEWS), default=16, metavar="V",
                   help=f"views per image for the methods that augment (1..{checks.MAX_VIEWS}, default 16; "
                        "the papers use 64)")
    p.add_argument("--methods", type=checks.method_names, default=["all"], help="comma-separated, or 'all'")
    p.set_defaults(func=run)


def warning_lines(caught: list[warnings.WarningMessage]) -> list[str]:
    """Each distinct warning once, as one line: 'Category (module.py:line): first line of the message [xN]'."""
    counts: dict[str, int] = {}
    for w in caught:
        first = str(w.message).strip().splitlines()[0] if str(w.message).strip() else ""
        line = f"{w.category.__name__} ({Path(w.filename).name}:{w.lineno}): {first}"
        counts[line] = counts.get(line, 0) + 1
    return [line + (f" [x{n}]" if n > 1 else "") for line, n in counts.items()]


def run(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="shiftlab-demo-"))
    out = args.out or root / "run"
    # Named first, before anything slow: where the records, summary.md and run.json go.
    print("shiftlab demo: synthetic ImageNet-R images and a tiny RANDOM-WEIGHT CLIP.\n"
          "The accuracies below are meaningless; the demo only checks that every method runs end to end.\n"
          f"run folder: {out}\n", flush=True)
    # A library's warning printed mid-run breaks the progress bar: they are held back and each is said
    # once, as one line, after the table.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = _run(args, root, out)
    for line in warning_lines(caught):
        print(f"shiftlab demo: library warning: {line}", file=sys.stderr)
    if args.out:
        shutil.rmtree(root, ignore_errors=True)   # the synthetic images; the run folder is elsewhere
    if code == 0:
        print(f"run folder: {out} (see it as a page: shiftlab report {out} --out {out / 'report'})")
    return code


def _run(args: argparse.Namespace, root: Path, out: Path) -> int:
    from ..datasets.build import build_dataset
    from ..engine.config import RunConfig, expand_methods
    from ..engine.loop import run as run_engine
    from ..methods import get_method_class
    from ..synthetic import make_imagenet_r, tiny_clip

    data = make_imagenet_r(root / "data", classes=range(0, 200, max(1, 200 // max(args.images, 1))),
                           size=(96, 80))
    dataset = build_dataset("imagenet-r", data)
    methods = expand_methods(args.methods, "shiftlab-tiny")
    offline = {n: dict(get_method_class(n).offline_config) for n in methods if get_method_class(n).offline_config}
    cfg = RunConfig(dataset="imagenet-r", data=str(data), model="shiftlab-tiny (random weights)",
                    pretrained=None, methods=methods, method_config=offline, views=args.views,
                    limit=args.images, out=str(out), workers=0, batch_size=4)
    try:
        run_engine(cfg, model=tiny_clip(0), dataset=dataset)
    except ValueError as exc:   # a setting a method cannot run with (e.g. MTA under --views 4), before any work
        print(f"shiftlab demo: error: {exc}", file=sys.stderr)
        return 2
    return 0
