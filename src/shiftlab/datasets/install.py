"""`download_dataset(name, root)`: make `build_dataset(name, root)` work by downloading (datasets/fetch.py),
verifying and extracting (datasets/extract.py) the dataset's archive, as its entry in datasets/specs.py
describes it.

- an existing valid dataset folder is returned as is; an archive already at ``<root>/<archive name>``
  is verified and used instead of downloading;
- the archive is extracted into a hidden staging folder next to the destination and renamed into
  place only after ``build_dataset`` accepted it, so a failure leaves no half-extracted dataset behind;
- a split-listed set's images go into its folder, which may already hold the split file (the split
  file itself is never downloaded).

Checksums: the dataset authors publish none, so ``DATASETS`` holds ``sha256=None``. After a download
whose checksum was unknown, ``<root>/<name>.sha256`` (sha256sum format plus a ``# size`` line)
records the digest, which is printed; later downloads of that dataset are verified against it. The
digest is recorded only once the archive was extracted and its dataset validated in full: a refused
(unsafe) or corrupt archive leaves no digest behind, and is deleted when we downloaded it (an archive
the user placed is never deleted), so the next attempt fetches and trusts only a good copy.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from .. import writes
from .base import DatasetError
from .build import build_dataset
from .corrupted import stored_corruptions
from .extract import extract_into
from .fetch import DownloadError, fetch_file
from .specs import DATASETS, DatasetSpec
from .splits import SplitFileMissing, build_split_dataset, split_images_in

__all__ = ["download_dataset"]


def _read_record(record: Path) -> tuple[str | None, int | None]:
    if not record.is_file():
        return None, None
    digest = nbytes = None
    for line in record.read_text(encoding="utf-8").splitlines():
        if line.startswith("# size"):
            nbytes = int(line.split()[2])
        elif line.strip() and not line.startswith("#"):
            digest = line.split()[0].lower()
    return digest, nbytes


def download_dataset(name: str, root: str | os.PathLike, *, url: str | None = None, sha256: str | None = None,
                     size: int | None = None, progress: bool = True, keep_archive: bool = False) -> Path:
    """Make ``build_dataset(name, root)`` work: download, verify and extract the archive if needed.

    Returns the dataset folder (``<root>/<name>`` for the archives we know). An existing valid folder
    is returned as is; an existing archive at ``<root>/<archive name>`` is used instead of downloading.
    The archive is deleted after a successful extraction unless ``keep_archive``.
    """
    if name not in DATASETS:
        raise DownloadError(f"unknown dataset {name!r}; known: {', '.join(sorted(DATASETS))}")
    spec = DATASETS[name]
    name = spec.name  # the canonical name for an alias
    if not spec.dirnames:
        raise DownloadError(f"{name} is a local folder layout; there is nothing to download")
    root = Path(root).expanduser()
    target = root / spec.dirnames[0]
    if spec.layout == "split":
        present = _split_dataset_present(name, root)
        if present is not None:
            return present
    for dirname in spec.dirnames if spec.layout != "split" else ():
        if (root / dirname).is_dir():
            try:
                return _validate(name, spec, root / dirname).root
            except DatasetError as exc:
                raise DownloadError(f"{root / dirname} exists but is not a complete {name} ({exc}); "
                                    f"move it away and rerun") from exc

    archive = root / (spec.archive_name or PurePosixPath(url or "").name or f"{name}.archive")
    url = url or spec.url
    if url is None and not archive.exists():
        raise DownloadError(spec.manual.format(archive=archive, target=target))
    writes.make_dirs(root)
    record = root / f"{name}.sha256"
    recorded_sha, recorded_size = _read_record(record)
    expected_sha = sha256 or spec.sha256 or recorded_sha
    expected_size = size if size is not None else (spec.size if spec.size is not None else recorded_size)
    hint = (f"\nIf this machine has no internet access, download {url} elsewhere and copy it to {archive} "
            f"(exact path), or extract it so that {target}/ holds the class folders; then rerun.")
    placed_by_user = archive.exists()
    _, digest, nbytes = fetch_file(url or archive.as_uri(), archive, sha256=expected_sha, size=expected_size,
                               progress=progress, hint=hint)
    try:
        _extract_and_publish(name, spec, archive, root, target)
    except DownloadError as exc:
        # Nothing about a refused or corrupt archive is kept as trusted: no digest is recorded, and an
        # archive we downloaded ourselves is deleted so that the next attempt fetches a fresh copy.
        if placed_by_user:
            raise
        writes.remove(archive)
        raise type(exc)(f"{exc} (the downloaded {archive.name} was deleted; no checksum was recorded)") from exc
    if expected_sha is None:  # only now: the archive was extracted and its dataset validated in full
        writes.write_file(record, f"{digest}  {archive.name}\n# size {nbytes} bytes\n")
        print(f"{name}: SHA-256 of {archive.name} ({nbytes} bytes) is {digest}\n"
              f"recorded in {record}; later downloads are verified against it "
              f"(compare it with a trusted copy if you can).")
    if not keep_archive:
        writes.remove(archive, missing_ok=False)
    return target


def _split_dataset_present(name: str, root: Path) -> Path | None:
    """The image folder of a split-listed set already under ``root``, or None when it has to be downloaded.

    Only the split file missing is not a reason to download (it does not come with the archive)."""
    try:
        return build_dataset(name, root).root
    except SplitFileMissing as exc:
        if split_images_in(DATASETS[name], root):
            raise DownloadError(str(exc)) from None
        return None
    except DatasetError:
        return None


def _publish_split(name: str, spec: DatasetSpec, staging: Path, root: Path, target: Path) -> None:
    """Validate a split-listed set extracted into ``staging`` and move its content into ``target``.

    ``target`` may exist already (holding the split file the user put there): each top-level entry is
    moved in, and an entry that exists there already is an error before anything is moved."""
    try:
        build_split_dataset(spec, staging, split_places=[target, root]).require_complete(0.0)
    except SplitFileMissing:
        if not split_images_in(spec, staging):
            raise DownloadError(f"{name}: the archive holds none of the image folders expected "
                                f"({', '.join(d for d in spec.split.image_dirs if d)})") from None
        print(f"{name}: images extracted to {target}; the run also needs CoOp's "
              f"{spec.split.split_file} there (see docs/DATA.md)")
    except DatasetError as exc:
        raise DownloadError(f"the archive does not contain a valid {name} test set: {exc}") from exc
    entries = sorted(staging.iterdir())
    clashes = [str(target / e.name) for e in entries if (target / e.name).exists()]
    if clashes:
        raise DownloadError(f"{name}: {', '.join(clashes)} exists already; move it away and rerun")
    writes.make_dirs(target)
    for entry in entries:
        writes.rename(entry, target / entry.name)


def _extract_and_publish(name: str, spec: DatasetSpec, archive: Path, root: Path, target: Path) -> None:
    """Extract ``archive`` into a hidden staging folder, validate the dataset, then rename it to ``target``."""
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.extract-", dir=root))
    try:
        extract_into(archive, staging)
        if spec.layout == "split":
            _publish_split(name, spec, staging, root, target)
            return
        inner = _dataset_folder_in(staging, spec)
        try:
            _validate(name, spec, inner)  # validate before publishing it under the final name
        except DatasetError as exc:
            raise DownloadError(f"{archive} does not contain a valid {name} dataset: {exc}") from exc
        os.chmod(inner, 0o755)
        writes.rename(inner, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _validate(name: str, spec: DatasetSpec, directory: Path):
    """`build_dataset` of the folder; for a stored corrupted set (one dataset per corruption and severity) its
    first corruption at severity 1, and DatasetError when it holds none."""
    if not spec.corrupted:
        return build_dataset(name, directory)
    held = stored_corruptions(directory, "npy" if spec.layout == "npy" else "folders")
    if not held:
        raise DatasetError(f"{directory} holds none of the corruptions of {name}")
    dataset = build_dataset(name, directory, corruption=held[0], severity=1)
    dataset.root = directory
    return dataset


def _dataset_folder_in(staging: Path, spec: DatasetSpec) -> Path:
    for dirname in (spec.archive_dir, *spec.dirnames):
        if dirname and (staging / dirname).is_dir():
            return staging / dirname
    subdirs = [p for p in staging.iterdir() if p.is_dir() and not p.name.startswith((".", "__MACOSX"))]
    return subdirs[0] if len(subdirs) == 1 else staging
