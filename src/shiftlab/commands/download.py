"""``shiftlab download DATASET --root DIR``: fetch, verify and extract a dataset archive."""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence

from . import checks

DEFAULT_ROOT = "~/.cache/shiftlab/data"  # same default as the Makefile's DATA


class _Downloadable(Sequence):
    """The downloadable dataset names, looked up only when argparse needs them: building the parser
    for `shiftlab --help` must not import the dataset package (urllib, tqdm, ...)."""

    def _names(self) -> list[str]:
        from ..datasets.specs import DATASETS
        return sorted(name for name, spec in DATASETS.items() if spec.dirnames)

    def __getitem__(self, index):  # type: ignore[override]
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, name: object) -> bool:
        return name in self._names()


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    downloadable = _Downloadable()
    parser = subparsers.add_parser(
        "download", help="download, verify and extract a dataset",
        description="Download a dataset archive (resuming a partial download), verify its size/SHA-256, "
                    "extract it safely and check that the folder layout is complete. Datasets without a "
                    "public URL (imagenet-sketch, imagenet) print what to fetch by hand and where to put it. "
                    "See docs/DATA.md.")
    parser.add_argument("dataset", choices=downloadable, metavar="DATASET", help="one of: %(choices)s")
    parser.add_argument("--root", type=checks.folder_path, default=os.environ.get("SHIFTLAB_DATA", DEFAULT_ROOT),
                        help="data folder; the dataset lands in ROOT/imagenet-r (etc., see docs/DATA.md) "
                             "(default: $SHIFTLAB_DATA or %(default)s)")
    parser.add_argument("--url", help="download from this URL instead (http(s):// or file://)")
    parser.add_argument("--sha256", help="expected SHA-256 of the archive (hex)")
    parser.add_argument("--size", type=int, help="expected archive size in bytes")
    parser.add_argument("--keep-archive", action="store_true", help="keep the archive after extracting it")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from ..datasets.base import DatasetError
    from ..datasets.build import build_dataset
    from ..datasets.fetch import DownloadError
    from ..datasets.install import download_dataset
    try:
        path = download_dataset(args.dataset, args.root, url=args.url, sha256=args.sha256, size=args.size,
                                progress=not args.no_progress, keep_archive=args.keep_archive)
        dataset = build_dataset(args.dataset, path)
    except (DownloadError, DatasetError) as exc:
        print(f"shiftlab download: error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.dataset}: {len(dataset)} images in {dataset.num_classes} classes at {dataset.root}")
    for warning in dataset.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0
