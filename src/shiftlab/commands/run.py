"""`shiftlab run`: evaluate methods over a dataset into a resumable run directory."""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import catalogue
from . import checks

if TYPE_CHECKING:
    from ..datasets.base import FolderDataset
    from ..engine.config import RunConfig
    from ..models import ClipModel

def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", default="imagenet-r",
                   help="imagenet-r, imagenet-a, imagenet-v2, imagenet-sketch, imagenet, the ten cross-dataset sets "
                        "(flowers102, dtd, ...), imagefolder; CLIP_benchmark's and TPT's names work too (docs/DATA.md)")
    p.add_argument("--suite", default=None, choices=["natural-shift", "cross-dataset"],
                   help="run every dataset of a paper table, each into OUT/<dataset>, then write the suite "
                        "table (OUT/suite.md, suite.csv); --data is the root holding all datasets")
    p.add_argument("--datasets", default=None, metavar="A,B,...",
                   help="like --suite, for your own comma-separated list of datasets")
    p.add_argument("--data", required=True, help="dataset folder, or the folder that contains it; 'DIR/{dataset}' "
                   "(CLIP_benchmark's --dataset_root) is expanded per dataset")
    p.add_argument("--model", default="RN50",
                   help="open_clip architecture (RN50 + openai weights uses QuickGELU); a checkpoint must fit it")
    p.add_argument("--pretrained", default="openai",
                   help="a pretrained tag open_clip lists for --model (e.g. openai), a checkpoint file (file:PATH "
                        "to be explicit), hf-hub:ORG/REPO, or 'none' for random weights (README: Getting the weights)")
    p.add_argument("--methods", type=checks.method_names, default=["all"],
                   help="comma-separated method names, or 'all' (see `shiftlab methods`)")
    p.add_argument("--set", dest="method_config", type=checks.run_override, action="append", default=[],
                   metavar="METHOD.FIELD=VALUE", help="override a method's config, e.g. --set tpt.lr=0.01, or the "
                   "attack's, e.g. --set attack.eps=4/255 (repeatable; the value must have the field's type and lie "
                   "in its range: `shiftlab methods --json` lists the methods', docs/ROBUSTNESS.md the attacks')")
    p.add_argument("--protocol", choices=catalogue.protocols(), default=catalogue.default_protocol(),
                   help="leaderboard: every method on the seed table's 64 shared views; paper: each method's "
                        "own authors' recipe (views, text head, precision); see `shiftlab methods`")
    p.add_argument("--views", type=checks.int_in(1, checks.MAX_VIEWS), default=None,
                   help=f"views per image incl. the original, 1 to {checks.MAX_VIEWS}, for every method "
                        "(default: each method's recipe, 64 for most)")
    p.add_argument("--augmix", action="store_true",
                   help="AugMix on every method's augmented views (default: each method's recipe)")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds the stream order and every sample's views (and random weights, see --model-seed)")
    p.add_argument("--model-seed", type=checks.int_in(0, 2 ** 64 - 1), default=None,
                   help="seed of the random weights of --pretrained none (default: --seed); the same seed gives "
                        "the same weights in every process and on every rank, and run.json records it")
    p.add_argument("--limit", type=checks.int_in(1), default=None,
                   help="evaluate only the first N samples of the stream (N >= 1)")
    p.add_argument("--order", choices=["shuffled", "iid", "sorted", "class-sorted", "dirichlet"], default="shuffled",
                   help="the stream (matters for online and batch methods only): shuffled (= iid, with --seed), "
                        "sorted (the dataset's order), class-sorted, dirichlet (label shift, see --delta); "
                        "docs/PROTOCOLS.md")
    p.add_argument("--delta", type=checks.positive_float, default=None,
                   help="the dirichlet stream's concentration (smaller: longer runs of one class; RoTTA 0.1)")
    p.add_argument("--orders", type=checks.int_in(1, 1000), default=1, metavar="K",
                   help="K seeded orders of the same samples: online methods re-run per order (episodic ones once), "
                        "reported as mean, std, worst and expected tail accuracy (docs/PROTOCOLS.md)")
    p.add_argument("--out", required=True, type=checks.writable_dir,
                   help="run directory (records.jsonl, summary.json, summary.md), created when the run starts; "
                   "with --suite/--datasets the suite directory")
    p.add_argument("--resume", action="store_true", help="continue a run directory, skipping recorded samples")
    p.add_argument("--save-probs", action="store_true",
                   help="also store every record's probability vector (float16) in the run directory's probs/, "
                   "so that any metric can be computed later (shiftlab.rundir.probs.load_probs); a resume keeps it on")
    p.add_argument("--device", type=checks.device_name, default="auto", help=checks.DEVICE_HELP)
    p.add_argument("--workers", type=checks.int_in(-1), default=-1,
                   help="DataLoader workers for decoding and views (default: most CPU cores on CUDA, 1 on CPU)")
    p.add_argument("--precision", choices=["auto", "fp32", "fp16", "bf16"], default="auto",
                   help="auto: fp16 autocast on CUDA as the authors ran (float32 on CPU); fp32 everywhere")
    p.add_argument("--batch-size", type=checks.int_in(1), default=8,
                   help="images per engine step; for a method that adapts on batches, the batch B of the "
                        "episodic-batch protocol (recorded; single-image methods give the same records at any B)")
    p.add_argument("--classnames", type=checks.readable_file, default=None,
                   help="class names file for --dataset imagefolder (one name per line)")
    p.add_argument("--allow-partial", action="store_true",
                   help="run even when more than 5%% of the dataset's classes have no images")
    p.add_argument("--download", action="store_true", help="download missing data and weights (needs internet)")
    p.add_argument("--cache-dir", default=None, help="model weights cache (default ~/.cache/clip)")
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="allow checkpoints holding pickled Python objects (can run code from the file)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (the results table still prints)")
    p.add_argument("--online-checkpoint-seconds", type=checks.non_negative_float, default=60.0,
                   help="how often online methods' state and records are checkpointed (0: every batch)")
    p.add_argument("--features", default=None, metavar="DIR",
                   help="a feature store: read the view features stored there instead of decoding and encoding, "
                        "and store those this run encodes (docs/ARCHITECTURE.md: Feature store)")
    p.add_argument("--features-dtype", choices=["fp16", "fp32"], default="fp16",
                   help="storage of new features: fp16 (half the disk; features change by ~1e-3, so records "
                        "read from it may differ from an uncached run) or fp32 (records identical)")
    a = p.add_argument_group("adversarial evaluation (docs/ROBUSTNESS.md)")
    a.add_argument("--attack", type=checks.attack_name, default="none",
                   help="the threat model: none, or a registered attack (pgd: the R-TPT paper's); its fields are "
                        "set with --set attack.FIELD=VALUE, or with the shortcuts below where it has such a field")
    a.add_argument("--eps", type=checks.fraction_in(0, 1), default=None,
                   help="the attack's eps: an L-inf budget on [0, 1] images, e.g. 1/255 (pgd's default)")
    a.add_argument("--alpha", type=checks.fraction_in(0, 1), default=None,
                   help="the attack's alpha: its step size (pgd: eps/4 unless given)")
    a.add_argument("--steps", type=checks.int_in(0), default=None, help="the attack's steps (pgd: 7)")
    a.add_argument("--random-start", action=argparse.BooleanOptionalAction, default=None,
                   help="the attack's random_start (pgd: on)")
    a.add_argument("--quantize", default=None, metavar="MODE",
                   help="the attack's quantize: 8-bit conversion of the adversarial image (pgd: round | truncate, "
                        "the authors' code truncates)")
    a.add_argument("--clean-and-robust", action="store_true",
                   help="score clean and adversarial images in one pass")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="evaluate methods on a dataset", description=__doc__)
    add_run_arguments(p)
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    from ..engine.config import RunConfig
    classnames = None
    if args.classnames is not None:
        classnames = [ln.strip() for ln in Path(args.classnames).read_text().splitlines() if ln.strip()]
    attack = checks.attack_spec(args)
    pretrained = None if _random_weights(args) else args.pretrained
    methods = args.methods if isinstance(args.methods, list) else checks.method_names(args.methods)
    from ..datasets.specs import DATASETS
    dataset = DATASETS.canonical(args.dataset) if args.dataset in DATASETS else args.dataset  # R -> imagenet-r
    return RunConfig(dataset=dataset, data=str(args.data), model=args.model, pretrained=pretrained,
                     methods=list(methods), method_config=checks.method_config(args.method_config),
                     views=args.views, augmix=args.augmix, protocol=args.protocol, seed=args.seed,
                     model_seed=getattr(args, "model_seed", None),
                     limit=args.limit, out=str(args.out),
                     resume=args.resume, device=args.device, workers=args.workers, batch_size=args.batch_size,
                     order="shuffled" if args.order == "iid" else args.order,
                     delta=getattr(args, "delta", None), orders=getattr(args, "orders", 1), attack=attack,
                     clean_and_robust=args.clean_and_robust,
                     classnames=classnames, progress=not args.no_progress,
                     online_checkpoint_seconds=args.online_checkpoint_seconds, precision=args.precision,
                     cache_dir=args.cache_dir, download=args.download, trust_checkpoint=args.trust_checkpoint,
                     save_probs=getattr(args, "save_probs", False),
                     features=getattr(args, "features", None),
                     features_dtype=getattr(args, "features_dtype", "fp16"))


