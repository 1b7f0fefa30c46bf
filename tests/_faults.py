"""A disk that fails on purpose: every OS call of `shiftlab.writes` (the one module through which
shiftlab writes files) counted, and from the N-th call on each fails with one errno, the way SQLite's
tests make its N-th I/O call fail. A disk that went read-only or full stays so: every later call fails
too, so the code that runs after the failure (closing, cleaning up, a `finally`) meets it as well.

    disk = FailingDisk(monkeypatch)
    disk.arm(5, errno.ENOSPC)       # the 5th call and every one after it fail
    ...
    disk.disarm()
    disk.calls                      # [(op, path), ...] of every call since `arm`
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from shiftlab import writes

OPS = ("_open", "_write", "_fsync", "_rename", "_truncate", "_mkdir", "_unlink", "_rmdir")
# calls on an open descriptor: the OS names no file in their errors (the module must)
_FD_OPS = {"_write", "_fsync", "_truncate"}


class FailingDisk:
    def __init__(self, monkeypatch):
        self.calls: list[tuple[str, str]] = []
        self.arm(None)
        for name in OPS:
            monkeypatch.setattr(writes, name, self._wrap(name, getattr(writes, name)))

    def arm(self, fail_at: int | None, err: int = 0, on: str | None = None) -> None:
        """Fail from the `fail_at`-th call on; with `on`, from the `fail_at`-th call whose path contains
        `on` (e.g. "online_state.pt": the run directory turns read-only when the state is saved)."""
        self.calls, self.fail_at, self.err, self.on, self._hits = [], fail_at, err, on, 0
        self._failing = False
        self.failure: tuple[str, str] | None = None     # the first call that failed

    def disarm(self) -> None:
        """A working disk again (`calls` and `failure` stay for inspection)."""
        self.fail_at, self._failing = None, False

    def _wrap(self, name: str, real):
        def call(*args):
            path = str(args[-1] if name in _FD_OPS else args[0])
            self.calls.append((name, path))
            if self.fail_at is not None and not self._failing:
                self._hits += self.on is None or self.on in path
                self._failing = self._hits >= self.fail_at
                if self._failing:
                    self.failure = (name, path)
            if self._failing:
                if name in _FD_OPS:
                    raise OSError(self.err, os.strerror(self.err))
                raise OSError(self.err, os.strerror(self.err), path)
            return real(*args)
        return call


def target(path: str) -> str:
    """The file a call was for: a temporary's final name."""
    return re.sub(r"~[^~/]+~\d+" + re.escape(writes.TMP_SUFFIX) + "$", "", path)


def point(op: str, path: str, roots: dict[str, Path], same: dict[str, str] | None = None) -> tuple[str, str]:
    """A failure point: the call and the role of its file, e.g. ("_write", "run/online_state.pt"), with
    the store's entry digests and shard names and the pid in temporaries replaced by placeholders, and
    `same` ({"/imagenet-a/": "/DATASET/"}) folders whose files play the same role as another's."""
    text = target(path)
    for name, root in roots.items():
        text = text.replace(str(root), name)
    for folder, role in (same or {}).items():
        text = text.replace(folder, role)
    text = re.sub(r"/[0-9a-f]{16}(/|$)", r"/ENTRY\1", text)
    return op, re.sub(r"r\d{3}-\d+-\d+-\d+\.", "SHARD.", text)


def orphans(*roots: Path) -> list[Path]:
    return [p for root in roots if root.exists() for p in root.rglob(f"*{writes.TMP_SUFFIX}")]
