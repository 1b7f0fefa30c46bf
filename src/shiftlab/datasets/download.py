"""Resumable, verified downloads and safe archive extraction for the dataset archives.

Guarantees (each one exists because a 2 GB download fails in practice in exactly this way):
- a file appears under its final name only once complete and verified (``<dest>.part`` +
  ``os.replace``); an interrupted download keeps its ``.part`` and the next call resumes it with
  an HTTP Range request (a server answering 200 instead of 206 restarts it from zero);
- a size or SHA-256 mismatch deletes the ``.part`` (nothing corrupt stays around) and raises
  ``ChecksumError`` with expected vs actual;
- archive members with absolute paths or ``..`` components, links whose target is absolute or
  contains ``..`` (so no chain of links can leave the target), zip symlinks, and device files are
  refused before anything is written (tar additionally runs with ``filter="data"``);
- extraction goes to a temporary sibling folder that is renamed into place only after it
  succeeded (and, for datasets, after ``build_dataset`` accepted it), so a failure leaves no
  half-extracted dataset behind;
- no network -> ``DownloadError`` naming the URL and the exact path to put the file at.

Checksums: the dataset authors publish none, so ``DATASETS`` holds ``sha256=None``. After a download
whose checksum was unknown, ``<root>/<name>.sha256`` (sha256sum format plus a ``# size`` line)
records the digest, which is printed; later downloads of that dataset are verified against it. The
digest is recorded only once the archive was extracted and its dataset validated in full: a refused
(unsafe) or corrupt archive leaves no digest behind, and is deleted when we downloaded it (an archive
the user placed is never deleted), so the next attempt fetches and trusts only a good copy.
"""
from __future__ import annotations

import hashlib
import http.client
import os
import re
import shutil
import stat
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
import zlib
from pathlib import Path, PurePosixPath, PureWindowsPath

from tqdm.auto import tqdm

from .crossdataset import SplitFileMissing, build_split_dataset, dataset_dirs
from .folders import DATASETS, IMAGE_EXTENSIONS, DatasetError, build_dataset

__all__ = ["DownloadError", "ChecksumError", "UnsafeArchiveError", "download_file", "download_dataset", "safe_extract"]

_USER_AGENT = "shiftlab/0.1 (Python urllib)"
_TIMEOUT_S = 60


class DownloadError(RuntimeError):
    """A download could not be completed (network, HTTP error, manual step required)."""


class ChecksumError(DownloadError):
    """The downloaded bytes do not match the expected size or SHA-256."""


class UnsafeArchiveError(DownloadError):
    """An archive member would escape the target folder or is not a plain file/folder/internal link."""


# ----------------------------------------------------------------------------------------- download

def download_file(url: str, dest: str | os.PathLike, *, sha256: str | None = None, size: int | None = None,
                  progress: bool = True, chunk_size: int = 1 << 20) -> Path:
    """Download ``url`` to ``dest`` (resuming ``dest.part``), verify size/SHA-256 when given, return ``dest``.

    An existing ``dest`` is verified (when a checksum/size is given) and not downloaded again.
    """
    return _fetch(url, Path(dest), sha256=sha256, size=size, progress=progress, chunk_size=chunk_size)[0]


def _offline_hint(url: str, dest: Path) -> str:
    return (f"\nIf this machine has no internet access, download {url} elsewhere and copy it to "
            f"{dest} (exact path), then rerun.")


