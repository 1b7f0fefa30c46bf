"""`RunConfig`: everything a run is asked to do; the devices, workers and method list it resolves to."""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..methods.catalogue import listing as catalogue
from ..options import say, say_set
from ..params import check_config, param

if TYPE_CHECKING:   # torch is imported by what needs it: a RunConfig is made and checked without it
    import torch

    from . import distributed
    from .run_plan import RunPlan


@dataclass(repr=False)
class RunConfig:
    """Everything a run is asked to do: `shiftlab run`'s flags, one field each (the flag `--allow-partial`
    is the field `allow_partial`). A plain dataclass: `engine.run` copies it and never changes yours."""
    dataset: str = "imagenet-r"
    data: str = ""
    model: str = "RN50"
    pretrained: str | None = "openai"
    # the CLIP whose text tower completes a checkpoint holding only an image tower (FARE, TeCoA; models.load_model)
    base_pretrained: str | None = None
    cache_dir: str | None = None     # weights cache, download and trust: see models.load_model
    download: bool = False
    trust_checkpoint: bool = False
    # random weights' seed (pretrained None); None: `seed` (models.run_model_seed)
    model_seed: int | None = param(None, ge=0, le=2 ** 64 - 1)
    methods: list[str] = field(default_factory=lambda: ["zeroshot"])
    method_config: dict[str, dict[str, Any]] = field(default_factory=dict)
    # each method's views, text head and precision (shiftlab.methods.catalogue.protocols; DEFAULT_PROTOCOL)
    protocol: str = field(default_factory=catalogue.default_protocol)
    views: int | None = param(None, ge=1)   # views per image for every view-reading method (None: each method's recipe)
    augmix: bool = False             # AugMix on every view-reading method's augmented views (as --set M.views=...)
    seed: int = param(0, ge=0, le=2 ** 64 - 1)   # numpy's and torch's generators take [0, 2**64)
    limit: int | None = param(None, ge=1)
    out: str = "runs/run"
    resume: bool = False
    device: str = "auto"
    workers: int = param(-1, ge=-1)   # DataLoader workers; -1: auto (see resolve_workers)
    # samples per engine step (shared encoding, batched tuning) and, for a method that adapts on batches
    # (`MethodSpec.adapts_on_batches`), the batch B of the episodic-batch protocol (docs/PROTOCOLS.md)
    batch_size: int = param(8, ge=1)
    # the stream kind (shiftlab.rundir.stream): "shuffled" (i.i.d., seeded by `seed`; "iid" says the same),
    # "sorted", "class-sorted" or "dirichlet" (label shift of concentration `delta`)
    order: str = "shuffled"
    delta: float | None = None       # the dirichlet stream's concentration (RoTTA: 0.1; ImageNet-C runs 0.01)
    orders: int = 1                  # K seeded orders of the same samples (engine.orders; OGA's 100 runs)
    # the stream's seed (None: `seed`); `--orders` sets one per order
    stream_seed: int | None = param(None, ge=0, le=2 ** 64 - 1)
    # {"name": an attack, and any of its config fields}; the run fills the rest (shiftlab.attacks.attack_config)
    attack: dict[str, Any] = field(default_factory=lambda: {"name": "none"})
    clean_and_robust: bool = False
    # attack only a seeded subset of N of the stream's samples (`attack_subset_ids`; RobustBench runs AutoAttack on a
    # fixed 5,000-image subset of ImageNet for the same reason: cost); the clean setting still scores every sample
    attack_subset: int | None = param(None, ge=1)
    # whom the attack attacks (docs/ROBUSTNESS.md): zero-shot CLIP, scored on every method ("transfer", R-TPT's
    # protocol); each method's own prediction through its adaptation ("adaptive"); or both, side by side
    attack_target: str = param("transfer", choices=("transfer", "adaptive", "both"))
    eot: int = param(1, ge=1)        # adaptive: draws of a method's random views averaged per attack gradient
    classnames: list[str] | None = None
    progress: bool = True
    precision: str = "auto"          # auto: fp16 autocast on CUDA, float32 on CPU; fp32 | fp16 | bf16
    online_checkpoint_seconds: float = param(60.0, ge=0)   # online state + records checkpoint interval (0: every batch)
    # ... and at least every this many samples (docs/ONLINE.md: never more often than 10x a save's own time)
    online_checkpoint_samples: int = param(64, ge=1)
    save_probs: bool = False         # float16 probability vectors in probs/ (shiftlab.rundir.probs); kept on --resume
    features: str | None = None      # a feature store directory (shiftlab.rundir.feature_store): read, and fill
    # storage of new entries: fp16 (half the bytes, ~1e-3 off) | fp32 (exact)
    features_dtype: str = param("fp16", choices=("fp16", "fp32"))
    # `--config FILE`: {"path", "sha256", "values"} of the file the flags came from; recorded in run.json and
    # summary.json, never part of the run's identity (the flags it gave are)
    config_file: dict[str, Any] | None = None
    # shifts (engine/shifts.py, docs/PROTOCOLS.md): a common corruption (stored, or generated on the fly), and
    # open-set streams mixing OOD images in at `ood_ratio` OOD images per ID image, drawn by `ood_seed` (None: seed)
    corruption: str | None = None
    severity: int = param(5, ge=1, le=5)   # Hendrycks & Dietterich's 1..5; 5: CLIPTTA's default
    ood: list[str] = field(default_factory=list)
    ood_ratio: float = param(1.0, gt=0, le=10)   # datasets.openset.MAX_OOD_RATIO
    ood_seed: int | None = param(None, ge=0, le=2 ** 64 - 1)
    # run a dataset more than 5% of whose classes have no images (datasets.base.MAX_EMPTY_FRACTION)
    allow_partial: bool = False

    def __repr__(self) -> str:
        """The fields that say what runs (dataset, data, model, methods, out), then those set otherwise than
        their defaults: one readable line."""
        shown = ("dataset", "data", "model", "pretrained", "methods", "out")
        parts = [f"{name}={getattr(self, name)!r}" for name in shown]
        for f in dataclasses.fields(self):
            if f.name in shown:
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            if getattr(self, f.name) != default:
                parts.append(f"{f.name}={getattr(self, f.name)!r}")
        return f"RunConfig({', '.join(parts)})"

    def run_views(self) -> dict[str, Any]:
        """What --views and --augmix set on every view-reading method's recipe ({} when neither is given)."""
        return ({"n_views": self.views} if self.views is not None else {}) | ({"augmix": True} if self.augmix else {})

    def canonical_dataset(self) -> str | None:
        """The registry's name for `dataset` (the key of its per-dataset method settings); None if unknown."""
        from ..datasets.specs import DATASETS
        return DATASETS.canonical(self.dataset) if self.dataset in DATASETS else None

    def stream_seed_used(self) -> int:
        """The seed of this run's stream order (the views stay seeded by `seed`)."""
        return self.seed if self.stream_seed is None else self.stream_seed

    def settings(self) -> list[str]:
        from ..rundir import records
        return records.run_settings(self.attack, self.clean_and_robust, self.attack_target)


