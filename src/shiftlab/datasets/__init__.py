"""Data layer: every dataset's spec (specs.py), the one builder (build.py) and its loaders per layout
(folders, splits, shards, tables), class names, downloads (fetch, extract, install), suites."""
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

__all__ = [
    "classnames", "dataset_templates",
    "SplitFileMissing", "SplitLayout",
    "classnames_for_wnids", "imagenet_a_wnids", "imagenet_classes", "imagenet_classnames", "imagenet_r_wnids",
    "imagenet_wnids", "load_templates", "ChecksumError", "DownloadError", "UnsafeArchiveError",
    "download_dataset", "download_file", "safe_extract", "DATASETS", "IMAGE_EXTENSIONS", "DatasetError",
    "DatasetSpec", "FolderDataset", "MAX_EMPTY_FRACTION", "build_dataset", "expand_root", "find_dataset_dir",
    "list_datasets",
]
