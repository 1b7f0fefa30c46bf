"""`shiftlab bench`: seconds per image of each method, alone and all together, against a
straightforward transcription of each paper's procedure (see docs/BENCHMARKS.md)."""
from __future__ import annotations

import argparse
import json
import sys

from . import checks


def _image_size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT, e.g. 320x256, got {text!r}") from None
    return w, h


def _names(text: str) -> list[str]:
    return [m.strip() for m in text.split(",") if m.strip()]


# `--quick`: one image at QUICK_VIEWS views, no warm-up (the round's figures include the first calls'
# costs: a first look, not a measurement to quote), one round of the floor and all methods together (that
# pass is the all-methods line: no separate pass, bench.runner), no baselines, no per-method passes, the
# loader in-process, and every default method but the
# prompt ensemble (its 80-template x 200-class head is a one-off set-up of minutes on a CPU; per image it
# costs a product with view 0's features, which the pass encodes anyway); the projection scales the
# image-tower phases to the 64-view recipe (docs/BENCHMARKS.md, "--quick"). Flags given explicitly win.
QUICK_VIEWS = 16
QUICK_METHODS = ["zeroshot", "view_ensemble", "tpt", "ctpt", "rtpt", "mta"]
QUICK = {"methods": QUICK_METHODS, "images": 1, "warmup": 0, "views": QUICK_VIEWS, "repeats": 1, "baseline": False,
         "alone": False, "workers": 0}
NORMAL = {"methods": None, "warmup": 1, "views": 64, "repeats": 3, "baseline": True, "alone": True, "workers": -1}


def settings(args: argparse.Namespace, device_type: str) -> dict:
    """The measurement settings: explicit flags, else `--quick`'s, else the defaults."""
    base = QUICK if args.quick else NORMAL | {"images": 32 if device_type == "cuda" else 3}
    out = {key: getattr(args, key) if getattr(args, key, None) is not None else value for key, value in base.items()}
    out["alone"] = out["alone"] or out["baseline"]     # a baseline is measured against its method alone
    return out


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="speed of each method vs a straightforward baseline",
                              description=__doc__)
    p.add_argument("--methods", type=_names, default=None,
                   help="comma-separated methods (default: zeroshot,prompt_ensemble,view_ensemble,tpt,ctpt,rtpt,mta)")
    p.add_argument("--quick", action="store_true",
                   help=f"a first look (under a minute on a quiet 2-core CPU): 1 image at {QUICK_VIEWS} views, "
                        "1 round of the floor, all methods and their re-run from a feature store, no warm-up, "
                        "no baselines; the ImageNet-R projection is scaled to 64 views")
    p.add_argument("--images", type=int, default=None, help="timed images (default 3 on the CPU, 32 on CUDA)")
    p.add_argument("--warmup", type=int, default=None, help="untimed images run through every path first (default 1)")
    p.add_argument("--views", type=checks.int_in(1, checks.MAX_VIEWS), default=None,
                   help="views per image (default 64)")
    p.add_argument("--classes", type=int, default=200,
                   help="number of class names (ImageNet-R's; ImageNet-1k's above 200); ignored with --data")
    p.add_argument("--model", default="RN50", help="open_clip model name (random weights use its -quickgelu variant)")
    p.add_argument("--pretrained", default="none",
                   help="'none' (random weights, default), an open_clip tag, or a checkpoint file")
    p.add_argument("--condition", action=argparse.BooleanOptionalAction, default=True,
                   help="random weights: centre the embeddings and set the logit scale to 100, so that "
                        "predictions are not uniform (the golden fixtures' recipe; same cost)")
    p.add_argument("--dataset", default="imagenet-r", help="with --data: the dataset whose first N images to use")
    p.add_argument("--data", default=None, help="dataset folder (default: synthetic JPEGs)")
    p.add_argument("--image-size", type=_image_size, default=(320, 256), help="synthetic image size WxH")
    p.add_argument("--device", type=checks.device_name, default="auto", help=checks.DEVICE_HELP)
    p.add_argument("--workers", type=int, default=None,
                   help="DataLoader workers for the loader measurement (default -1: as `shiftlab run`)")
    p.add_argument("--precision", choices=["auto", "fp32", "fp16", "bf16"], default="auto",
                   help="as `shiftlab run`: auto = fp16 autocast on CUDA, float32 on the CPU")
    p.add_argument("--batch-size", type=int, default=8, help="images per engine step")
    p.add_argument("--seed", type=checks.int_in(0, 2 ** 64 - 1), default=0,
                   help="seeds the synthetic images and every image's views, as `shiftlab run --seed` (0 to 2**64-1)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (default: torch's choice); 1 gives steadier numbers on a busy CPU")
    p.add_argument("--repeats", type=checks.int_in(0, 100), default=None,
                   help="interleaved rounds of the floor (views encoded alone), each method alone (+ its "
                        "baseline) and all methods: medians, spread, ratios to the floor, projection (0: none)")
    p.add_argument("--store", action=argparse.BooleanOptionalAction, default=True,
                   help="the rounds also re-run all methods from a feature store (what every run after the first "
                        "costs) and report reading vs encoding and one more sweep point per method")
    p.add_argument("--set", dest="method_config", type=checks.method_override, action="append", default=[],
                   metavar="METHOD.FIELD=VALUE", help="override a method's config, e.g. --set tpt.steps=2 (repeatable)")
    p.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=None,
                   help="also run the straightforward baseline of each method (slow)")
    p.add_argument("--baseline-methods", type=_names, default=None,
                   help="run the baseline only for these methods (default: all measured)")
    p.add_argument("--baseline-warmup", type=int, default=None,
                   help="warm-up images of each baseline (default: --warmup); 0 saves a slow image on the CPU")
    p.add_argument("--cache-dir", default=None, help="model weights cache (default ~/.cache/clip)")
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="allow checkpoints holding pickled Python objects (can run code from the file)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)   # tests: the tiny random CLIP
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..bench.progress import Heartbeat

    # Started before torch is imported: no phase of the bench, that import included, goes unsaid for
    # more than 5 s (bench.progress).
    heartbeat = Heartbeat(lambda line: print(line, file=sys.stderr, flush=True))
    heartbeat.say("bench: loading torch, open_clip and the model")
    heartbeat.phase("loading torch, open_clip and the model")
    with heartbeat:
        return _run(args, heartbeat)