def _fetch(url: str, dest: Path, *, sha256: str | None, size: int | None, progress: bool,
           chunk_size: int = 1 << 20, hint: str | None = None) -> tuple[Path, str, int]:
    """``download_file`` that also returns (path, sha256 hex digest, size in bytes)."""
    hint = _offline_hint(url, dest) if hint is None else hint
    sha256 = sha256.lower() if sha256 else None
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        digest, nbytes = _hash_file(dest)
        _verify(dest, url, digest, nbytes, sha256, size, delete=False)
        return dest, digest, nbytes

    part = dest.with_name(dest.name + ".part")
    for _attempt in range(2):  # the second attempt restarts from zero after a refused resume
        start = part.stat().st_size if part.exists() else 0
        if size is not None and start > size:
            part.unlink()
            start = 0
        hasher = _hash_file(part, hashlib.sha256())[0] if start else hashlib.sha256()
        if size is not None and start == size:
            break  # a previous run got every byte but stopped before verifying
        headers = {"User-Agent": _USER_AGENT}
        if start:
            headers["Range"] = f"bytes={start}-"
        try:
            response = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=_TIMEOUT_S)
        except urllib.error.HTTPError as exc:
            if exc.code == 416 and start:  # Range Not Satisfiable: complete already, or a stale .part
                if _content_range_total(exc.headers.get("Content-Range")) == start:
                    break
                part.unlink()
                continue
            raise DownloadError(f"HTTP {exc.code} {exc.reason} for {url}" + hint) from exc
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise DownloadError(f"cannot download {url}: {reason}" + hint) from exc

        with response:
            status = getattr(response, "status", None) or 200  # file:// responses have no status
            if start and status == 206:
                if _content_range_start(response.headers.get("Content-Range")) != start:
                    part.unlink()  # the server sent a different range than asked: start over
                    continue
            elif start:
                start, hasher = 0, hashlib.sha256()  # Range ignored (200): the body is the whole file
            length = response.headers.get("Content-Length")
            expected_total = start + int(length) if length and length.isdigit() else size
            _stream(response, part, start, hasher, expected_total, url, progress, chunk_size)
        received = part.stat().st_size
        if expected_total is not None and received < expected_total:
            raise DownloadError(f"connection to {url} closed after {received} of {expected_total} bytes; "
                                f"rerun to resume from {part}")
        break
    else:
        raise DownloadError(f"{url}: the server refused to resume {part} twice; delete it and retry")

    digest, nbytes = hasher.hexdigest(), part.stat().st_size
    _verify(part, url, digest, nbytes, sha256, size, delete=True)
    os.replace(part, dest)
    return dest, digest, nbytes


def _stream(response, part: Path, start: int, hasher, total: int | None, url: str, progress: bool,
            chunk_size: int) -> None:
    with open(part, "ab" if start else "wb") as out, tqdm(
            total=total, initial=start, unit="B", unit_scale=True, unit_divisor=1024,
            desc=part.name.removesuffix(".part"), disable=not progress) as bar:
        try:
            while chunk := response.read(chunk_size):
                out.write(chunk)
                hasher.update(chunk)
                bar.update(len(chunk))
        except (OSError, http.client.HTTPException) as exc:
            raise DownloadError(f"download of {url} interrupted after {out.tell()} bytes ({exc}); "
                                f"rerun to resume from {part}") from exc
        out.flush()
        os.fsync(out.fileno())


def _content_range_start(value: str | None) -> int | None:
    match = re.match(r"bytes\s+(\d+)-", value or "")
    return int(match.group(1)) if match else None


def _content_range_total(value: str | None) -> int | None:
    match = re.search(r"/(\d+)\s*$", value or "")
    return int(match.group(1)) if match else None


def _hash_file(path: Path, hasher=None) -> tuple:
    """(hasher, size) when a hasher is given, else (hex digest, size)."""
    own = hasher is None
    hasher = hashlib.sha256() if own else hasher
    nbytes = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            hasher.update(block)
            nbytes += len(block)
    return (hasher.hexdigest() if own else hasher), nbytes


def _verify(path: Path, url: str, digest: str, nbytes: int, sha256: str | None, size: int | None, *,
            delete: bool) -> None:
    problems = []
    if size is not None and nbytes != size:
        problems.append(f"size: expected {size} bytes, got {nbytes}")
    if sha256 is not None and digest != sha256:
        problems.append(f"SHA-256: expected {sha256}, got {digest}")
    if not problems:
        return
    if delete:
        path.unlink(missing_ok=True)
        action = f"deleted {path}"
    else:
        action = f"delete {path} (or correct the expected checksum) and retry"
    raise ChecksumError(f"{path.name} from {url} is corrupt: {'; '.join(problems)}; {action}")


# -------------------------------------------------------------------------------------- extraction

