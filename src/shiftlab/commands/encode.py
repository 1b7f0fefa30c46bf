"""`shiftlab encode`: fill a feature store with the view features a run would encode, running no method.

Takes `shiftlab run`'s flags (the methods decide which view recipes and precisions are encoded);
a later `shiftlab run --features DIR` with the same flags reads every feature from the store.
"""
from __future__ import annotations

import argparse
import sys

from . import run as run_command


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("encode", help="encode view features into a feature store (no methods run)",
                              description=__doc__)
    run_command.add_run_arguments(p)
    for action in p._actions:   # a store, not a run directory, is what encode writes
        if action.dest == "out":
            action.required, action.default = False, None
        if action.dest == "features":
            action.required = True
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.suite or args.datasets:
        print("shiftlab encode: error: encode one --dataset at a time", file=sys.stderr)
        return 2
    if args.attack != "none":
        print("shiftlab encode: error: attacked views are never stored (--attack)", file=sys.stderr)
        return 2
    args.out = args.out or args.features
    code, problems = run_command.refusal(args)
    if code:
        for problem in problems:
            print(f"shiftlab encode: error: {problem}", file=sys.stderr)
        return code
    from ..engine import distributed
    from ..engine.features import encode
    from ..engine.prepare import CannotStart
    distributed.context()
    try:
        try:
            # the methods that load models of their own need pixels, which encode never stores
            cfg, model, datasets = run_command.prepare(args, method_models=False, command="shiftlab encode")
        except CannotStart as exc:
            for problem in exc.problems:
                print(f"shiftlab encode: error: {problem}", file=sys.stderr)
            return 1
        try:
            done = encode(cfg, model=model, dataset=datasets[args.dataset], plan=getattr(args, "run_plan", None))
        except (FileExistsError, ValueError) as exc:
            print(f"shiftlab encode: error: {run_command.one_line(exc)}", file=sys.stderr)
            return 2
    finally:
        distributed.shutdown()
    print(f"shiftlab encode: {done['samples']} samples: {done['stored_before']} already stored, "
          f"{done['encoded']} encoded into {cfg.features}, {done['errors']} could not be decoded")
    return 0