def _random_weights(args: argparse.Namespace) -> bool:
    return str(args.pretrained).lower() in ("none", "random")


class CannotStart(Exception):
    """Data or weights are missing or unusable; one line per problem."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def one_line(text: object) -> str:
    """A multi-line message (error + hint) as one line."""
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


def _missing_dirs(path: Path) -> list[Path]:
    """`path` and its parents that do not exist yet, deepest first."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def _download_dataset(name: str, root: str, classnames: list[str] | None) -> FolderDataset:
    """Download then build a dataset; a failed download leaves no empty folders behind."""
    from ..datasets.build import build_dataset, expand_root
    from ..datasets.install import download_dataset
    root = str(expand_root(root, name))
    created = _missing_dirs(Path(root).expanduser())
    try:
        download_dataset(name, root)
        return build_dataset(name, root, classnames=classnames)
    except BaseException:
        for folder in created:   # deepest first; a folder holding a partial download stays
            try:
                folder.rmdir()
            except OSError:
                break
        raise


def unknown_dataset(args: argparse.Namespace) -> str | None:
    """An unknown --dataset or --datasets name as one line, or None: said before torch is imported and
    the model loaded (the dataset registry is data)."""
    from ..datasets.base import DatasetError
    from ..datasets.specs import DATASETS
    for name in dataset_names(args):
        try:
            DATASETS.canonical(name)
        except DatasetError as exc:
            return f"dataset {name}: {exc}"
    return None