def check_run_config(config: object) -> RunConfig:
    """`config` with every field of the type its annotation says and in its declared range (`params.param`;
    paths given as `pathlib.Path` made strings), or a one-line ValueError / TypeError naming the field:
    what `engine.run`, `encode`, suites and `prepare` check before anything else."""
    if not isinstance(config, RunConfig):
        raise TypeError(f"config must be a shiftlab.RunConfig, got {type(config).__name__}")
    paths = {name: os.fspath(getattr(config, name)) for name in ("data", "out", "features", "cache_dir")
             if isinstance(getattr(config, name), os.PathLike)}
    config = dataclasses.replace(config, **paths) if paths else config
    methods = config.methods
    if isinstance(methods, str) or not isinstance(methods, (list, tuple)) or not methods \
            or not all(isinstance(n, str) for n in methods):
        raise TypeError(f"RunConfig.methods must be a non-empty list of method names (or ['all']), got {methods!r}")
    overrides = config.method_config
    if not isinstance(overrides, dict) or not all(isinstance(k, str) and isinstance(v, dict)
                                                  for k, v in overrides.items()):
        raise TypeError("RunConfig.method_config must be {method name: {field: value}}, got "
                        f"{overrides!r}"[:200])
    names = config.classnames
    if names is not None and (isinstance(names, str) or not isinstance(names, (list, tuple))
                              or not all(isinstance(n, str) for n in names)):
        raise TypeError(f"RunConfig.classnames must be None or a list of class names, got {type(names).__name__}")
    if isinstance(methods, tuple):
        config = dataclasses.replace(config, methods=list(methods))
    if isinstance(config.pretrained, str) and config.pretrained.strip().lower() in ("none", "random"):
        config = dataclasses.replace(config, pretrained=None)   # random weights, as --pretrained none and load_model
    return check_config("RunConfig", config)


