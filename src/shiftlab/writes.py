"""Every byte shiftlab writes to disk goes through this module: one write path, one failure rule.

- `write_file(path, data)`: a file replaced whole (run.json, summaries, online state, feature shards and
  their indexes, head cache, tables, report files) is written to a temporary name beside it, fsynced and
  renamed over it, so a reader sees the old file or the new one, never a part.
- `AppendFile(path)`: a file grown in place (records.jsonl, probs/, the quarantine): each `append` is one
  write, flushed to the kernel at once (`sync` adds an fsync), and `cut(size)` truncates a torn tail.
- `make_dirs`, `remove`, `LockFile` (the `flock` file of a run directory or a feature store).
- Any failure (an OSError of any errno, or the RuntimeError torch's zip writer raises when it writes a
  file itself: `guard`) becomes a `WriteError`: an OSError whose message is one line naming the file,
  the reason (the OS's words: "Read-only file system", "No space left on device", "Permission denied",
  "Input/output error") and what to do (`advice`, given by the owner of the file: a run directory says
  that the records written so far are kept and a resume continues; a feature store that the run's
  records are safe and the store can be dropped).
- A temporary is named `<name>~<host>~<pid>.shiftlab-tmp`; a write that fails removes its own, and
  `clean_orphans(folder)` (called where a writer opens its folder: the run lock, the feature store
  writer, the head cache) removes those whose process is gone (same host, pid no longer alive), e.g.
  after a kill -9 or a failure that could not even delete its temporary.

The OS calls themselves are the small functions `_open`, `_write`, `_fsync`, `_rename`, `_truncate`,
`_mkdir`, `_unlink` and `_rmdir`: the fault-injection tests (tests/test_write_faults.py) wrap them to make the N-th
call fail with EROFS, ENOSPC or EIO, the way SQLite tests its I/O error paths. tests/test_writes.py greps
src/ so that no other module writes a file by itself. It imports only `options` (a leaf: the advice's
spelling), so every layer can use it.
"""
from __future__ import annotations

import contextlib
import errno
import os
import socket
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .options import say

TMP_SUFFIX = ".shiftlab-tmp"


def resume_advice() -> str:
    """What a run directory's writer says to do after a failed write, in the caller's spelling (`--resume` under
    the CLI, `resume=True` in Python): built when the error is, never at import."""
    return f"then rerun with {say('resume')}: the records written so far are kept"


def __getattr__(name: str) -> str:
    # `writes.RESUME_ADVICE`, read when the error is built, so it speaks the caller's spelling too
    if name == "RESUME_ADVICE":
        return resume_advice()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

_HOST = socket.gethostname().replace("~", "-")
_in_progress: set[str] = set()   # this process's temporaries being written (never orphans)


class WriteError(OSError):
    """A file could not be written: `str()` is one line naming the file, the reason and what to do.
    `errno` and `filename` are the failure's; `advice` what the owner of the file says to do."""

    def __init__(self, err: int | None, reason: str, filename: str, advice: str = ""):
        super().__init__(err, reason, filename)
        self.advice = advice

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}" + (f" ({self.advice})" if self.advice else "")

    def __reduce__(self):   # picklable (torchrun's collectives, DataLoader workers)
        return (type(self), (self.errno, self.strerror, self.filename, self.advice))


def what_to_do(err: int | None, then: str = "") -> str:
    """The first step for an errno (free space, make the folder writable, check the disk), then `then`."""
    if err in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        first = "free some space"
    elif err in (errno.EROFS, errno.EACCES, errno.EPERM):
        first = "make the folder writable or choose a writable one"
    elif err == errno.EIO:
        first = "check the disk"
    else:
        first = ""
    return "; ".join(p for p in (first, then) if p)


def error(path: str | os.PathLike, exc: BaseException, then: str = "") -> WriteError:
    """`exc` (an OSError, or torch's RuntimeError for a failed write) while writing `path` -> WriteError.
    A failed write() on an open file carries no file name, so the file is always `path`'s."""
    if isinstance(exc, WriteError):
        return exc
    if isinstance(exc, OSError):
        err, reason = exc.errno, exc.strerror or str(exc) or type(exc).__name__
    else:   # torch.save's "[enforce fail at inline_container.cc:...] ... errno 30 ...": keep its errno
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        err = next((e for e in (errno.EROFS, errno.ENOSPC, errno.EACCES, errno.EIO, errno.EDQUOT)
                    if f"errno {e} " in text or os.strerror(e) in text),
                   errno.ENOENT if "does not exist" in text else errno.EIO)
        reason = os.strerror(err)
    return WriteError(err, reason, str(path), what_to_do(err, then))


