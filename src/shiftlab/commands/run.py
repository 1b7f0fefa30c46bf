"""`shiftlab run`: evaluate methods over a dataset into a resumable run directory."""
from __future__ import annotations

import argparse
import ast
import sys
from fractions import Fraction
from pathlib import Path


def parse_fraction(text: str) -> float:
    """'1/255', '0.0039' or '4/255' -> float."""
    try:
        return float(Fraction(text.strip()))
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"expected a number or a fraction like 1/255, got {text!r}") from None


def parse_method_config(items: list[str]) -> dict[str, dict]:
    """['tpt.lr=0.01', 'rtpt.self_mask=threshold'] -> {'tpt': {'lr': 0.01}, 'rtpt': {'self_mask': 'threshold'}}."""
    out: dict[str, dict] = {}
    for item in items:
        key, sep, value = item.partition("=")
        method, dot, field = key.partition(".")
        if not sep or not dot or not method or not field:
            raise argparse.ArgumentTypeError(f"--set expects METHOD.FIELD=VALUE, got {item!r}")
        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            parsed = value
        out.setdefault(method, {})[field] = parsed
    return out


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", default="imagenet-r",
                   help="imagenet-r, imagenet-a, imagenet-v2, imagenet-sketch, imagenet, the ten cross-dataset sets "
                        "(flowers102, dtd, ...), imagefolder; CLIP_benchmark's and TPT's names work too (docs/DATA.md)")
    p.add_argument("--suite", default=None, choices=["natural-shift", "cross-dataset"],
                   help="run every dataset of a paper table, each into OUT/<dataset>, then write the suite "
                        "table (OUT/suite.md, suite.csv); --data is the root holding all datasets")
    p.add_argument("--datasets", default=None, metavar="A,B,...",
                   help="like --suite, for your own comma-separated list of datasets")
    p.add_argument("--data", required=True, help="dataset folder, or the folder that contains it")
    p.add_argument("--model", default="RN50", help="open_clip model name (RN50 + openai weights uses QuickGELU)")
    p.add_argument("--pretrained", default="openai",
                   help="open_clip tag (e.g. openai), a checkpoint file, or 'none' for random weights")
    p.add_argument("--methods", default="all", help="comma-separated method names, or 'all' (see `shiftlab methods`)")
    p.add_argument("--set", dest="method_config", action="append", default=[], metavar="METHOD.FIELD=VALUE",
                   help="override a method's config, e.g. --set tpt.lr=0.01 (repeatable)")
    p.add_argument("--views", type=int, default=64, help="views per image incl. the original (default 64)")
    p.add_argument("--augmix", action="store_true", help="AugMix on augmented views (C-TPT's --I_augmix)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N samples of the stream")
    p.add_argument("--order", choices=["shuffled", "sorted"], default="shuffled",
                   help="stream order (matters for online methods only); shuffled with --seed")
    p.add_argument("--out", required=True, help="run directory (records.jsonl, summary.json, summary.md); "
                   "with --suite/--datasets the suite directory")
    p.add_argument("--resume", action="store_true", help="continue a run directory, skipping recorded samples")
    p.add_argument("--device", default="auto")
    p.add_argument("--workers", type=int, default=-1,
                   help="DataLoader workers for decoding and views (default: most CPU cores on CUDA, 1 on CPU)")
    p.add_argument("--precision", choices=["auto", "fp32", "fp16", "bf16"], default="auto",
                   help="auto: fp16 autocast on CUDA as the authors ran (float32 on CPU); fp32 everywhere")
    p.add_argument("--batch-size", type=int, default=8, help="images per engine step")
    p.add_argument("--classnames", type=Path, default=None, help="class names file for --dataset imagefolder")
    p.add_argument("--allow-partial", action="store_true",
                   help="run even when more than 5%% of the dataset's classes have no images")
    p.add_argument("--download", action="store_true", help="download missing data and weights (needs internet)")
    p.add_argument("--cache-dir", default=None, help="model weights cache (default ~/.cache/clip)")
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="allow checkpoints holding pickled Python objects (can run code from the file)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--online-checkpoint-seconds", type=float, default=60.0,
                   help="how often online methods' state and records are checkpointed (0: every batch)")
    a = p.add_argument_group("adversarial evaluation (threat model of the R-TPT paper)")
    a.add_argument("--attack", default="none", help="none | pgd")
    a.add_argument("--eps", type=parse_fraction, default=parse_fraction("1/255"), help="L-inf budget, e.g. 1/255")
    a.add_argument("--alpha", type=parse_fraction, default=None, help="step size (default eps/4)")
    a.add_argument("--steps", type=int, default=7)
    a.add_argument("--random-start", action=argparse.BooleanOptionalAction, default=True)
    a.add_argument("--quantize", choices=["round", "truncate"], default="round",
                   help="8-bit conversion of the adversarial image (the authors' code truncates)")
    a.add_argument("--clean-and-robust", action="store_true",
                   help="score clean and adversarial images in one pass")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("run", help="evaluate methods on a dataset", description=__doc__)
    add_run_arguments(p)
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):
    from ..engine import RunConfig
    classnames = None
    if args.classnames is not None:
        classnames = [ln.strip() for ln in args.classnames.read_text().splitlines() if ln.strip()]
    attack = {"name": args.attack}
    if args.attack != "none":
        attack |= {"eps": args.eps, "alpha": args.alpha if args.alpha is not None else args.eps / 4,
                   "steps": args.steps, "random_start": args.random_start, "quantize": args.quantize}
    pretrained = None if str(args.pretrained).lower() in ("none", "random") else args.pretrained
    from ..datasets import DATASETS
    dataset = DATASETS.canonical(args.dataset) if args.dataset in DATASETS else args.dataset  # R -> imagenet-r
    return RunConfig(dataset=dataset, data=str(args.data), model=args.model, pretrained=pretrained,
                     methods=[m.strip() for m in args.methods.split(",") if m.strip()],
                     method_config=parse_method_config(args.method_config), views=args.views,
                     augmix=args.augmix, seed=args.seed, limit=args.limit, out=str(args.out), resume=args.resume,
                     device=args.device, workers=args.workers, batch_size=args.batch_size, order=args.order,
                     attack=attack, clean_and_robust=args.clean_and_robust, classnames=classnames,
                     progress=not args.no_progress, online_checkpoint_seconds=args.online_checkpoint_seconds,
                     precision=args.precision)


