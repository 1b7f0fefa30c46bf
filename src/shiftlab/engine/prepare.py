"""`prepare(config)`: the one way a run starts, for `shiftlab run`, `encode`, `sweep`, suites and
`shiftlab.run` alike.

It lists every dataset (downloading the missing ones when `config.download`), loads the run's model
and the models its methods load themselves (RLCF's reward CLIP), and applies the partial-dataset
rule (more than 5% of a dataset's classes without images is refused unless `config.allow_partial`).
Every problem is collected, so one call says all of them at once (each dataset, the weights, every
method's own model), one line each, in the caller's spelling (`options.say`: `--download` on the
command line, `allow_download=True` in Python); then `CannotStart` is raised.

Nothing here touches a run directory: a refused run leaves no trace.
"""
from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .. import writes
from ..options import say as spell

if TYPE_CHECKING:
    from ..datasets.base import FolderDataset
    from ..models import ClipModel
    from .config import RunConfig
    from .run_plan import RunPlan

Say = Callable[[str], None]


class CannotStart(ValueError):
    """Data or weights are missing or unusable: `problems` holds one line per problem (each dataset,
    the model, every method's own model); the message is those lines."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = list(problems)


@dataclass
class Prepared:
    """What a run starts from: its model and every dataset it evaluates, by name."""
    model: ClipModel
    datasets: dict[str, FolderDataset] = field(default_factory=dict)


def one_line(text: object) -> str:
    """A multi-line message (error + hint) as one line."""
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


def _quiet(message: str) -> None:
    pass


def _warn_stderr(message: str) -> None:
    print(f"shiftlab: warning: {message}", file=sys.stderr)


def prepare(config: RunConfig, datasets: Sequence[str] | None = None, *, model: ClipModel | None = None,
            given: dict[str, FolderDataset] | None = None, method_models: bool = True,
            say: Say = _quiet, warn: Say = _warn_stderr, plan: RunPlan | None = None) -> Prepared:
    """List `datasets` (default: `config.dataset`), load the model (unless `model` is given) and, with
    `method_models`, the models the methods load themselves; `given` datasets (by name) are used as
    they are, their completeness being the caller's choice. Raises CannotStart with every problem.

    `say` hears what takes seconds on a CPU (an 80,000-file scan, an RN50 checkpoint); `warn` each
    dataset's warnings (empty classes, skipped files and links), said before any work. `plan`: the run's
    (`engine.run_plan`), which names the methods' own models; resolved here when not given."""
    from ..datasets.build import expand_root
    from ..models import ModelLoadError, load_run_model
    from .config import resolve_device

    names = list(datasets) if datasets is not None else [config.dataset]
    problems: list[str] = []
    built: dict[str, FolderDataset] = {}
    for name in names:
        if given and name in given:
            built[name] = given[name]
            continue
        say(f"listing {name} under {expand_root(config.data, name)} ...")
        dataset, problem = list_dataset(config, name, classnames=config.classnames if len(names) == 1 else None)
        if problem:
            problems.append(problem)
        if dataset is None:
            continue
        for warning in dataset.warnings:
            warn(f"{name}: {warning}")
        built[name] = dataset
    device_type = resolve_device(config.device).type if config.precision in ("fp16", "bf16") else "cuda"
    if device_type != "cuda":   # models.precision: the autocast precisions are CUDA's only
        warn(f"{spell('precision', config.precision)} is autocast on CUDA only: on {device_type} every computation "
             "runs in float32")
    if model is None:
        try:
            say(f"loading {config.model} ({config.pretrained or 'random weights'}) ...")
            model = load_run_model(config, resolve_device(config.device))
        except ModelLoadError as exc:
            problems.append(f"model: {one_line(exc)}")
        except OSError as exc:  # network failures inside open_clip's download
            problems.append(f"model: downloading {config.model}/{config.pretrained} failed ({one_line(exc)}); on a "
                            "machine without internet put the checkpoint in the cache or pass "
                            f"{spell('pretrained_file')}")
    if method_models:   # RLCF's reward model: refused here too, before any work
        problems += load_extra_models(config, names, say, plan)
    if problems:
        raise CannotStart(problems)
    assert model is not None
    return Prepared(model, built)


