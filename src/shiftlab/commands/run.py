"""`shiftlab run`: evaluate methods over a dataset into a resumable run directory."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..attacks.budgets import L2_MAX
from ..methods.catalogue import listing as catalogue
from . import checks, config_file, data_checks, pretrained_check, tracking

if TYPE_CHECKING:
    from ..datasets.base import FolderDataset
    from ..datasets.suites import Suite
    from ..engine.config import RunConfig
    from ..models import ClipModel

def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", default="imagenet-r",
                   help="imagenet-r, imagenet-a, imagenet-v2, imagenet-sketch, imagenet, the ten cross-dataset sets "
                        "(flowers102, dtd, ...), imagefolder; CLIP_benchmark's and TPT's names work too (docs/DATA.md)")
    p.add_argument("--suite", default=None, choices=["natural-shift", "cross-dataset", "corruption"],
                   help="run every dataset of a paper table, each into OUT/<dataset>, then write the suite "
                        "table (OUT/suite.md, suite.csv); --data is the root holding all datasets. corruption: "
                        "--dataset under each of --corruptions at --severity, each into OUT/<corruption>-<severity>, "
                        "with accuracy per corruption, mean and mCE against zero-shot CLIP (docs/PROTOCOLS.md)")
    p.add_argument("--datasets", default=None, metavar="A,B,...",
                   help="like --suite, for your own comma-separated list of datasets")
    p.add_argument("--data", required=True, help="dataset folder, or the folder that contains it; 'DIR/{dataset}' "
                   "(CLIP_benchmark's --dataset_root) is expanded per dataset")
    p.add_argument("--model", default="RN50",
                   help="open_clip architecture (RN50 + openai weights uses QuickGELU); a checkpoint must fit it")
    p.add_argument("--pretrained", default="openai",
                   help="a pretrained tag open_clip lists for --model (e.g. openai), a checkpoint file (file:PATH "
                        "to be explicit), hf-hub:ORG/REPO, or 'none' for random weights (README: Getting the weights)")
    p.add_argument("--base-pretrained", default=None, metavar="TAG|FILE",
                   help="for a --pretrained file holding only an image tower (FARE's and TeCoA's robust checkpoints): "
                        "the CLIP of --model whose text tower completes it, read as --pretrained is (e.g. openai; "
                        "docs/ROBUSTNESS.md: Robust backbones)")
    p.add_argument("--methods", type=checks.method_names, default=["all"],
                   help="comma-separated method names, or 'all' (the default; see `shiftlab methods`)")
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
    p.add_argument("--seed", type=checks.int_in(0, 2 ** 64 - 1), default=0,
                   help="seeds the stream order and every sample's views (and random weights, see --model-seed)")
    p.add_argument("--model-seed", type=checks.int_in(0, 2 ** 64 - 1), default=None,
                   help="seed of the random weights of --pretrained none (default: --seed); the same seed gives "
                        "the same weights in every process and on every rank, and run.json records it")
    p.add_argument("--limit", type=checks.int_in(1), default=None,
                   help="evaluate only the first N samples of the stream (N >= 1)")
    p.add_argument("--order", choices=["shuffled", "iid", "sorted", "class-sorted", "dirichlet", "continual", "mixed"],
                   default="shuffled",
                   help="the stream (matters for online and batch methods only): shuffled (= iid, with --seed), "
                        "sorted (the dataset's order), class-sorted, dirichlet (label shift, see --delta); with "
                        "--suite/--datasets of one class list, continual (one dataset after the other, no reset) or "
                        "mixed (all shuffled together), one run in --out; docs/PROTOCOLS.md")
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
    p.add_argument("--workers", type=checks.workers, default=-1,
                   help="DataLoader workers for decoding and views: auto (default: most CPU cores on CUDA, 1 on CPU) "
                        "or a count (0: in the main process)")
    p.add_argument("--precision", choices=["auto", "fp32", "fp16", "bf16"], default="auto",
                   help="auto: fp16 autocast on CUDA as the authors ran (float32 on CPU); fp32 everywhere; fp16, "
                        "bf16: autocast on CUDA (float32 elsewhere, with a warning)")
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
    p.add_argument("--online-checkpoint-samples", type=checks.int_in(1), default=64, metavar="N",
                   help="checkpoint online methods' state and write their records at least every N samples (never "
                        "more often than 10x the time a checkpoint takes), so a kill loses seconds of online work")
    p.add_argument("--features", type=checks.folder_path, default=None, metavar="DIR",
                   help="a feature store: read the view features stored there instead of decoding and encoding, "
                        "and store those this run encodes (docs/ARCHITECTURE.md: Feature store)")
    p.add_argument("--features-dtype", choices=["fp16", "fp32"], default="fp16",
                   help="storage of new features: fp16 (half the disk; features change by ~1e-3, so records "
                        "read from it may differ from an uncached run) or fp32 (records identical)")
    config_file.add_argument(p)
    c = p.add_argument_group("corruptions and open-set streams (docs/PROTOCOLS.md)")
    c.add_argument("--corruption", type=checks.corruption_name, default=None, metavar="NAME",
                   help="a common corruption (gaussian_noise, ..., jpeg_compression; the 4 extra too): read from "
                        "imagenet-c / cifar10-c / cifar100-c, or generated on the fly from any other --dataset "
                        "(imagecorruptions, seeded per sample by --seed)")
    c.add_argument("--severity", type=checks.severity, default="5",
                   help="corruption severity 1..5 (default 5, the field's); 'all' with --suite corruption")
    c.add_argument("--corruptions", type=checks.corruption_names, default=None, metavar="A,B|common|all",
                   help="--suite corruption's corruptions: common (the 15, default; a stored set adds the extra "
                        "ones it holds), all (19) or a list")
    c.add_argument("--ood", type=checks.dataset_list, default=[], metavar="A,B",
                   help="out-of-distribution sets mixed into the stream (inaturalist-ood, sun-ood, places-ood, "
                        "textures-ood, ninco, svhn, or any dataset): records get ood and ood_score (MCM), the "
                        "summary AUROC, FPR95, AUPR")
    c.add_argument("--ood-ratio", type=checks.ood_ratio, default=1.0,
                   help="OOD images per ID image (default 1), drawn without replacement from the --ood sets")
    c.add_argument("--ood-seed", type=checks.int_in(0, 2 ** 64 - 1), default=None,
                   help="seed of the OOD draw (default: --seed)")
    a = p.add_argument_group("adversarial evaluation (docs/ROBUSTNESS.md)")
    a.add_argument("--attack", type=checks.attack_name, default="none",
                   help="the threat model: none, or a registered attack (pgd: the R-TPT paper's); its fields are "
                        "set with --set attack.FIELD=VALUE, or with the shortcuts below where it has such a field")
    a.add_argument("--eps", type=checks.fractions_in(0, 1), default=None,
                   help="the attack's eps: an L-inf budget on [0, 1] images, e.g. 1/255 (pgd's default); a list "
                        "1/255,2/255,4/255 runs every budget in one pass (a setting per budget: apgd_ce@eps1, ...)")
    a.add_argument("--alpha", type=checks.fraction_in(0, 1), default=None,
                   help="the attack's alpha: its step size (pgd: eps/4 unless given)")
    a.add_argument("--steps", type=checks.int_in(0), default=None, help="the attack's steps (pgd: 7)")
    a.add_argument("--random-start", action=argparse.BooleanOptionalAction, default=None,
                   help="the attack's random_start (pgd: on)")
    a.add_argument("--quantize", default=None, metavar="MODE",
                   help="the attack's quantize: 8-bit conversion of the adversarial image (pgd: round | truncate, "
                        "the authors' code truncates)")
    a.add_argument("--attack-subset", type=checks.int_in(1), default=None, metavar="N",
                   help="attack only N of the samples, drawn by --seed (recorded in run.json; the clean setting "
                        "still scores every sample)")
    a.add_argument("--eps-l2", type=checks.fraction_in(0, L2_MAX), default=None, metavar="EPS",
                   help="the attack's eps_l2: an L2 budget on [0, 1] images, e.g. 0.5, instead of the L-inf --eps "
                        "(apgd_ce, apgd_t, autoattack, fab_t; refused for an L-inf-only attack)")
    a.add_argument("--attack-target", choices=("transfer", "adaptive", "both"), default="transfer",
                   help="whom the attack attacks: zero-shot CLIP, scored on every method (transfer, R-TPT's protocol; "
                        "the default), each method's own prediction through its adaptation (adaptive), or both side "
                        "by side; a method that cannot be attacked adaptively is refused")
    a.add_argument("--eot", type=checks.int_in(1), default=1,
                   help="adaptive: draws of a method's random views averaged per attack gradient (default 1)")
    a.add_argument("--clean-and-robust", action="store_true",
                   help="score clean and adversarial images in one pass")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="evaluate methods on a dataset", description=__doc__)
    add_run_arguments(p)
    p.add_argument("--dry-run", action="store_true",
                   help="check the command line and --data as a run does, print the run's plan (each method's "
                        "config, views and precision; the views encoded; the attack) and exit without loading "
                        "a model")
    tracking.add_argument(p)
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    from ..engine.config import RunConfig
    classnames = None
    if args.classnames is not None:   # checked by `refusal` first (data_checks.read_classnames: one line)
        classnames = data_checks.read_classnames(args.classnames)
    attack = checks.attack_spec(args)
    pretrained = None if _random_weights(args) else args.pretrained
    methods = args.methods if isinstance(args.methods, list) else checks.method_names(args.methods)
    from ..datasets.specs import DATASETS
    dataset = DATASETS.canonical(args.dataset) if args.dataset in DATASETS else args.dataset  # R -> imagenet-r
    return RunConfig(dataset=dataset, data=str(args.data), model=args.model, pretrained=pretrained,
                     base_pretrained=getattr(args, "base_pretrained", None),
                     methods=list(methods), method_config=checks.method_config(args.method_config),
                     views=args.views, augmix=args.augmix, protocol=args.protocol, seed=args.seed,
                     model_seed=getattr(args, "model_seed", None),
                     limit=args.limit, out=str(args.out),
                     resume=args.resume, device=args.device, workers=args.workers, batch_size=args.batch_size,
                     order="shuffled" if args.order == "iid" else args.order,
                     delta=getattr(args, "delta", None), orders=getattr(args, "orders", 1), attack=attack,
                     clean_and_robust=args.clean_and_robust, attack_subset=getattr(args, "attack_subset", None),
                     attack_target=getattr(args, "attack_target", "transfer"), eot=getattr(args, "eot", 1),
                     classnames=classnames, progress=not args.no_progress,
                     online_checkpoint_seconds=args.online_checkpoint_seconds,
                     online_checkpoint_samples=getattr(args, "online_checkpoint_samples", 64), precision=args.precision,
                     cache_dir=args.cache_dir, download=args.download, trust_checkpoint=args.trust_checkpoint,
                     save_probs=getattr(args, "save_probs", False),
                     features=getattr(args, "features", None),
                     features_dtype=getattr(args, "features_dtype", "fp16"),
                     config_file=getattr(args, "config_file", None),
                     allow_partial=getattr(args, "allow_partial", False),
                     corruption=getattr(args, "corruption", None), severity=_single_severity(args),
                     ood=list(getattr(args, "ood", None) or []), ood_ratio=getattr(args, "ood_ratio", 1.0),
                     ood_seed=getattr(args, "ood_seed", None))


def _single_severity(args: argparse.Namespace) -> int:
    """--severity as one number (a suite over 'all' sets each entry's own; the config keeps the default)."""
    text = str(getattr(args, "severity", "5"))
    return int(text) if text.isdigit() else 5


def _checked_config(args: argparse.Namespace) -> RunConfig:
    """The config whose settings and data are checked: a corruption suite's is its first entry's."""
    cfg = config_from_args(args)
    if getattr(args, "suite", None) == "corruption":
        from ..datasets.corruptions import COMMON
        cfg.corruption = (args.corruptions or COMMON)[0]
    return cfg


def run_corruption_suite(args: argparse.Namespace) -> Suite:
    """--suite corruption: --dataset under each corruption (--corruptions; a stored set adds the extra ones it holds
    when none are named) at each severity (--severity, 'all' for 1..5)."""
    from ..datasets.corruptions import COMMON
    from ..datasets.suites import SuiteError, corruption_suite, parse_severities
    if getattr(args, "corruption", None):
        raise SuiteError("--suite corruption runs every corruption of --corruptions; leave out --corruption")
    corruptions = args.corruptions or COMMON
    if args.corruptions is None:
        corruptions = COMMON + tuple(c for c in _stored_extra(args) if c not in COMMON)
    return corruption_suite(args.dataset, corruptions, parse_severities(args.severity))


def _stored_extra(args: argparse.Namespace) -> list[str]:
    """The corruptions a stored corrupted --dataset holds under --data (none for other datasets)."""
    from ..datasets.base import DatasetError
    from ..datasets.build import expand_root, find_dataset_dir
    from ..datasets.corrupted import stored_corruptions
    from ..datasets.specs import DATASETS
    if args.dataset not in DATASETS or not DATASETS.get(args.dataset).corrupted:
        return []
    spec = DATASETS.get(args.dataset)
    try:
        directory = find_dataset_dir(spec.name, expand_root(args.data, spec.name))
    except DatasetError:
        return []
    return stored_corruptions(directory, "npy" if spec.layout == "npy" else "folders")


def _random_weights(args: argparse.Namespace) -> bool:
    return str(args.pretrained).lower() in ("none", "random")


def one_line(text: object) -> str:
    """A multi-line message (error + hint) as one line."""
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


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
    """A problem between flags that each parsed fine, or None: --model-seed without random weights, the
    attack's fields (`checks.attack_spec`), then the run's settings as the engine checks them
    (`engine.config.settings_problem`) on every dataset it will run. What the catalogues decide is said
    before torch is imported; the rest (a method given --set values) needs the method registry."""
    problem = flag_problem(args)
    if problem:
        return problem
    from ..engine.config import plan_or_problem
    args.run_plan, problem = plan_or_problem(_checked_config(args), dataset_names(args))   # handed to the run
    return problem


def flag_problem(args: argparse.Namespace) -> str | None:
    """The checks of `check_combination` that read only data (the method and attack catalogues): no torch."""
    if str(getattr(args, "severity", "5")) == "all" and getattr(args, "suite", None) != "corruption":
        return "--severity all runs every severity as a suite: add --suite corruption, or give one severity 1..5"
    if getattr(args, "corruptions", None) and getattr(args, "suite", None) != "corruption":
        return "--corruptions lists the corruptions of --suite corruption; for one run give --corruption NAME"
    from ..engine.shifts import shift_problem  # torch-free: corruption and --ood settings before any import
    problem = shift_problem(_checked_config(args))
    if problem:
        return problem
    if getattr(args, "model_seed", None) is not None and not _random_weights(args):
        return (f"--model-seed seeds random weights only (--pretrained none); --pretrained {args.pretrained} "
                "loads its weights from a checkpoint")
    problem = attack_problem(args)
    if problem:
        return problem
    from ..rundir.stream import stream_problem  # torch-free: a stream's flags are checked before any import
    problem = stream_problem(args.order, getattr(args, "delta", None), getattr(args, "orders", 1))
    if problem:
        return problem
    if args.order in ("continual", "mixed") and not (getattr(args, "suite", None) or getattr(args, "datasets", None)):
        return (f"--order {args.order} runs several datasets of one class list as one stream of domains: give "
                "them with --datasets a,b,... or --suite")
    from ..engine.config import catalogue_problem
    return catalogue_problem(config_from_args(args), dataset_names(args))


def refusal(args: argparse.Namespace) -> tuple[int, list[str]]:
    """(exit code, one line per problem) of a command line that cannot run, or (0, []): unknown dataset names
    and every flag the catalogues judge (2); a --data folder that does not exist and an unknown --model, all
    at once (1); what only the method registry can judge (2, torch imported). Unless a method's --set values
    need the registry, everything but the last is said before torch is imported. Every dataset (and OOD set)
    is listed here, before torch, with its folder's problems (a missing, empty or wrong-layout folder, a
    class-name count, too few OOD images) said at once; `prepare` then uses the datasets listed
    (`args.listed_datasets`). The weights are `engine.prepare`'s. These checks read the method catalogue five
    times: it is made once for them (`catalogue.read_once`)."""
    with catalogue.read_once():
        return _refusal(args)


def _refusal(args: argparse.Namespace) -> tuple[int, list[str]]:
    problem = classnames_problem(args) or unknown_dataset(args) or flag_problem(args)
    if problem:
        return 2, [problem]
    problem = data_checks.features_problem(getattr(args, "features", None), str(args.data),
                                           dataset_names(args) + list(getattr(args, "ood", None) or []))
    if problem:
        return 2, [problem]
    from ..engine.config import catalogue_undecided
    undecided = catalogue_undecided(config_from_args(args), dataset_names(args))
    problem = check_combination(args) if undecided else None   # the flags before the data, as ever
    if problem:
        return 2, [problem]
    # a local checkpoint under an unknown name goes to the loader, which says what the file holds
    local = Path(str(args.pretrained or "").removeprefix("file:") or ".").expanduser().is_file()
    model = None if local else (checks.unknown_model(args.model)
                                or pretrained_check.unknown_pretrained(args.model, args.pretrained))
    missing = missing_data(args)   # with a refusal anyway, every dataset's problem
    missing += [f"model: {model}"] if model else []
    if missing:
        return 1, missing
    problem = None if undecided else check_combination(args)
    return (2, [problem]) if problem else (0, [])


def stream_refusal(args: argparse.Namespace) -> str | None:
    """A dirichlet stream that cannot be drawn over the dataset's labels, as one line, or None: decided before
    torch is imported (the listing and the draws need neither torch nor the model), not after the model loads."""
    from ..rundir.stream import canonical_kind
    try:
        if canonical_kind(args.order) != "dirichlet":
            return None
    except ValueError:
        return None
    from ..engine.config import run_stream
    from ..engine.prepare import list_dataset
    cfg = _checked_config(args)
    dataset = (getattr(args, "listed_datasets", None) or {}).get(args.dataset)   # listed by `refusal` already
    if dataset is None:
        dataset, _ = list_dataset(cfg, args.dataset, classnames=cfg.classnames)
    if dataset is None:
        return None   # engine.prepare says what is wrong with the data
    if args_progress(args):
        print(f"shiftlab run: drawing the dirichlet stream over {len(dataset)} samples ...", file=sys.stderr,
              flush=True)
    try:
        run_stream(cfg, dataset)
    except ValueError as exc:
        return str(exc)
    return None


def missing_data(args: argparse.Namespace) -> list[str]:
    """One line per dataset that cannot be read from --data (unless --download is given: `engine.prepare`
    downloads what is missing), as `engine.prepare` says it: every dataset is listed with its shift (corruption,
    OOD sets) and the partial-dataset rule. The datasets listed are kept in `args.listed_datasets` for `prepare`.
    Reads the file system only, no torch."""
    args.listed_datasets = {}
    if getattr(args, "download", False):
        return []
    from ..engine.prepare import list_dataset
    cfg = _checked_config(args)
    names = dataset_names(args)
    problems, listed = [], {}
    command = f"shiftlab {getattr(args, 'command', None) or 'run'}"
    for name in names:
        if args_progress(args):
            from ..datasets.build import expand_root
            print(f"{command}: listing {name} under {expand_root(cfg.data, name)} ...", file=sys.stderr, flush=True)
        dataset, problem = list_dataset(cfg, name, classnames=cfg.classnames if len(names) == 1 else None)
        problems += [problem] if problem else []
        if dataset is not None and problem:   # a refused dataset's warnings (its empty classes) say why
            for warning in dataset.warnings:
                print(f"{command}: warning: {name}: {warning}", file=sys.stderr)
        elif dataset is not None:
            listed[name] = dataset
    args.listed_datasets = listed if not problems else {}
    return problems


def classnames_problem(args: argparse.Namespace) -> str | None:
    """A --classnames file that cannot serve (not UTF-8, empty, a name twice), as one line, or None."""
    if getattr(args, "classnames", None) is None:
        return None
    try:
        data_checks.read_classnames(args.classnames)
    except ValueError as exc:
        return str(exc)
    return None


def attack_problem(args: argparse.Namespace) -> str | None:
    """A refused attack field (`checks.attack_spec`) as one line, or None; read from the attack catalogue,
    so said before torch (or numpy) is imported."""
    try:
        checks.attack_spec(args)
    except ValueError as exc:
        return str(exc)
    return None


def _domains(cfg: RunConfig, suite: Any, datasets: dict, dataset: str) -> Any:
    """A suite as one stream of domains (--order continual|mixed): its datasets, or for the corruption suite
    --dataset under each of its corruptions (`engine.shifts.run_dataset`, as its own run would read it)."""
    import dataclasses

    from ..datasets.domains import SEPARATOR, domain_sequence
    from ..datasets.suites import parse_corruption_entry
    from ..engine.shifts import run_dataset
    if suite.kind != "corruption":
        return domain_sequence({name: datasets[name] for name in suite.datasets})
    parts = {}
    for entry in suite.datasets:
        corruption, severity = parse_corruption_entry(entry)
        parts[entry] = run_dataset(dataclasses.replace(cfg, dataset=dataset, corruption=corruption, severity=severity),
                                   datasets[dataset])
    return domain_sequence(parts, name=f"{dataset}:{SEPARATOR.join(parts)}")


def dataset_names(args: argparse.Namespace) -> list[str]:
    """The datasets this command evaluates: --dataset, or every dataset of --suite/--datasets (a corruption suite
    evaluates --dataset under each corruption)."""
    if getattr(args, "suite", None) == "corruption":
        return [args.dataset]
    if getattr(args, "suite", None) or getattr(args, "datasets", None):
        from ..datasets.suites import resolve_suite
        return list(resolve_suite(args.suite, args.datasets).datasets)
    return [args.dataset]


def args_progress(args: argparse.Namespace) -> bool:
    return not getattr(args, "no_progress", False) and sys.stderr.isatty()


def prepare(args: argparse.Namespace, method_models: bool = True, command: str = "shiftlab run"
            ) -> tuple[RunConfig, ClipModel, dict[str, FolderDataset]]:
    """`engine.prepare` on the command line's config and datasets: every problem at once, one line each
    (raises engine.prepare.CannotStart); set-up phases that take seconds say so on a terminal. Returns
    (config, model, {dataset name: dataset})."""
    from ..engine.prepare import prepare as prepare_run

    def say(msg: str) -> None:
        print(f"{command}: {msg}", file=sys.stderr, flush=True)

    def warn(msg: str) -> None:
        print(f"{command}: warning: {msg}", file=sys.stderr)

    cfg = config_from_args(args)
    listed = getattr(args, "listed_datasets", None) or {}   # listed by `refusal`, before torch
    for name, dataset in listed.items():
        for warning in dataset.warnings:
            warn(f"{name}: {warning}")
    prepared = prepare_run(_checked_config(args), dataset_names(args), method_models=method_models, warn=warn,
                           given=listed, say=say if args_progress(args) else (lambda msg: None),
                           plan=getattr(args, "run_plan", None))
    return cfg, prepared.model, prepared.datasets


def run(args: argparse.Namespace) -> int:
    problem = attack_problem(args)   # read from the attack catalogue: nothing heavy imported yet
    if problem:
        print(f"shiftlab run: error: {problem}", file=sys.stderr)
        return 2
    from ..datasets.suites import SuiteError, resolve_suite
    try:
        suite = resolve_suite(args.suite, args.datasets) if (args.suite or args.datasets) else None
        if suite is not None and suite.kind == "corruption":
            suite = run_corruption_suite(args)
    except SuiteError as exc:
        print(f"shiftlab run: error: {exc}", file=sys.stderr)
        return 2
    per_dataset = suite is not None and args.order not in ("continual", "mixed")   # OUT/<entry> run directories
    problem = tracking.check(args) or data_checks.out_problem(args, list(suite.datasets) if per_dataset else None)
    code, problems = (2, [problem]) if problem else refusal(args)   # the names, the flags, then --data: no torch
    if not code and suite is None:
        problem = stream_refusal(args)
        code, problems = (2, [problem]) if problem else (0, [])
    if code:
        for problem in problems:
            print(f"shiftlab run: error: {problem}", file=sys.stderr)
        return code
    plan = args.run_plan   # resolved once by the checks (`check_combination`)
    if getattr(args, "dry_run", False):
        print(plan.text())
        return 0
    if args_progress(args):   # torch alone takes seconds on a loaded CPU: never a silent start
        print("shiftlab run: loading torch and the methods ...", file=sys.stderr, flush=True)
    from ..datasets.base import DatasetError
    from ..engine import distributed
    from ..engine.loop import run as run_engine
    from ..engine.prepare import CannotStart
    from ..engine.suite import run_suite
    from ..results.suite_table import table_markdown
    distributed.context()  # under torchrun: process group, this rank's GPU and CPU threads before loading
    unused = plan.unused_settings() if plan is not None else None
    if unused and distributed.context().rank == 0:   # once, in the dry run's words
        print(f"shiftlab run: warning: {unused}", file=sys.stderr)
    try:
        try:
            cfg, model, datasets = prepare(args)
        except CannotStart as exc:
            for problem in exc.problems:
                print(f"shiftlab run: error: {problem}", file=sys.stderr)
            return 1
        try:
            if suite is not None and cfg.order in ("continual", "mixed"):   # one run over the datasets as domains
                sequence = _domains(cfg, suite, datasets, args.dataset)
                cfg.dataset = sequence.name
                summary = run_engine(cfg, model=model, dataset=sequence)
            elif suite is not None:
                table = run_suite(cfg, suite, model=model, datasets=datasets, plan=plan)
                if table and not cfg.progress:   # with progress, run_suite prints it
                    print(table_markdown(table))
                from ..results.suite_table import dataset_dir
                done = [dataset_dir(cfg.out, n) for n in suite.datasets if (dataset_dir(cfg.out, n) / "summary.json")
                        .is_file()]
                return tracking.log_after(args, cfg.out, done) if done and distributed.context().rank == 0 else 0
            else:
                if args_progress(args):
                    print(f"shiftlab run: building {len(cfg.methods)} method(s) and their class heads ...",
                          file=sys.stderr, flush=True)
                summary = run_engine(cfg, model=model, dataset=datasets[args.dataset], plan=plan)
        except (FileExistsError, KeyError, TypeError, ValueError, DatasetError) as exc:
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc   # no KeyError quotes
            print(f"shiftlab run: error: {one_line(message)}", file=sys.stderr)
            return 2
        table = Path(cfg.out) / "summary.md"
        if summary and not cfg.progress and table.is_file():   # the engine prints it with the progress bar
            print(table.read_text(), end="")
            if (Path(cfg.out) / "orders.md").is_file() and cfg.orders > 1:   # --orders K: the orders' table too
                print((Path(cfg.out) / "orders.md").read_text(), end="")
        if summary and distributed.context().rank == 0:
            return tracking.log_after(args, cfg.out)
    finally:
        distributed.shutdown()
    return 0