@contextmanager
def guard(path: str | os.PathLike, then: str = "") -> Iterator[None]:
    """Turn what a third-party writer raises while writing `path` (OSError; torch's RuntimeError from
    its zip writer) into a WriteError naming `path`."""
    try:
        yield
    except WriteError:
        raise
    except OSError as exc:
        raise error(path, exc, then) from None
    except RuntimeError as exc:
        if not _is_io_runtime_error(exc):
            raise
        raise error(path, exc, then) from None


def _is_io_runtime_error(exc: RuntimeError) -> bool:
    text = str(exc)
    return any(m in text for m in ("inline_container", "file write failed", "open file failed", "Parent directory"))


# -- the OS calls (wrapped by the fault-injection tests) ----------------------------------------

def _open(path: str, flags: int) -> int:
    return os.open(path, flags, 0o644)


def _write(fd: int, data: bytes, path: str) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync(fd: int, path: str) -> None:
    os.fsync(fd)


def _rename(src: str, dst: str) -> None:
    os.replace(src, dst)


def _truncate(fd: int, size: int, path: str) -> None:
    os.ftruncate(fd, size)


def _mkdir(path: str) -> None:
    Path(path).mkdir(parents=True, exist_ok=True)


def _unlink(path: str) -> None:
    os.unlink(path)


def _rmdir(path: str) -> None:
    os.rmdir(path)


# -- files replaced whole -----------------------------------------------------------------------