def settings_problem(config: RunConfig, datasets: Sequence[str] | None = None) -> str | None:
    """The first reason a run of `config` cannot work, as one line, or None (`engine.run_plan.resolve_plan`'s
    PlanError: an attack config its attack refuses, a method whose effective config is refused on one of
    `datasets` (default: the run's), e.g. MTA under 4 views, ...).
    Until the method registry is imported, what the method catalogue can answer is answered from it first
    (`catalogue_problem`), so a refused command line never waits for torch."""
    return plan_or_problem(config, datasets)[1]


def plan_or_problem(config: RunConfig, datasets: Sequence[str] | None = None) -> tuple[RunPlan | None, str | None]:
    """(the run's plan, None) or (None, `settings_problem`'s line): what the CLI checks a command line with and
    then hands the run (`engine.run_plan.resolve_plan`)."""
    if "shiftlab.methods" not in sys.modules:   # the registry answers all of it once it is loaded anyway
        problem = catalogue_problem(config, datasets)
        if problem:
            return None, problem
    from .run_plan import PlanError, resolve_plan
    try:
        return resolve_plan(config, datasets), None
    except PlanError as exc:
        return None, str(exc)


def catalogue_problem(config: RunConfig, datasets: Sequence[str] | None = None) -> str | None:
    """What `settings_problem` refuses that the method catalogue (data, no torch) decides: a method that cannot
    run here, an attack subset without an attack, an adaptive attack a method cannot take, and a view count below
    a method's minimum where that minimum is the catalogue's (`catalogue_undecided` lists the methods where it is
    not)."""
    names = _catalogued_names(config)
    refused = [catalogue.refusal(n) for n in names if catalogue.refusal(n)]
    if refused:
        return refused[0]
    entries = {e["name"]: e for e in catalogue.entries() if e["name"] in names}
    if config.attack_subset is not None and (config.attack or {}).get("name", "none") == "none":
        return f"{say('attack_subset')} attacks a subset of the samples, but no attack is chosen: add {say('attack')}"
    from .attack_target import adaptive_problem, run_augmix_problem
    problem = (adaptive_problem(config, [n for n in names if n in entries])
               or run_augmix_problem(config, [n for n in names if n in entries and entries[n]["uses_views"]]))
    if problem:
        return problem
    from ..methods.catalogue.method_plan import left_out_of_all  # torch-free: a spec's config_problem
    for name in config.methods:   # named: a config a run cannot use (DiffTPT without its folder); "all" leaves it out
        problem = left_out_of_all(name, config.method_config, config.settings() != ["clean"], config.protocol,
                                  datasets or [config.dataset], config.precision, config.run_views()) \
            if name in entries else None
        if problem:
            return problem
    undecided = catalogue_undecided(config, datasets)
    for name in names:
        entry = entries.get(name)
        if config.views is None or entry is None or not entry["uses_views"] or name in undecided:
            continue
        needed = int(entry["min_views"])
        if config.views < needed:
            return (f"{name}: needs at least {needed} views (incl. the original), got {config.views}; raise "
                    f"{say('views')} or {say_set(name, 'views', needed)}")
    return None


def catalogue_undecided(config: RunConfig, datasets: Sequence[str] | None = None) -> list[str]:
    """The methods of `config` whose settings only the registry can check (it imports torch): those the
    catalogue does not list (a sweep's variants), those given method_config values, and those whose protocol
    (or, under `paper`, per-dataset values) sets fields their minimum view count may depend on. For the
    others the catalogue's facts (the defaults') are the whole check."""
    entries = {e["name"]: e for e in catalogue.entries()}
    undecided = []
    for name in _catalogued_names(config):
        entry = entries.get(name)
        if entry is None or (config.method_config or {}).get(name):
            undecided.append(name)
            continue
        sets = entry["protocols"].get(config.protocol, {}).get("sets")
        by_dataset = config.protocol == "paper" and any(d in entry["paper_datasets"]
                                                        for d in [*(datasets or []), config.dataset])
        if sets or by_dataset:
            undecided.append(name)
    return undecided