def list_dataset(config: RunConfig, name: str, classnames: list[str] | None = None
                 ) -> tuple[FolderDataset | None, str | None]:
    """(the dataset, None), or (None or the dataset, one line): dataset `name` under `config.data` (downloaded
    first when missing and `config.download`), with the partial-dataset rule unless `config.allow_partial`.
    Imports no torch: the CLI asks this of a missing --data before anything heavy is loaded."""
    import dataclasses

    from ..datasets.base import DatasetError
    from ..datasets.fetch import DownloadError
    from .shifts import run_dataset
    # with its corruption (a stored set's files, or generated) and its OOD images (engine/shifts.py)
    shifted = dataclasses.replace(config, dataset=name, classnames=classnames)
    try:
        dataset = run_dataset(shifted)
    except DatasetError as exc:
        if not config.download or getattr(exc, "dataset", name) != name:   # (an OOD set's: not this dataset's)
            hint = download_hint(name, config.data, exc)
            said = one_line(exc)
            if "shiftlab download" in hint:   # the advice once: the loader's own copy goes
                said = re.sub(r"; get them with: shiftlab download \S+ --root [^)]*\)", ")", said)
            return None, f"dataset {name}: {said}{hint}"
        try:
            dataset = _download_dataset(name, config.data, classnames, build=lambda: run_dataset(shifted))
        except (DownloadError, DatasetError, OSError) as dl_exc:
            return None, f"dataset {name}: {one_line(dl_exc)}"
    if not config.allow_partial:
        try:
            dataset.require_complete()
        except DatasetError as exc:
            return dataset, (f"dataset {name}: {one_line(exc)} -> complete the dataset, or pass "
                             f"{spell('allow_partial')} to run on the classes present (labels keep the full class "
                             "list)")
    return dataset, None


def load_extra_models(config: RunConfig, datasets: Sequence[str], say: Say = _quiet,
                      plan: RunPlan | None = None) -> list[str]:
    """Load the CLIPs the methods load themselves (`Method.extra_models`: RLCF's reward model, as the run's plan
    names them: `RunPlan.extra_models`), each once per process (`models.load_shared_model`, where the methods
    then find them), with the run's weight options and on the device the engine gives the run's model; returns
    one line per model that cannot be loaded."""
    import torch

    from ..models import ModelLoadError, load_shared_model
    from . import distributed
    from .config import resolve_device
    from .run_plan import resolve_plan
    if plan is None or not set(datasets) <= set(plan.datasets):
        plan = resolve_plan(config, datasets)
    wanted = plan.extra_models()
    device = resolve_device(config.device)
    dist = distributed.context()
    if dist.world_size > 1 and device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
    problems = []
    for (arch, pretrained, seed), (method, settings) in wanted.items():
        try:
            say(f"loading {arch} ({pretrained or 'random weights'}) for {method} ...")
            load_shared_model(arch, pretrained, device=device, seed=seed, cache_dir=config.cache_dir,
                              allow_download=config.download, trust_checkpoint=config.trust_checkpoint)
        except ModelLoadError as exc:
            problems.append(f"{method}: its model {arch} ({pretrained}): {one_line(exc)} (for {method}: {settings})")
        except OSError as exc:
            problems.append(f"{method}: downloading its model {arch}/{pretrained} failed ({one_line(exc)}); "
                            f"put the weights in the cache or choose others ({settings})")
    return problems


def download_hint(name: str, root: str, exc: Exception) -> str:
    """' -> run `shiftlab download ...`' only where that command can fetch what is missing: a known
    dataset with a download URL whose images (not only a split file) are missing."""
    from ..datasets.base import ClassNamesError
    from ..datasets.build import expand_root, layout_of, locate
    from ..datasets.specs import DATASETS
    from ..datasets.splits import SplitFileMissing
    if name not in DATASETS or isinstance(exc, (SplitFileMissing, ClassNamesError)) \
            or getattr(exc, "found_instead", None):
        return ""   # (a hub folder beside the missing one holds the dataset: nothing to download)
    if getattr(exc, "dataset", name) != name:   # about another dataset (the OOD sets): its own advice is in exc
        return ""
    folder = locate(name, expand_root(root, name)) or expand_root(root, name).expanduser()
    if folder.is_dir() and layout_of(name, folder) in ("webdataset shards", "Hugging Face parquet/arrow table"):
        return ""   # its files are there, in a layout shiftlab reads: what is wrong is in them, not missing
    spec = DATASETS.get(name)
    if not spec.url:
        return " (it cannot be downloaded automatically: see docs/DATA.md)" if spec.manual else ""
    return (f" -> run `shiftlab download {spec.name} --root {expand_root(root, spec.name)}` (or pass "
            f"{spell('download')}), see docs/DATA.md")


def _missing_dirs(path: Path) -> list[Path]:
    """`path` and its parents that do not exist yet, deepest first."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def _download_dataset(name: str, root: str, classnames: list[str] | None,
                      build: Callable[[], FolderDataset] | None = None) -> FolderDataset:
    """Download then build a dataset (`build`: how, default `build_dataset`); a failed download leaves no empty
    folders behind."""
    from ..datasets.build import build_dataset, expand_root
    from ..datasets.install import download_dataset
    root = str(expand_root(root, name))
    created = _missing_dirs(Path(root).expanduser())
    try:
        download_dataset(name, root)
        return build() if build is not None else build_dataset(name, root, classnames=classnames)
    except BaseException:
        for folder in created:   # deepest first; a folder holding a partial download stays
            try:
                writes.remove_dir(folder)
            except OSError:
                break
        raise
