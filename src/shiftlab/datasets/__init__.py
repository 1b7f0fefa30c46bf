"""Data layer: the ImageNet class table, folder datasets, and download + safe extraction."""
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
from .crossdataset import CROSS_DATASETS, SplitFileMissing, crossdataset_classnames
from .download import ChecksumError, DownloadError, UnsafeArchiveError, download_dataset, download_file, safe_extract
from .folders import (
                      DATASETS,
                      IMAGE_EXTENSIONS,
                      MAX_EMPTY_FRACTION,
                      DatasetError,
                      DatasetSpec,
                      FolderDataset,
                      build_dataset,
                      find_dataset_dir,
                      list_datasets,
)
from .names import classnames

__all__ = [
    "classnames", "dataset_templates",
    "CROSS_DATASETS", "SplitFileMissing", "crossdataset_classnames",
    "classnames_for_wnids", "imagenet_a_wnids", "imagenet_classes", "imagenet_classnames", "imagenet_r_wnids",
    "imagenet_wnids", "load_templates", "ChecksumError", "DownloadError", "UnsafeArchiveError",
    "download_dataset", "download_file", "safe_extract", "DATASETS", "IMAGE_EXTENSIONS", "DatasetError",
    "DatasetSpec", "FolderDataset", "MAX_EMPTY_FRACTION", "build_dataset", "find_dataset_dir", "list_datasets",
]