def _catalogued_names(config: RunConfig) -> list[str]:
    """The run's method names with "all" read from the catalogue, in order, once each."""
    known = catalogue.names()
    return list(dict.fromkeys(n for name in config.methods for n in (known if name == "all" else [name])))


def run_stream(config: RunConfig, dataset: Any) -> list[int]:
    """The sample ids of a run in stream order (its kind, delta and stream seed), cut at `limit`.

    With `orders` K > 1 every order holds the same samples: order 0's stream (the first of `order_seeds`) cut
    at `limit`, which order k (`stream_seed`, another of the seeds) puts in its own order of the same kind."""
    from ..rundir.stream import canonical_kind, order_seeds, stream_order
    labels = None if canonical_kind(config.order) in ("shuffled", "sorted") else [lab for _, lab in dataset.samples]
    domains = getattr(dataset, "domain_index", None)
    first = order_seeds(config.seed, config.orders)[0] if config.orders > 1 else config.stream_seed_used()
    order = stream_order(len(dataset), config.order, first, labels=labels, delta=config.delta, domains=domains)
    order = order if config.limit is None else order[:config.limit]
    if config.stream_seed_used() == first:
        return order
    again = stream_order(len(order), config.order, config.stream_seed_used(),
                         labels=None if labels is None else [labels[i] for i in order], delta=config.delta,
                         domains=None if domains is None else [domains[i] for i in order])
    return [order[j] for j in again]


def resolve_device(device: str) -> torch.device:
    import torch
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device: {device!r} is not a device; use auto, cpu, cuda, cuda:N or mps") from None


def resolve_workers(workers: int, device: torch.device, dist: distributed.DistContext | None = None) -> int:
    """-1 -> on CUDA most of this process's share of the CPU cores (decoding and 64 crops per image
    must keep a GPU fed); on CPU one worker, leaving the cores to the model."""
    if workers >= 0:
        return workers
    import os
    per_process = (os.cpu_count() or 2) // max(1, getattr(dist, "local_world_size", 1))
    return max(1, min(16, per_process - 1)) if device.type == "cuda" else 1


def expand_methods(names: Sequence[str], model: str | None = None,
                   method_config: Mapping[str, Any] | None = None, attacked: bool = False,
                   run: RunConfig | None = None, datasets: Sequence[str] | None = None) -> list[str]:
    """Method names with "all" expanded, in registry order, each once. Where `model`'s name tells its image tower,
    "all" leaves out the methods bound to another tower (their spec's `towers`), and those whose effective config
    (under `method_config`; `run`'s protocol, views and precision on each of `datasets`, default its dataset) a run
    (`attacked`: with an attacked setting) cannot use (`left_out_of_all`: DiffTPT without its folder, DMN-ZS
    without its CuPL file under --protocol paper), saying so in one logged line each, in the dry run's words
    (`RunPlan.text`); a method named explicitly stays (and is refused in one line: `settings_problem`)."""
    from ..methods.base import get_method_class, list_methods
    from ..methods.catalogue.declarations import spec, tower_of_name
    from ..methods.catalogue.method_plan import left_out_of_all
    tower = tower_of_name(model) if model else None
    every = list_methods()
    fitting = [n for n in every if tower is None or tower in spec(n).towers]
    if "all" in names and len(fitting) < len(every):
        logging.getLogger(__name__).warning("methods 'all' leaves out %s (another image tower only)",   # as the plan
                                            ", ".join(n for n in every if n not in fitting))
    if "all" in names:
        for n in list(fitting):
            reason = (left_out_of_all(n, method_config, attacked) if run is None else
                      left_out_of_all(n, method_config, attacked, run.protocol, datasets or [run.dataset],
                                      run.precision, run.run_views()))
            if reason:
                fitting.remove(n)
                logging.getLogger(__name__).warning("methods 'all' leaves out %s (%s)", n, reason)
    out: list[str] = []
    for name in names:
        for n in (fitting if name == "all" else [name]):
            get_method_class(n)
            if n not in out:
                out.append(n)
    return out
