"""The dataset a run reads once its shift settings are applied (docs/PROTOCOLS.md):

- ``corruption``/``severity`` on a stored corrupted set (ImageNet-C, CIFAR-10-C/100-C) pick its files; on any
  other dataset the images are corrupted on the fly (`datasets.corrupted.CorruptedDataset`, seeded per sample by
  the run's seed);
- ``ood`` (with ``ood_ratio``, ``ood_seed``) mixes the OOD sets' images into the stream
  (`datasets.openset.OpenSetDataset`).

`run_dataset(config, given)` is the one place that does it: `engine.loop.run`, `shiftlab encode` and the CLI's
checks before any work all call it, so the run, its run.json and its feature-store keys agree.
"""
from __future__ import annotations

import importlib.util
from typing import Any

from ..options import name_of, say

# `config` below is an engine.config.RunConfig; not imported here: engine.config asks `shift_problem`
RunConfig = Any

__all__ = ["run_dataset", "shift_problem", "ood_seed"]


def ood_seed(config: RunConfig) -> int:
    return config.seed if config.ood_seed is None else config.ood_seed


def shift_problem(config: RunConfig) -> str | None:
    """A shift setting that cannot run, as one line, or None (no file is read)."""
    from ..datasets.base import DatasetError
    from ..datasets.corruptions import check_corruption
    from ..datasets.openset import MAX_OOD_RATIO
    from ..datasets.specs import DATASETS
    if isinstance(config.severity, bool) or config.severity not in (1, 2, 3, 4, 5):
        return f"severity must be one of 1..5 (Hendrycks & Dietterich's), got {config.severity!r}"
    if config.corruption is not None:
        try:
            check_corruption(config.corruption, config.severity)
        except ValueError as exc:
            return f"{name_of('corruption')}: {exc}"
        stored = config.dataset in DATASETS and DATASETS.get(config.dataset).corrupted
        if not stored and importlib.util.find_spec("imagecorruptions") is None:
            return (f"{say('corruption', config.corruption)} on {config.dataset} is generated with the "
                    "imagecorruptions package, which is not installed: pip install 'shiftlab[corruptions]'")
    elif config.dataset in DATASETS and DATASETS.get(config.dataset).corrupted:
        return (f"{DATASETS.canonical(config.dataset)} holds one dataset per corruption and severity: choose one "
                f"with {say('corruption', 'NAME')} {say('severity', '1..5')}, or run them all with "
                f"{say('suite', 'corruption')}")
    if config.dataset in DATASETS and DATASETS.get(config.dataset).layout == "images":
        return (f"{DATASETS.canonical(config.dataset)} has no classes: it is an out-of-distribution set, "
                f"mixed into another dataset's stream with {say('ood', DATASETS.canonical(config.dataset))}")
    if config.ood:
        if not (0 < config.ood_ratio <= MAX_OOD_RATIO):
            return (f"{name_of('ood_ratio')} must be in (0, {MAX_OOD_RATIO:g}] (OOD images per ID image), "
                    f"got {config.ood_ratio!r}")
        for name in config.ood:
            try:
                canonical = DATASETS.canonical(name)
            except DatasetError as exc:
                return f"{say('ood', name)}: {exc}"
            if config.dataset in DATASETS and canonical == DATASETS.canonical(config.dataset):
                return f"{say('ood', name)}: the OOD set is the in-distribution dataset itself"
        if len(set(config.ood)) != len(config.ood):
            return f"{name_of('ood')} lists a dataset twice: {','.join(config.ood)}"
        if str(config.order) in ("class-sorted", "dirichlet"):
            return (f"{name_of('ood')} with {say('order', config.order)}: a label-ordered stream needs every "
                    "sample's class, and OOD images have none; use a shuffled or sorted stream")
        if (config.attack or {}).get("name", "none") != "none":
            return (f"{name_of('ood')} with {name_of('attack')}: the attacks need every sample's true label, and "
                    "OOD images have none; run the open-set stream clean")
    return None


def run_dataset(config: RunConfig, given: Any = None) -> Any:
    """The dataset a run of `config` reads: `given` (the CLI built it) or the dataset built from `config.data`,
    then its corruption and its OOD images. Raises DatasetError (a file problem) or ValueError (a setting)."""
    from ..datasets.build import build_dataset
    from ..datasets.corrupted import CorruptedDataset
    from ..datasets.openset import OpenSetDataset
    from ..datasets.specs import DATASETS
    if getattr(given, "domain_info", None) is not None:   # a stream of domains (--order continual|mixed) carries
        return given                                      # each domain's own shift (datasets.domains)
    problem = shift_problem(config)
    if problem:
        raise ValueError(problem)
    stored = config.dataset in DATASETS and DATASETS.get(config.dataset).corrupted
    want_corruption = ({"name": config.corruption, "severity": config.severity} if config.corruption else None)
    dataset = given
    if dataset is not None and _corruption_of(dataset) not in (None, want_corruption):
        # built for another corruption (a suite's other entry): its clean base, or this one built from the files
        dataset = dataset.base if isinstance(dataset, CorruptedDataset) else None
    if dataset is not None and getattr(dataset, "open_set_info", None) is not None and not config.ood:
        dataset = None
    if dataset is None:
        dataset = build_dataset(config.dataset, config.data, classnames=config.classnames,
                                corruption=config.corruption if stored else None,
                                severity=config.severity if stored else None)
    if config.ood and getattr(dataset, "open_set_info", None) is None:
        from ..datasets.base import DatasetError
        ood = {}
        try:
            for name in config.ood:
                ood[DATASETS.canonical(name)] = build_dataset(name, config.data)
            dataset = OpenSetDataset(dataset, ood, config.ood_ratio, ood_seed(config))
        except DatasetError as exc:   # about the OOD sets: advice for the run's own dataset would mislead
            exc.dataset = name_of("ood")
            raise
    if config.corruption and not stored and _corruption_of(dataset) is None:
        dataset = CorruptedDataset(dataset, config.corruption, config.severity, config.seed)
    return dataset


def _corruption_of(dataset: Any) -> dict | None:
    info = getattr(dataset, "corruption_info", None)
    return {"name": info["name"], "severity": info["severity"]} if isinstance(info, dict) else None