def check_combination(args: argparse.Namespace) -> str | None:
    """A problem between flags that each parsed fine, or None: the attack's fields (`checks.attack_spec`), then
    the run's settings as the engine checks them (`engine.config.settings_problem`) on every dataset it will run."""
    if getattr(args, "model_seed", None) is not None and not _random_weights(args):
        return (f"--model-seed seeds random weights only (--pretrained none); --pretrained {args.pretrained} "
                "loads its weights from a checkpoint")
    problem = attack_problem(args)
    if problem:
        return problem
    from ..engine.config import settings_problem
    return settings_problem(config_from_args(args), dataset_names(args))


def attack_problem(args: argparse.Namespace) -> str | None:
    """A refused attack field (`checks.attack_spec`) as one line, or None; read from the attack catalogue,
    so said before torch (or numpy) is imported."""
    try:
        checks.attack_spec(args)
    except ValueError as exc:
        return str(exc)
    return None


def dataset_names(args: argparse.Namespace) -> list[str]:
    """The datasets this command evaluates: --dataset, or every dataset of --suite/--datasets."""
    if getattr(args, "suite", None) or getattr(args, "datasets", None):
        from ..datasets.suites import resolve_suite
        return list(resolve_suite(args.suite, args.datasets).datasets)
    return [args.dataset]