def safe_extract(archive: str | os.PathLike, target_dir: str | os.PathLike) -> Path:
    """Extract a tar (any compression) or zip archive into ``target_dir``, which must not exist yet.

    Everything is extracted into a temporary sibling folder first and renamed to ``target_dir``
    only on success. Unsafe members raise ``UnsafeArchiveError`` before anything is written.
    """
    archive, target = Path(archive), Path(target_dir)
    if target.exists():
        raise FileExistsError(f"refusing to extract {archive} over existing {target}")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.extract-", dir=target.parent))
    try:
        _extract_into(archive, staging)
        os.chmod(staging, 0o755)  # mkdtemp's 0700 would make a shared data folder private
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _extract_into(archive: Path, directory: Path) -> None:
    with open(archive, "rb") as f:
        is_zip = f.read(4) in (b"PK\x03\x04", b"PK\x05\x06")
    try:
        if is_zip:
            _extract_zip(archive, directory)
        else:
            _extract_tar(archive, directory)
    except UnsafeArchiveError:
        raise
    except tarfile.FilterError as exc:
        raise UnsafeArchiveError(f"refusing to extract {archive}: {exc}") from exc
    except (tarfile.TarError, zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as exc:
        if isinstance(exc, OSError) and exc.errno is not None:
            raise  # disk full, permissions: a real OS problem, not a corrupt archive
        raise DownloadError(f"{archive} is not a readable tar/zip archive or is corrupt ({exc}); "
                            f"delete it and download it again") from exc


def _unsafe_name_reason(name: str) -> str | None:
    if name.startswith(("/", "\\")) or PureWindowsPath(name).drive:
        return "has an absolute path"
    if ".." in re.split(r"[\\/]", name):
        return "contains a '..' component"
    return None


def _link_reason(kind: str, link_target: str) -> str | None:
    # Stricter than "stays inside": any '..' is refused, because a lexical check cannot see that an
    # earlier symlink turned 'a/..' into a step outside; without '..' every link only descends.
    if link_target.startswith(("/", "\\")) or PureWindowsPath(link_target).drive:
        return f"is a {kind} with an absolute target ({link_target!r})"
    if ".." in re.split(r"[\\/]", link_target):
        return f"is a {kind} pointing outside the target ({link_target!r})"
    return None


def _extract_tar(archive: Path, directory: Path) -> None:
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        for member in members:
            reason = _unsafe_name_reason(member.name)
            if reason is None:
                if member.issym():
                    reason = _link_reason("symlink", member.linkname)
                elif member.islnk():
                    reason = _link_reason("hard link", member.linkname)
                elif not (member.isfile() or member.isdir()):
                    reason = "is a device file, FIFO or other special file"
            if reason:
                raise UnsafeArchiveError(f"refusing to extract {archive}: member {member.name!r} {reason}")
        # The "data" filter (Python >= 3.11.4) repeats the checks against the real filesystem.
        if hasattr(tarfile, "data_filter"):
            tar.extractall(directory, members=members, filter="data")
        else:
            tar.extractall(directory, members=members)


def _extract_zip(archive: Path, directory: Path) -> None:
    root = directory.resolve()
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        for info in infos:
            reason = _unsafe_name_reason(info.filename)
            if reason is None and stat.S_ISLNK(info.external_attr >> 16):
                reason = "is a symbolic link (not supported in zip archives)"
            if reason is None and not (root / info.filename).resolve().is_relative_to(root):
                reason = "resolves outside the target"
            if reason:
                raise UnsafeArchiveError(f"refusing to extract {archive}: member {info.filename!r} {reason}")
        for info in infos:
            out = root / info.filename
            if info.is_dir():
                out.mkdir(parents=True, exist_ok=True)
                continue
            out.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(out, "wb") as dst:  # zf.open checks the CRC as it reads
                shutil.copyfileobj(src, dst, 1 << 20)


# ---------------------------------------------------------------------------------------- datasets

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
                return build_dataset(name, root / dirname).root
            except DatasetError as exc:
                raise DownloadError(f"{root / dirname} exists but is not a complete {name} ({exc}); "
                                    f"move it away and rerun") from exc

    archive = root / (spec.archive_name or PurePosixPath(url or "").name or f"{name}.archive")
    url = url or spec.url
    if url is None and not archive.exists():
        raise DownloadError(spec.manual.format(archive=archive, target=target))
    root.mkdir(parents=True, exist_ok=True)
    record = root / f"{name}.sha256"
    recorded_sha, recorded_size = _read_record(record)
    expected_sha = sha256 or spec.sha256 or recorded_sha
    expected_size = size if size is not None else (spec.size if spec.size is not None else recorded_size)
    hint = (f"\nIf this machine has no internet access, download {url} elsewhere and copy it to {archive} "
            f"(exact path), or extract it so that {target}/ holds the class folders; then rerun.")
    placed_by_user = archive.exists()
    _, digest, nbytes = _fetch(url or archive.as_uri(), archive, sha256=expected_sha, size=expected_size,
                               progress=progress, hint=hint)
    try:
        _extract_and_publish(name, spec, archive, root, target)
    except DownloadError as exc:
        # Nothing about a refused or corrupt archive is kept as trusted: no digest is recorded, and an
        # archive we downloaded ourselves is deleted so that the next attempt fetches a fresh copy.
        if placed_by_user:
            raise
        archive.unlink(missing_ok=True)
        raise type(exc)(f"{exc} (the downloaded {archive.name} was deleted; no checksum was recorded)") from exc
    if expected_sha is None:  # only now: the archive was extracted and its dataset validated in full
        record.write_text(f"{digest}  {archive.name}\n# size {nbytes} bytes\n", encoding="utf-8")
        print(f"{name}: SHA-256 of {archive.name} ({nbytes} bytes) is {digest}\n"
              f"recorded in {record}; later downloads are verified against it "
              f"(compare it with a trusted copy if you can).")
    if not keep_archive:
        archive.unlink()
    return target


def _split_dataset_present(name: str, root: Path) -> Path | None:
    """The image folder of a split-listed set already under ``root``, or None when it has to be downloaded.

    Only the split file missing is not a reason to download (it does not come with the archive)."""
    try:
        return build_dataset(name, root).root
    except SplitFileMissing as exc:
        if _split_images_in(DATASETS[name], root):
            raise DownloadError(str(exc)) from None
        return None
    except DatasetError:
        return None


def _split_images_in(spec, folder: Path) -> bool:
    """Whether one of the set's candidate image folders under ``folder`` holds at least one image."""
    for base in dataset_dirs(spec, folder):
        for sub in spec.split.image_dirs:
            candidate = base / sub if sub else base
            if sub and candidate.is_dir():
                for _dirpath, _dirs, files in os.walk(candidate):
                    if any(os.path.splitext(f)[1].lower() in IMAGE_EXTENSIONS for f in files):
                        return True
    return False


def _publish_split(name: str, spec, staging: Path, root: Path, target: Path) -> None:
    """Validate a split-listed set extracted into ``staging`` and move its content into ``target``.

    ``target`` may exist already (holding the split file the user put there): each top-level entry is
    moved in, and an entry that exists there already is an error before anything is moved."""
    try:
        build_split_dataset(spec, staging, split_places=[target, root]).require_complete(0.0)
    except SplitFileMissing:
        if not _split_images_in(spec, staging):
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
    target.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        os.replace(entry, target / entry.name)


def _extract_and_publish(name: str, spec, archive: Path, root: Path, target: Path) -> None:
    """Extract ``archive`` into a hidden staging folder, validate the dataset, then rename it to ``target``."""
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.extract-", dir=root))
    try:
        _extract_into(archive, staging)
        if spec.layout == "split":
            _publish_split(name, spec, staging, root, target)
            return
        inner = _dataset_folder_in(staging, spec)
        try:
            build_dataset(name, inner)  # validate before publishing it under the final name
        except DatasetError as exc:
            raise DownloadError(f"{archive} does not contain a valid {name} dataset: {exc}") from exc
        os.chmod(inner, 0o755)
        os.replace(inner, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _dataset_folder_in(staging: Path, spec) -> Path:
    for dirname in (spec.archive_dir, *spec.dirnames):
        if dirname and (staging / dirname).is_dir():
            return staging / dirname
    subdirs = [p for p in staging.iterdir() if p.is_dir() and not p.name.startswith((".", "__MACOSX"))]
    return subdirs[0] if len(subdirs) == 1 else staging
