"""`shiftlab demo`: an offline smoke run of every method on synthetic data with a random-weight model."""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from . import checks


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="offline smoke run: synthetic ImageNet-R, random weights, every method")
    p.add_argument("--out", type=Path, default=None, help="where to keep the run (default: a temporary folder)")
    p.add_argument("--images", type=checks.int_in(1), default=12)
    p.add_argument("--views", type=checks.int_in(1, checks.MAX_VIEWS), default=16)
    p.add_argument("--methods", type=checks.method_names, default=["all"], help="comma-separated, or 'all'")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..datasets.build import build_dataset
    from ..engine.config import RunConfig, expand_methods
    from ..engine.loop import run as run_engine
    from ..methods import get_method_class
    from ..synthetic import make_imagenet_r, tiny_clip

    with tempfile.TemporaryDirectory(prefix="shiftlab-demo-") as tmp:
        root = Path(tmp)
        data = make_imagenet_r(root / "data", classes=range(0, 200, max(1, 200 // max(args.images, 1))),
                               size=(96, 80))
        out = args.out or root / "run"
        print("shiftlab demo: synthetic ImageNet-R images and a tiny RANDOM-WEIGHT CLIP.\n"
              "The accuracies below are meaningless; the demo only checks that every method runs end to end.\n")
        dataset = build_dataset("imagenet-r", data)
        methods = expand_methods(args.methods)
        offline = {n: dict(get_method_class(n).offline_config) for n in methods if get_method_class(n).offline_config}
        cfg = RunConfig(dataset="imagenet-r", data=str(data), model="shiftlab-tiny (random weights)",
                        pretrained=None, methods=methods, method_config=offline, views=args.views,
                        limit=args.images, out=str(out), workers=0, batch_size=4)
        try:
            run_engine(cfg, model=tiny_clip(0), dataset=dataset)
        except ValueError as exc:   # a setting a method cannot run with (e.g. MTA under --views 4), before any work
            print(f"shiftlab demo: error: {exc}", file=sys.stderr)
            return 2
        if args.out:
            print(f"run directory: {out}")
    return 0