def download_hint(name: str, root: str, exc: Exception) -> str:
    """' -> run `shiftlab download ...`' only where that command can fetch what is missing: a known
    dataset with a download URL whose images (not only a split file) are missing."""
    from ..datasets.build import expand_root
    from ..datasets.specs import DATASETS
    from ..datasets.splits import SplitFileMissing
    if name not in DATASETS or isinstance(exc, SplitFileMissing) or getattr(exc, "found_instead", None):
        return ""
    spec = DATASETS.get(name)
    if not spec.url:
        return " (it cannot be downloaded automatically: see docs/DATA.md)" if spec.manual else ""
    return (f" -> run `shiftlab download {spec.name} --root {expand_root(root, spec.name)}` (or pass --download), "
            "see docs/DATA.md")


def args_progress(args: argparse.Namespace) -> bool:
    return not getattr(args, "no_progress", False) and sys.stderr.isatty()


def prepare(args: argparse.Namespace, method_models: bool = True) -> tuple[RunConfig, ClipModel,
                                                                           dict[str, FolderDataset]]:
    """Check data and weights before any heavy work, downloading them when asked; with `method_models`, also
    load the models the methods load themselves (`load_extra_models`).

    Every problem is reported at once (each dataset and the weights), each with what to download
    and where, one line each: raises CannotStart. Returns (config, model, {dataset name: dataset})."""
    # set-up phases that take seconds on a CPU (an 80,000-file scan, an RN50 checkpoint) say so, on a terminal
    say = (lambda msg: print(msg, file=sys.stderr, flush=True)) if args_progress(args) else (lambda msg: None)
    from ..datasets.base import DatasetError
    from ..datasets.build import build_dataset, expand_root
    from ..datasets.fetch import DownloadError
    from ..engine.config import resolve_device
    from ..models import ModelLoadError, load_run_model

    problems: list[str] = []
    datasets = {}
    model = None
    cfg = config_from_args(args)
    names = dataset_names(args)
    for name in names:
        classnames = cfg.classnames if len(names) == 1 else None
        try:
            say(f"shiftlab run: listing {name} under {expand_root(cfg.data, name)} ...")
            datasets[name] = build_dataset(name, cfg.data, classnames=classnames)
        except DatasetError as exc:
            if args.download:
                try:
                    datasets[name] = _download_dataset(name, cfg.data, classnames)
                except (DownloadError, DatasetError, OSError) as dl_exc:
                    problems.append(f"dataset {name}: {one_line(dl_exc)}")
            else:
                hint = download_hint(name, cfg.data, exc)
                said = one_line(exc)
                if "shiftlab download" in hint:   # the advice once: the loader's own copy goes
                    said = re.sub(r"; get them with: shiftlab download \S+ --root [^)]*\)", ")", said)
                problems.append(f"dataset {name}: {said}{hint}")
    try:
        say(f"shiftlab run: loading {cfg.model} ({cfg.pretrained or 'random weights'}) ...")
        model = load_run_model(cfg, resolve_device(cfg.device))
    except ModelLoadError as exc:
        problems.append(f"model: {one_line(exc)}")
    except OSError as exc:  # network failures inside open_clip's download
        problems.append(f"model: downloading {cfg.model}/{cfg.pretrained} failed ({one_line(exc)}); on a machine "
                        "without internet put the checkpoint in the cache or pass --pretrained /path/to/file")
    if method_models:   # RLCF's reward model: refused here too, before any work
        problems += load_extra_models(args, cfg, say)
    for name, dataset in datasets.items():
        for warning in dataset.warnings:  # empty classes, skipped files and links: said before any work
            print(f"shiftlab run: warning: {name}: {warning}", file=sys.stderr)
        if not args.allow_partial:
            try:
                dataset.require_complete()
            except DatasetError as exc:
                problems.append(f"dataset {name}: {one_line(exc)} -> complete the dataset, or pass --allow-partial "
                                "to run on the classes present (labels keep the full class list)")
    if problems:
        raise CannotStart(problems)
    return cfg, model, datasets


