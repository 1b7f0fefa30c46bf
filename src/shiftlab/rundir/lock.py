"""One writer per run directory: an exclusive `fcntl.flock` on `RUN_DIR/run.lock`.

`shiftlab run` holds it from before it reads the run directory until it has written the
summary; `shiftlab merge` holds it while it rewrites records.jsonl. A second process on the
same directory is refused at once, naming the holder's pid, host and start time (written
into the lock file by the holder). The kernel releases a flock when its process dies, so a
killed run never leaves a stale lock. A holder that ends (finished, failed, SIGINT or SIGTERM)
removes the file before it lets the flock go; a process that locked a file no longer named
run.lock (removed while it waited) lets it go and tries again, so two processes never hold two
different files. Only a kill -9 leaves the file behind, unlocked.

The lock is the process's that took it, never a child's: a forked child (a DataLoader worker)
inherits the descriptor, and a flock lives as long as any descriptor of it, so an orphaned worker
would hold the run directory for seconds after its run was killed. Every child closes its inherited
copies at once (`os.register_at_fork`), which leaves the parent's lock as it is.

Under torchrun, rank 0 takes the lock for the whole job and every rank learns the outcome
through a collective (`engine.distributed.acquire_for_job`), so all ranks of a refused job stop before any of
them reads or writes; ranks other than 0 do not hold the flock themselves (they are the
same run). The lock is only as good as the filesystem's flock: on a local disk and on most
NFSv4 mounts it is shared between nodes; the run directory of a multi-node job must be on
such a filesystem anyway (docs/SCALE_OUT.md).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import socket
from pathlib import Path

from .. import writes
from ..options import name_of, say
from ..writes import resume_advice
from .record_files import run_dir_error


def store_advice() -> str:
    """What a feature store's writer says to do after a failed write, in the caller's spelling."""
    return (f"the run's records are safe; the feature store can be deleted, or the run continued without "
            f"{name_of('features')}")

LOCK_FILE = "run.lock"
_ATTEMPTS = 20
_HELD: set[int] = set()   # the descriptors of the locks this process holds


def _close_inherited() -> None:
    """In a freshly forked child: close the copies of the parent's lock descriptors (closing a copy leaves the
    parent's flock held; only a LOCK_UN or the last descriptor's close would end it)."""
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_close_inherited)


class RunLockedError(FileExistsError):
    """Another process holds the run directory (a FileExistsError: the CLI prints it as one line)."""


class RunLock:
    """An exclusive, non-blocking lock on a run directory; use as a context manager or acquire/release."""

    def __init__(self, run_dir: Path, purpose: str = "run"):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self.purpose = purpose
        self._fd: int | None = None
        self._handle: writes.LockFile | None = None
        self._pid = os.getpid()

    def acquire(self) -> RunLock:
        import fcntl
        then = store_advice() if self.purpose == "feature store" else resume_advice()
        for _ in range(_ATTEMPTS):
            try:
                writes.make_dirs(self.run_dir, then)
                handle = writes.LockFile(self.path, then)
            except OSError as exc:
                raise run_dir_error(self.path, exc) from None
            try:
                fcntl.flock(handle.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(handle.fd)
                handle.close()
                raise RunLockedError(f"{self.run_dir} is in use by another shiftlab process ({holder}); wait for "
                                     f"it to finish or choose {say('out')}") from None
            if handle.names_this_file():
                break
            handle.close()   # its holder removed it between our open and our flock: lock the new one
        else:
            raise RunLockedError(f"{self.run_dir}: {LOCK_FILE} keeps being replaced by other processes; wait for "
                                 f"them to finish or choose {say('out')}")
        info = {"pid": os.getpid(), "host": socket.gethostname(), "purpose": self.purpose,
                "started": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}
        try:
            handle.rewrite(json.dumps(info) + "\n")
        except OSError as exc:
            handle.close()
            raise run_dir_error(self.path, exc) from None
        self._fd = handle.fd
        self._handle, self._pid = handle, os.getpid()
        _HELD.add(handle.fd)
        writes.clean_orphans(self.run_dir)   # the holder alone writes here: a temporary left behind is an orphan
        return self

    def release(self) -> None:
        if self._fd is not None and self._pid != os.getpid():   # a forked child's copy: not its lock
            self._fd = self._handle = None
        if self._fd is not None:
            self._handle.discard()   # removed while still held: nobody can lock the name it had meanwhile
            _HELD.discard(self._fd)
            os.close(self._fd)   # closing the descriptor releases the flock
            self._fd = self._handle = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info:
        return "holder unknown"
    return (f"shiftlab {info.get('purpose', 'run')}, pid {info.get('pid', '?')} on {info.get('host', '?')}, "
            f"started {info.get('started', '?')}")