def dataset_names(args: argparse.Namespace) -> list[str]:
    """The datasets this command evaluates: --dataset, or every dataset of --suite/--datasets."""
    if getattr(args, "suite", None) or getattr(args, "datasets", None):
        from ..suites import resolve_suite
        return list(resolve_suite(args.suite, args.datasets).datasets)
    return [args.dataset]


def prepare(args: argparse.Namespace):
    """Check data and weights before any heavy work, downloading them when asked.

    Every problem is reported at once (each dataset and the weights), each with what to download
    and where. Returns (config, model, {dataset name: dataset})."""
    from ..datasets import DatasetError, DownloadError, build_dataset, download_dataset
    from ..engine import resolve_device
    from ..models import ModelLoadError, load_model

    problems: list[str] = []
    datasets = {}
    model = None
    cfg = config_from_args(args)
    names = dataset_names(args)
    for name in names:
        classnames = cfg.classnames if len(names) == 1 else None
        try:
            datasets[name] = build_dataset(name, cfg.data, classnames=classnames)
        except DatasetError as exc:
            if args.download:
                try:
                    download_dataset(name, cfg.data)
                    datasets[name] = build_dataset(name, cfg.data, classnames=classnames)
                except (DownloadError, DatasetError, OSError) as dl_exc:
                    problems.append(f"dataset {name}: {dl_exc}")
            else:
                problems.append(f"dataset {name}: {exc}\n  -> run `shiftlab download {name} --root {cfg.data}` "
                                "(or pass --download), see docs/DATA.md")
    try:
        model = load_model(cfg.model, cfg.pretrained, device=resolve_device(cfg.device), cache_dir=args.cache_dir,
                           allow_download=args.download, trust_checkpoint=args.trust_checkpoint)
    except ModelLoadError as exc:
        problems.append(f"model: {exc}")
    except OSError as exc:  # network failures inside open_clip's download
        problems.append(f"model: downloading {cfg.model}/{cfg.pretrained} failed ({exc}); on a machine without "
                        "internet put the checkpoint in the cache or pass --pretrained /path/to/file")
    for name, dataset in datasets.items():
        for warning in dataset.warnings:  # empty classes, skipped files and links: said before any work
            print(f"shiftlab run: warning: {name}: {warning}", file=sys.stderr)
        if not args.allow_partial:
            try:
                dataset.require_complete()
            except DatasetError as exc:
                problems.append(f"dataset {name}: {exc}\n  -> complete the dataset, or pass --allow-partial to run "
                                "on the classes present (labels keep the full class list)")
    if problems:
        raise SystemExit("shiftlab run cannot start:\n- " + "\n- ".join(problems))
    return cfg, model, datasets


def run(args: argparse.Namespace) -> int:
    from .. import distributed
    from ..engine import run as run_engine
    from ..suites import SuiteError, resolve_suite, run_suite
    try:
        suite = resolve_suite(args.suite, args.datasets) if (args.suite or args.datasets) else None
    except SuiteError as exc:
        print(f"shiftlab run: {exc}", file=sys.stderr)
        return 2
    distributed.context()  # under torchrun: process group, this rank's GPU and CPU threads before loading
    try:
        cfg, model, datasets = prepare(args)
        try:
            if suite is not None:
                run_suite(cfg, suite, model=model, datasets=datasets)
            else:
                run_engine(cfg, model=model, dataset=datasets[args.dataset])
        except (FileExistsError, KeyError, TypeError, ValueError) as exc:
            print(f"shiftlab run: {exc}", file=sys.stderr)
            return 2
    finally:
        distributed.shutdown()
    return 0
