"""Safe archive extraction (tar of any compression, zip).

- archive members with absolute paths or ``..`` components, links whose target is absolute or
  contains ``..`` (so no chain of links can leave the target), zip symlinks, and device files are
  refused before anything is written (tar additionally runs with ``filter="data"``);
- extraction goes to a temporary sibling folder that is renamed into place only after it
  succeeded, so a failure leaves no half-extracted folder behind.
"""
from __future__ import annotations

import os
import re
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from pathlib import Path, PureWindowsPath

from .. import writes
from .fetch import DownloadError

__all__ = ["UnsafeArchiveError", "safe_extract", "extract_into"]


class UnsafeArchiveError(DownloadError):
    """An archive member would escape the target folder or is not a plain file/folder/internal link."""


def safe_extract(archive: str | os.PathLike, target_dir: str | os.PathLike) -> Path:
    """Extract a tar (any compression) or zip archive into ``target_dir``, which must not exist yet.

    Everything is extracted into a temporary sibling folder first and renamed to ``target_dir``
    only on success. Unsafe members raise ``UnsafeArchiveError`` before anything is written.
    """
    archive, target = Path(archive), Path(target_dir)
    if target.exists():
        raise FileExistsError(f"refusing to extract {archive} over existing {target}")
    writes.make_dirs(target.parent)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.extract-", dir=target.parent))
    try:
        extract_into(archive, staging)
        os.chmod(staging, 0o755)  # mkdtemp's 0700 would make a shared data folder private
        writes.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def extract_into(archive: Path, directory: Path) -> None:
    """Extract ``archive`` into the existing ``directory`` after checking every member (no staging: the
    caller's own staging folder is ``directory``)."""
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
        if isinstance(exc, OSError) and exc.errno is not None:   # disk full, permissions: not a corrupt archive
            raise writes.error(exc.filename or directory, exc, "then rerun: the archive is kept") from None
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
                writes.make_dirs(out)
                continue
            writes.make_dirs(out.parent)
            # into the caller's staging folder, published whole: no temporary per member
            with zf.open(info) as src, writes.AppendFile(out) as dst:  # zf.open checks the CRC as it reads
                while block := src.read(1 << 20):
                    dst.append(block)
