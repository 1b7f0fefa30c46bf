"""`shiftlab demo`: an offline smoke run of every method on synthetic images of 5 classes with a random-weight
model; it says first what it proves and what it does not (random weights: every accuracy is chance)."""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

from . import checks

# five classes: chance is 20 %, so a handful of images gives each method a top-1 of its own
CLASSES = ("goldfish", "tree frog", "pizza", "volcano", "violin")
# the fields of a method's small test settings (its spec's `test_config`) that count optimisation steps: the demo
# takes those (one step where the method tunes), and none of the others, so each method still runs as configured
STEP_FIELDS = ("steps", "max_steps", "steps_per_template", "repetitions", "task_epochs")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="offline smoke run: synthetic images of 5 classes, random weights, "
                                           "every method")
    p.add_argument("--out", type=Path, default=None,
                   help="run folder to write (default: a new folder under the system's temporary directory, "
                        "named when the demo starts and kept)")
    p.add_argument("--images", type=checks.int_in(1), default=10, metavar="N",
                   help=f"synthetic images to evaluate, spread over {len(CLASSES)} classes (default 10)")
    p.add_argument("--views", type=checks.int_in(1, checks.MAX_VIEWS), default=8, metavar="V",
                   help=f"views per image for the methods that augment (1..{checks.MAX_VIEWS}, default 8; "
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
    chance = 100 / len(CLASSES)
    # Said first, before anything slow (torch alone takes seconds): what runs, what it shows, where it goes.
    print(f"shiftlab demo: every method through the real engine on {args.images} synthetic images of {len(CLASSES)} "
          "classes, with a tiny RANDOM-WEIGHT CLIP (nothing downloaded).\n"
          "What it proves: this install runs each method end to end (views, encoding, adaptation with one "
          "optimisation step, records, summary.md, a run folder `shiftlab report` reads).\n"
          f"What it does not: accuracy. Random weights know no class, so every top-1 is chance ({chance:.0f} % for "
          f"{len(CLASSES)} classes, give or take {100 / max(args.images, 1) ** 0.5:.0f} points on {args.images} "
          "images): the differences between methods below are noise, not a ranking.\n"
          f"run folder: {out}", flush=True)
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


def _say(message: str) -> None:
    print(f"shiftlab demo: {message}", flush=True)


def _run(args: argparse.Namespace, root: Path, out: Path) -> int:
    per_class = -(-args.images // len(CLASSES))
    _say("loading torch and the methods ...")
    from ..datasets.build import build_dataset
    from ..engine.config import RunConfig, expand_methods
    from ..engine.loop import run as run_engine
    from ..methods import get_method_class
    from ..methods.catalogue.declarations import spec, spec_names
    from ..synthetic import make_class_folders, tiny_clip
    # "all" is expanded under the settings the demo runs with: a method that needs a file (DiffTPT's generated
    # views, COSMIC's DINOv2) runs without it offline
    offline = {n: dict(spec(n).offline_config) for n in spec_names() if spec(n).offline_config}
    methods = expand_methods(args.methods, "shiftlab-tiny", offline)
    settings = {}
    for name in methods:
        cls = get_method_class(name)
        steps = {k: v for k, v in cls.spec.test_config.items() if k in STEP_FIELDS}
        if steps or cls.spec.offline_config:
            settings[name] = {**steps, **cls.spec.offline_config}
    problem = views_problem(methods, settings, args.views)
    if problem:
        print(f"shiftlab demo: error: {problem}", file=sys.stderr)
        return 2
    data = make_class_folders(root / "data", CLASSES, per_class=per_class)
    dataset = build_dataset("imagefolder", data)
    cfg = RunConfig(dataset="imagefolder", data=str(data), model="shiftlab-tiny (random weights)",
                    pretrained=None, methods=methods, method_config=settings, views=args.views,
                    limit=args.images, out=str(out), workers=0, batch_size=4)
    _say(f"building {len(methods)} methods and their class heads, then {args.images} images x {len(methods)} "
         "methods ...")
    try:
        run_engine(cfg, model=tiny_clip(0), dataset=dataset)
    except ValueError as exc:   # a setting a method cannot run with (its config check), before any work
        print(f"shiftlab demo: error: {exc}", file=sys.stderr)
        return 2
    return 0


def views_problem(methods: list[str], settings: dict[str, dict], views: int) -> str | None:
    """The methods that `views` views are too few for under the demo's settings, said with the demo's own flags
    (the run's check says "--set NAME.views=N", a flag the demo does not have), or None."""
    from ..methods.catalogue.declarations import spec
    needs = {}
    for name in methods:
        method = spec(name)
        needed = method.needed_views(method.config_class(**settings.get(name, {}))) if method.needs_views else 1
        if views < needed:
            needs[name] = needed
    if not needs:
        return None
    return (f"--views {views} is too few for {', '.join(f'{n} ({k})' for n, k in needs.items())}: the number of views "
            f"(incl. the original) each needs; raise --views to {max(needs.values())}, or leave "
            f"{'it' if len(needs) == 1 else 'them'} out with --methods")
