"""Shared pieces of the online methods (TDA, DMN-ZS): text head, view prefix, state checks.

Online methods keep a memory of earlier test samples' features keyed by pseudo-labels and
are fed one sample at a time in stream order (docs/ONLINE.md). Tie-breaking is deterministic
everywhere: stable sorts (ties keep the lower view or the older entry first), argmax returns
the lowest class index.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from ..models.text import load_descriptions
from .base import Method
from .context import SampleContext

STATE_VERSION = 1


def text_head(method: Method) -> torch.Tensor:
    """The (C, D) class head named by the method's `text_head` config field; the config's `templates`,
    when set (the dataset's own, `--protocol paper`), replace CLIP's 80 in "ensemble" and the 7
    Tip-Adapter templates in "tip_cupl"."""
    head = method.config.text_head
    if head == "ensemble":
        templates = getattr(method.config, "templates", None)
        return method.heads.templated(templates) if templates else method.heads.ensemble
    if head == "zeroshot":
        return method.heads.zeroshot
    if head == "tip_cupl" and hasattr(method.config, "cupl_file"):
        return method.heads.tip_cupl(check_cupl_file(method), f"{method.name}.cupl_file",
                                     getattr(method.config, "templates", None))
    allowed = "'ensemble', 'zeroshot'" + (" or 'tip_cupl'" if hasattr(method.config, "cupl_file") else "")
    raise ValueError(f"{method.name}: text_head must be {allowed}, got {head!r}")


def check_cupl_file(method: Method) -> str:
    """The method's `cupl_file` when its text head needs one (one-line ValueError when it is not set)."""
    return _cupl_path(method.name, method.config)


def _cupl_path(name: str, config: object) -> str:
    path = config.cupl_file
    if not path:
        raise ValueError(f"{name}.cupl_file: text_head 'tip_cupl' needs CuPL's class descriptions (a JSON "
                         f"file, class name -> sentences, not shipped): pass --set {name}.cupl_file=PATH "
                         f"(or --set {name}.text_head=ensemble)")
    if os.path.isdir(os.path.expanduser(path)):   # dataset_cupl_file picks the file when the run has a dataset
        raise ValueError(f"{name}.cupl_file: {path!r} is a directory; the run's dataset picks the file in it "
                         f"(shiftlab run --dataset/--suite), without one pass the file itself")
    return path


def check_descriptions(name: str, config: object, classnames: Sequence[str] | None) -> None:
    """Refuse (one line) a `tip_cupl` head whose CuPL file is unset, missing, or lacks a class of
    `classnames` (None: only the file's path is checked): before any work, not at the first sample."""
    if getattr(config, "text_head", None) != "tip_cupl" or not hasattr(config, "cupl_file"):
        return
    path = _cupl_path(name, config)
    if classnames is not None:
        load_descriptions(path, classnames, f"{name}.cupl_file")


def dataset_cupl_file(path: str, dataset: str, field: str = "cupl_file") -> str:
    """`path` when it is a file; when it is a directory of CuPL's per-dataset files, the one DMN's code
    reads on `dataset` (its `ID_to_gptprompts_path` names, data/method_settings.json "cupl_files"). A
    one-line ValueError naming the directory, the dataset and the expected file when that is missing."""
    from ..datasets.settings import cupl_file_name
    from ..datasets.specs import DATASETS
    if not os.path.isdir(os.path.expanduser(path)):
        return path
    expected = cupl_file_name(dataset) if dataset in DATASETS else None
    if expected is None:
        raise ValueError(f"{field}: {path!r} is a directory of CuPL files, but DMN names none for dataset "
                         f"{dataset!r}: pass the file itself (class name -> sentences)")
    chosen = os.path.join(path, expected)
    if not os.path.isfile(os.path.expanduser(chosen)):
        raise ValueError(f"{field}: directory {path!r} has no CuPL file for dataset {dataset!r} "
                         f"(expected {expected})")
    return chosen


def first_views(ctx: SampleContext, n_views: int | None) -> torch.Tensor:
    """(N, D) features of the first `n_views` views (all with None); the engine and `predict` hand a
    method only its recipe's views already, this keeps a hand-built longer context correct too."""
    feats = ctx.image_features
    return feats if n_views is None else feats[:n_views]


def check_state(name: str, state: dict, num_classes: int) -> None:
    """Refuse an online state saved by another version or for another class count."""
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"{name}: unsupported state version {state.get('version')!r}")
    if state.get("num_classes") != num_classes:
        raise ValueError(f"{name}: state was saved for {state.get('num_classes')} classes, this run has {num_classes}")