def temporary_name(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(f"{path.name}~{_HOST}~{os.getpid()}{TMP_SUFFIX}")


def _as_bytes(data: bytes | bytearray | memoryview | str) -> bytes | memoryview:
    return data.encode("utf-8") if isinstance(data, str) else data


Data = bytes | bytearray | memoryview | str
BLOCK = 1 << 20   # chunks of an iterable are written in blocks of about this size


def write_file(path: str | os.PathLike, data: Data | Iterable[Data], then: str = "") -> Path:
    """Replace `path` by `data` (str: UTF-8; or an iterable of such chunks, written in ~1 MiB blocks, so a
    large records file is never held whole) atomically: temporary, write, fsync, rename. On failure the
    temporary is removed (where the disk still allows it) and a WriteError naming `path` is raised."""
    path = Path(path)
    tmp = temporary_name(path)
    _in_progress.add(str(tmp))
    fd = None
    try:
        fd = _open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        for block in _blocks(data):
            _write(fd, block, str(tmp))
        _fsync(fd, str(tmp))
        os.close(fd)
        fd = None
        _rename(str(tmp), str(path))
    except OSError as exc:
        _discard(fd, tmp)
        raise error(path, exc, then) from None
    finally:
        _in_progress.discard(str(tmp))
    return path


def _blocks(data: Data | Iterable[Data]) -> Iterator[bytes | bytearray | memoryview]:
    if isinstance(data, (bytes, bytearray, memoryview, str)):
        yield _as_bytes(data)
        return
    pending: list[bytes | bytearray | memoryview] = []
    size = 0
    for chunk in data:
        pending.append(_as_bytes(chunk))
        size += len(pending[-1])
        if size >= BLOCK:
            yield b"".join(pending)
            pending, size = [], 0
    if pending:
        yield b"".join(pending)


def _discard(fd: int | None, tmp: Path) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
    try:
        _unlink(str(tmp))
    except OSError:
        pass   # a read-only disk keeps it: the next writer's `clean_orphans` removes it


# -- files grown in place -----------------------------------------------------------------------

class AppendFile:
    """A file opened for appending: `append(data)` is one write, flushed to the kernel (no buffer in
    this process), so a killed process leaves at most one torn last line; `sync()` fsyncs."""

    def __init__(self, path: str | os.PathLike, then: str = ""):
        self.path, self.then = Path(path), then
        self._fd: int | None = None
        try:
            self._fd = _open(str(self.path), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        except OSError as exc:
            raise error(self.path, exc, then) from None

    def append(self, data: bytes | bytearray | memoryview | str) -> None:
        if not data:
            return
        try:
            _write(self._require(), _as_bytes(data), str(self.path))
        except OSError as exc:
            raise error(self.path, exc, self.then) from None

    def sync(self) -> None:
        try:
            _fsync(self._require(), str(self.path))
        except OSError as exc:
            raise error(self.path, exc, self.then) from None

    def cut(self, size: int) -> None:
        """Truncate to `size` bytes (a torn tail)."""
        try:
            _truncate(self._require(), size, str(self.path))
        except OSError as exc:
            raise error(self.path, exc, self.then) from None

    def _require(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self.path} is closed")
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError:
                pass   # nothing is buffered here: a write that failed has already raised

    def __del__(self) -> None:   # as Python's own file objects: a writer dropped on an error path
        self.close()

    def __enter__(self) -> AppendFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def truncate(path: str | os.PathLike, size: int, then: str = "") -> None:
    """Cut an existing file to `size` bytes."""
    with AppendFile(path, then) as fh:
        fh.cut(size)


# -- folders, removal, lock files ---------------------------------------------------------------

def make_dirs(path: str | os.PathLike, then: str = "") -> Path:
    path = Path(path)
    if path.is_dir():
        return path
    try:
        _mkdir(str(path))
    except OSError as exc:
        raise error(exc.filename or path, exc, then) from None
    return path


def rename(src: str | os.PathLike, dst: str | os.PathLike, then: str = "") -> Path:
    """Move a finished file or folder into place (a download's .part, a staged dataset)."""
    try:
        _rename(str(src), str(dst))
    except OSError as exc:
        raise error(dst, exc, then) from None
    return Path(dst)


def remove(path: str | os.PathLike, then: str = "", missing_ok: bool = True) -> None:
    try:
        _unlink(str(path))
    except FileNotFoundError:
        if not missing_ok:
            raise
    except OSError as exc:
        raise error(path, exc, then) from None


def remove_dir(path: str | os.PathLike, then: str = "") -> None:
    """Remove an empty folder."""
    try:
        _rmdir(str(path))
    except OSError as exc:
        raise error(path, exc, then) from None


class LockFile:
    """The file a writer holds a `flock` on (rundir/lock.py): opened without truncation (another
    process may hold it), and rewritten in place with the holder's details."""

    def __init__(self, path: str | os.PathLike, then: str = ""):
        self.path, self.then = Path(path), then
        try:
            self.fd = _open(str(self.path), os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise error(self.path, exc, then) from None

    def rewrite(self, data: bytes | str) -> None:
        try:
            _truncate(self.fd, 0, str(self.path))
            os.lseek(self.fd, 0, os.SEEK_SET)
            _write(self.fd, _as_bytes(data), str(self.path))   # offset 0: O_RDWR without O_APPEND
        except OSError as exc:
            raise error(self.path, exc, self.then) from None

    def close(self) -> None:
        os.close(self.fd)

    def names_this_file(self) -> bool:
        """Whether `path` still names the file this descriptor holds (a holder removes it on release)."""
        try:
            here, there = os.fstat(self.fd), os.stat(self.path)
        except OSError:
            return False
        return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)

    def discard(self) -> None:
        """Remove the file while its flock is still held (the holder's release): nothing is left behind to
        name a finished run. A courtesy, not a write a run depends on: a file that cannot be removed stays
        (the next holder rewrites it), so this goes around the fault layer and never fails the run."""
        with contextlib.suppress(OSError):
            os.unlink(self.path)


# -- orphaned temporaries -----------------------------------------------------------------------

def orphans(folder: str | os.PathLike) -> list[Path]:
    """This module's temporaries in `folder` whose writer is gone: written on this host by a process
    that no longer runs (or by this one, and not being written now). Another host's are left alone."""
    folder = Path(folder)
    try:
        candidates = [p for p in folder.iterdir() if p.name.endswith(TMP_SUFFIX)]
    except OSError:
        return []
    found = []
    for path in candidates:
        parts = path.name[:-len(TMP_SUFFIX)].rsplit("~", 2)
        if len(parts) != 3 or parts[1] != _HOST or not parts[2].isdigit():
            continue
        pid = int(parts[2])
        if pid == os.getpid():
            if str(path) not in _in_progress:
                found.append(path)
        elif not _alive(pid):
            found.append(path)
    return sorted(found)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_orphans(folder: str | os.PathLike) -> int:
    """Remove `orphans(folder)`; returns how many. A folder that cannot be written keeps them silently
    (the write that follows reports the folder in one line)."""
    removed = 0
    for path in orphans(folder):
        try:
            _unlink(str(path))
            removed += 1
        except OSError:
            pass
    return removed
