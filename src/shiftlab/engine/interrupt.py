"""Stopping a run with SIGINT (Ctrl-C) or SIGTERM (`kill`, a scheduler's pre-emption, torchrun's agent).

`handling_signals()` (entered by `shiftlab.cli.main`) turns both signals into `Interrupted`, a
KeyboardInterrupt: no `except Exception` (a method's failure becoming an error record) can swallow
it, and the `finally` blocks of the run close the record writer, so every record written so far is
a complete line (they are flushed per sample anyway). The engine attaches how far the run got
(`note_progress`: samples with every record, over the run's stream, read back from all record files,
so rank 0 of a torchrun job counts every rank's); the CLI prints one line and exits 128 + the
signal's number (130 for SIGINT, 143 for SIGTERM), as a shell reports a process the signal ended.
Each torchrun rank handles its own signal; rank 0 alone prints. The online methods' state stays at
its last checkpoint (a half-processed step is never saved), so `--resume` continues exactly.

After the first signal the default handlers are back: a second Ctrl-C or SIGTERM stops cleanup too.
"""
from __future__ import annotations

import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ..options import say

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """The run received `signum`; `progress` is (samples done, samples in the stream) once known."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.progress: tuple[int, int] | None = None


def exit_code(exc: BaseException) -> int:
    """128 + the signal's number (a plain KeyboardInterrupt is a SIGINT)."""
    return 128 + int(getattr(exc, "signum", signal.SIGINT))


def _raise(signum: int, frame: object) -> None:
    for sig in SIGNALS:   # a second signal is not caught: it stops the cleanup as well
        signal.signal(sig, signal.SIG_DFL if sig == signal.SIGTERM else signal.default_int_handler)
    raise Interrupted(signum)


def ignore_in_worker(worker_id: int) -> None:
    """DataLoader `worker_init_fn`: a worker ignores SIGINT and SIGTERM. A signal to the process group
    (Ctrl-C, a scheduler) then stops the main process alone, which shuts its workers down; a worker
    killed by the signal would make the DataLoader print a traceback on the way out."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


@contextmanager
def handling_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise `Interrupted` inside (main thread only: elsewhere nothing changes);
    the previous handlers are restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    for sig in SIGNALS:
        signal.signal(sig, _raise)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def count(keys: set, stream: Sequence[int], methods: Sequence[str], settings: Sequence[str]) -> tuple[int, dict]:
    """(samples of `stream` with every record of `methods` x `settings` among `keys`, {method: samples with
    all of that method's records}): what a run directory holds, whole samples and per method."""
    from ..rundir import records
    per = {m: sum(1 for sid in stream if all(not records.is_missing(sid, m, s, keys) for s in settings))
           for m in methods}
    whole = sum(1 for sid in stream
                if all(not records.is_missing(sid, m, s, keys) for m in methods for s in settings))
    return whole, per


def per_method_note(whole: int, per: dict, total: int) -> str:
    """' (records on disk: zeroshot 19, tpt 19, tda 16 of 40)' when the methods hold different numbers of
    samples (an online method's records wait for its checkpoint), else ''; so that a count of whole samples
    never reads as if the other methods' records were lost."""
    if all(n == whole for n in per.values()):
        return ""
    return " (records on disk: " + ", ".join(f"{m} {n}" for m, n in per.items()) + f" of {total})"


def samples_done(run_dir: Path, stream: Sequence[int], methods: Sequence[str], settings: Sequence[str]) -> int:
    """Samples of `stream` with a record for every method and setting in the run directory's files."""
    from ..rundir import record_files
    return count(record_files.done_keys(record_files.load_records(run_dir)), stream, methods, settings)[0]


def note_progress(exc: BaseException, run_dir: Path, stream: Sequence[int], methods: Sequence[str],
                  settings: Sequence[str]) -> None:
    """Attach (samples done, samples in the stream) to an interrupt on its way to the CLI, and `per_method`:
    each method's samples on disk."""
    from ..rundir import record_files
    if getattr(exc, "progress", None) is None:
        try:
            keys = record_files.done_keys(record_files.load_records(run_dir))
        except OSError:   # the count is a courtesy; the records are what matters
            return
        whole, per = count(keys, stream, methods, settings)
        exc.progress = (whole, len(stream))  # type: ignore[attr-defined]
        exc.per_method = per  # type: ignore[attr-defined]


def message(exc: BaseException) -> str:
    """'interrupted after N of M samples; continue with --resume' ('interrupted' before a run's records
    were reached, or outside a run), with each method's count when they differ."""
    progress = getattr(exc, "progress", None)
    if progress is None:
        return "interrupted"
    note = per_method_note(progress[0], getattr(exc, "per_method", None) or {}, progress[1])
    return f"interrupted after {progress[0]} of {progress[1]} samples{note}; continue with {say('resume')}"