def load_extra_models(args: argparse.Namespace, cfg: RunConfig, say: Any) -> list[str]:
    """Load the CLIPs the methods load themselves (`Method.extra_models`: RLCF's reward model), each once per
    process (`models.load_shared_model`, where the methods then find them), with the run's weight flags and
    on the device the engine gives the run's model; returns one line per model that cannot be loaded."""
    import torch

    from ..datasets.specs import DATASETS
    from ..engine import distributed
    from ..engine.config import resolve_device
    from ..methods import get_method_class, list_methods
    from ..methods.base import effective_config
    from ..models import ModelLoadError, load_shared_model
    names = list_methods() if "all" in cfg.methods else cfg.methods
    run_views = ({"n_views": cfg.views} if cfg.views is not None else {}) | ({"augmix": True} if cfg.augmix else {})
    wanted: dict[tuple, tuple[str, str]] = {}
    for dataset in dataset_names(args):
        canonical = DATASETS.canonical(dataset) if dataset in DATASETS else None
        for name in names:
            config = effective_config(name, cfg.protocol, canonical, cfg.precision, run_views,
                                      **cfg.method_config.get(name, {}))
            for extra in get_method_class(name).extra_models(config):
                wanted.setdefault((extra.arch, extra.pretrained, extra.seed), (name, extra.settings))
    device = resolve_device(cfg.device)
    dist = distributed.context()
    if dist.world_size > 1 and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
    problems = []
    for (arch, pretrained, seed), (method, settings) in wanted.items():
        try:
            say(f"shiftlab run: loading {arch} ({pretrained or 'random weights'}) for {method} ...")
            load_shared_model(arch, pretrained, device=device, seed=seed, cache_dir=cfg.cache_dir,
                              allow_download=cfg.download, trust_checkpoint=cfg.trust_checkpoint)
        except ModelLoadError as exc:
            problems.append(f"{method}: its model {arch} ({pretrained}): {one_line(exc)} (for {method}: {settings})")
        except OSError as exc:
            problems.append(f"{method}: downloading its model {arch}/{pretrained} failed ({one_line(exc)}); "
                            f"put the weights in the cache or choose others ({settings})")
    return problems


def run(args: argparse.Namespace) -> int:
    problem = attack_problem(args)   # read from the attack catalogue: nothing heavy imported yet
    if problem:
        print(f"shiftlab run: error: {problem}", file=sys.stderr)
        return 2
    from ..datasets.suites import SuiteError, resolve_suite
    try:
        suite = resolve_suite(args.suite, args.datasets) if (args.suite or args.datasets) else None
    except SuiteError as exc:
        print(f"shiftlab run: error: {exc}", file=sys.stderr)
        return 2
    problem = unknown_dataset(args) or check_combination(args)   # the dataset names first: no torch import
    if problem:
        print(f"shiftlab run: error: {problem}", file=sys.stderr)
        return 2
    from ..engine import distributed
    from ..engine.loop import run as run_engine
    from ..engine.suite import run_suite
    from ..results.suite_table import table_markdown
    distributed.context()  # under torchrun: process group, this rank's GPU and CPU threads before loading
    try:
        try:
            cfg, model, datasets = prepare(args)
        except CannotStart as exc:
            for problem in exc.problems:
                print(f"shiftlab run: error: {problem}", file=sys.stderr)
            return 1
        try:
            if suite is not None:
                table = run_suite(cfg, suite, model=model, datasets=datasets)
                if table and not cfg.progress:   # with progress, run_suite prints it
                    print(table_markdown(table))
                return 0
            summary = run_engine(cfg, model=model, dataset=datasets[args.dataset])
        except (FileExistsError, KeyError, TypeError, ValueError) as exc:
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc   # no KeyError quotes
            print(f"shiftlab run: error: {one_line(message)}", file=sys.stderr)
            return 2
        table = Path(cfg.out) / "summary.md"
        if summary and not cfg.progress and table.is_file():   # the engine prints it with the progress bar
            print(table.read_text(), end="")
    finally:
        distributed.shutdown()
    return 0
