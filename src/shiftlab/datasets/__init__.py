"""Data layer: every dataset's spec (specs.py), the one builder (build.py) and its loaders per layout
(folders, splits, shards, tables), class names, downloads (fetch, extract, install), suites.

The public names load on first use (PEP 562): a torch- and numpy-free module (a method's spec reading the
suites, the CLI's checks) imports a submodule without the loaders.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import IMAGE_EXTENSIONS, MAX_EMPTY_FRACTION, DatasetError, FolderDataset
    from .build import build_dataset, expand_root, find_dataset_dir
    from .classes import (
                          classnames_for_wnids,
                          dataset_templates,
                          imagenet_a_wnids,
                          imagenet_classes,
                          imagenet_classnames,
                          imagenet_r_wnids,
                          imagenet_wnids,
                          load_templates,
    )
    from .extract import UnsafeArchiveError, safe_extract
    from .fetch import ChecksumError, DownloadError, download_file
    from .install import download_dataset
    from .specs import DATASETS, DatasetSpec, SplitLayout, classnames, list_datasets
    from .splits import SplitFileMissing

# public name -> the module that defines it
_EXPORTS = {
    'IMAGE_EXTENSIONS': '.base',
    'MAX_EMPTY_FRACTION': '.base',
    'DatasetError': '.base',
    'FolderDataset': '.base',
    'build_dataset': '.build',
    'expand_root': '.build',
    'find_dataset_dir': '.build',
    'classnames_for_wnids': '.classes',
    'dataset_templates': '.classes',
    'imagenet_a_wnids': '.classes',
    'imagenet_classes': '.classes',
    'imagenet_classnames': '.classes',
    'imagenet_r_wnids': '.classes',
    'imagenet_wnids': '.classes',
    'load_templates': '.classes',
    'UnsafeArchiveError': '.extract',
    'safe_extract': '.extract',
    'ChecksumError': '.fetch',
    'DownloadError': '.fetch',
    'download_file': '.fetch',
    'download_dataset': '.install',
    'DATASETS': '.specs',
    'DatasetSpec': '.specs',
    'SplitLayout': '.specs',
    'classnames': '.specs',
    'list_datasets': '.specs',
    'SplitFileMissing': '.splits',
}

__all__ = [
    "classnames", "dataset_templates",
    "SplitFileMissing", "SplitLayout",
    "classnames_for_wnids", "imagenet_a_wnids", "imagenet_classes", "imagenet_classnames", "imagenet_r_wnids",
    "imagenet_wnids", "load_templates", "ChecksumError", "DownloadError", "UnsafeArchiveError",
    "download_dataset", "download_file", "safe_extract", "DATASETS", "IMAGE_EXTENSIONS", "DatasetError",
    "DatasetSpec", "FolderDataset", "MAX_EMPTY_FRACTION", "build_dataset", "expand_root", "find_dataset_dir",
    "list_datasets",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