def _run(args: argparse.Namespace, heartbeat) -> int:
    from ..bench.images import bench_classnames
    from ..bench.model import load_bench_model, own_models_config
    from ..bench.report import format_report
    from ..bench.runner import BenchConfig, default_methods, run_bench
    from ..engine.config import expand_methods, resolve_device
    from ..models import ModelLoadError

    device = resolve_device(args.device)
    source = None
    classnames = bench_classnames(args.classes)
    if args.data:
        from ..datasets.build import build_dataset
        source = build_dataset(args.dataset, args.data)
        classnames = source.classnames
    pretrained = None if str(args.pretrained).lower() in ("none", "random") else args.pretrained
    try:
        model, info = load_bench_model(args.model, pretrained, classnames, device, condition=args.condition,
                                       tiny=args.tiny, cache_dir=args.cache_dir,
                                       trust_checkpoint=args.trust_checkpoint)
    except ModelLoadError as exc:
        print(f"shiftlab bench: {exc}", file=sys.stderr)
        return 2
    measured = settings(args, device.type)
    try:
        given = checks.method_config(args.method_config)
        if "all" in (measured["methods"] or []):   # expanded under the settings the bench runs each method with
            from ..methods import list_methods
            measured["methods"] = expand_methods(measured["methods"], info["name"],
                                                 own_models_config(list_methods(), info, given))
        method_config = own_models_config(expand_methods(measured["methods"] or default_methods()), info, given)
    except KeyError as exc:
        print(f"shiftlab bench: {exc}", file=sys.stderr)
        return 2
    config = BenchConfig(**measured,
                         seed=args.seed, batch_size=args.batch_size, baseline_methods=args.baseline_methods,
                         baseline_warmup=args.baseline_warmup,
                         method_config=method_config, image_size=args.image_size,
                         threads=args.threads, precision=args.precision, store=args.store)
    try:
        result = run_bench(model, classnames, config, source=source, model_info=info, log=heartbeat.say,
                           on_phase=heartbeat.phase)
    except (KeyError, TypeError, ValueError, ModelLoadError) as exc:
        print(f"shiftlab bench: {exc}", file=sys.stderr)
        return 2
    heartbeat.stop()   # the table is the last word: no heartbeat line inside it
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    return 0
