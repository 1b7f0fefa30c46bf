"""Resumable, verified HTTP downloads (``file://`` too).

Guarantees (each one exists because a 2 GB download fails in practice in exactly this way):
- a file appears under its final name only once complete and verified (``<dest>.part`` +
  ``os.replace``); an interrupted download keeps its ``.part`` and the next call resumes it with
  an HTTP Range request (a server answering 200 instead of 206 restarts it from zero);
- a size or SHA-256 mismatch deletes the ``.part`` (nothing corrupt stays around) and raises
  ``ChecksumError`` with expected vs actual;
- no network -> ``DownloadError`` naming the URL and the exact path to put the file at.
"""
from __future__ import annotations

import hashlib
import http.client
import os
import re
import urllib.error
import urllib.request
from pathlib import Path

from .. import writes

__all__ = ["DownloadError", "ChecksumError", "download_file", "fetch_file"]

_USER_AGENT = "shiftlab/0.1 (Python urllib)"
_TIMEOUT_S = 60


class DownloadError(RuntimeError):
    """A download could not be completed (network, HTTP error, manual step required)."""


class ChecksumError(DownloadError):
    """The downloaded bytes do not match the expected size or SHA-256."""


def download_file(url: str, dest: str | os.PathLike, *, sha256: str | None = None, size: int | None = None,
                  progress: bool = True, chunk_size: int = 1 << 20) -> Path:
    """Download ``url`` to ``dest`` (resuming ``dest.part``), verify size/SHA-256 when given, return ``dest``.

    An existing ``dest`` is verified (when a checksum/size is given) and not downloaded again.
    """
    return fetch_file(url, Path(dest), sha256=sha256, size=size, progress=progress, chunk_size=chunk_size)[0]


def _offline_hint(url: str, dest: Path) -> str:
    return (f"\nIf this machine has no internet access, download {url} elsewhere and copy it to "
            f"{dest} (exact path), then rerun.")


def fetch_file(url: str, dest: Path, *, sha256: str | None, size: int | None, progress: bool,
           chunk_size: int = 1 << 20, hint: str | None = None) -> tuple[Path, str, int]:
    """``download_file`` that also returns (path, sha256 hex digest, size in bytes)."""
    hint = _offline_hint(url, dest) if hint is None else hint
    sha256 = sha256.lower() if sha256 else None
    writes.make_dirs(dest.parent)
    if dest.exists():
        digest, nbytes = _hash_file(dest)
        _verify(dest, url, digest, nbytes, sha256, size, delete=False)
        return dest, digest, nbytes

    part = dest.with_name(dest.name + ".part")
    for _attempt in range(2):  # the second attempt restarts from zero after a refused resume
        start = part.stat().st_size if part.exists() else 0
        if size is not None and start > size:
            writes.remove(part)
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
                writes.remove(part)
                continue
            raise DownloadError(f"HTTP {exc.code} {exc.reason} for {url}" + hint) from exc
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise DownloadError(f"cannot download {url}: {reason}" + hint) from exc

        with response:
            status = getattr(response, "status", None) or 200  # file:// responses have no status
            if start and status == 206:
                if _content_range_start(response.headers.get("Content-Range")) != start:
                    writes.remove(part)  # the server sent a different range than asked: start over
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
    writes.rename(part, dest)
    return dest, digest, nbytes


def _stream(response, part: Path, start: int, hasher, total: int | None, url: str, progress: bool,
            chunk_size: int) -> None:
    from tqdm.auto import tqdm  # here: `shiftlab run` imports this module for its error types only
    then = f"then rerun to resume from {part}"
    with writes.AppendFile(part, then) as out, tqdm(
            total=total, initial=start, unit="B", unit_scale=True, unit_divisor=1024,
            desc=part.name.removesuffix(".part"), disable=not progress) as bar:
        if not start:
            out.cut(0)
        received = start
        while True:
            try:
                chunk = response.read(chunk_size)
            except (OSError, http.client.HTTPException) as exc:
                raise DownloadError(f"download of {url} interrupted after {received} bytes ({exc}); "
                                    f"rerun to resume from {part}") from exc
            if not chunk:
                break
            out.append(chunk)   # a full or read-only disk: writes.WriteError naming the .part file
            received += len(chunk)
            hasher.update(chunk)
            bar.update(len(chunk))
        out.sync()


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
        writes.remove(path)
        action = f"deleted {path}"
    else:
        action = f"delete {path} (or correct the expected checksum) and retry"
    raise ChecksumError(f"{path.name} from {url} is corrupt: {'; '.join(problems)}; {action}")
