"""records.jsonl and its shards on disk: the append-only writer, the readers, the quarantine and
the merge (the record itself and its schema: rundir/records.py).

Records are appended one sample at a time with a single write and a flush, so a process
killed at any point leaves at most one partial last line, which readers ignore and writers
cut off before appending. A complete line that is not a valid record (garbage, a NUL-filled
block after a crash of the filesystem, a well-formed object that breaks the schema, a record
of another run's sample or method) is skipped by readers and, when a run resumes or is merged,
moved to `records.quarantine.jsonl` with its file and line number (`quarantine`), so the
sample is redone. Under torchrun each rank appends to its own shard in `shards/`;
`merge_records` folds shards into records.jsonl (deduplicated, sorted), and is idempotent."""
from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import writes
from ..writes import resume_advice
from .records import _FIELDS_ONLY, Key, Record, RecordSchema, dumps, record_key

if TYPE_CHECKING:
    pass


RECORDS = "records.jsonl"
SHARDS = "shards"
QUARANTINE = "records.quarantine.jsonl"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_STRICT = json.JSONDecoder(parse_constant=_no_constant)   # one decoder: json.loads(**kw) builds one per call


# -- reading -------------------------------------------------------------------------------

@dataclass
class Line:
    """One complete line of a records file: `record` is None when the line is not a valid record."""
    number: int            # 1-based
    raw: bytes
    record: dict[str, Any] | None
    problem: str = ""


def scan(path: Path, include_torn: bool = False, schema: RecordSchema | None = None) -> Iterator[Line]:
    """Every complete line of a records file, parsed and validated (`schema`, default: the fields
    only); a torn last line (a killed writer's) is yielded as invalid only with `include_torn`
    (readers that count damage)."""
    schema = schema or _FIELDS_ONLY
    path = Path(path)
    if not path.is_file():
        return
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if not raw.endswith(b"\n"):
                if include_torn and raw.strip():
                    yield Line(number, raw, None, "incomplete last line")
                break  # torn write of a killed process
            text = raw.strip()
            if not text:
                continue
            try:
                data = _STRICT.decode(text.decode("utf-8"))
                schema.check(data)
            except (ValueError, UnicodeDecodeError, RecursionError) as exc:
                yield Line(number, raw, None, str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
                continue
            yield Line(number, raw, data)


def iter_records(path: Path, schema: RecordSchema | None = None) -> Iterator[dict]:
    """Valid records of a file as dicts (torn last line and invalid lines skipped)."""
    for line in scan(path, schema=schema):
        if line.record is not None:
            yield line.record


def record_files(run_dir: Path) -> list[Path]:
    run_dir = Path(run_dir)
    files = [run_dir / RECORDS] if (run_dir / RECORDS).is_file() else []
    shard_dir = run_dir / SHARDS
    if shard_dir.is_dir():
        files += sorted(shard_dir.glob("*.jsonl"))
    return files


def load_records(run_dir: Path, schema: RecordSchema | None = None) -> list[dict]:
    """All valid records of a run (merged file and shards), first occurrence of each key wins."""
    seen: set = set()
    out = []
    for path in record_files(run_dir):
        for rec in iter_records(path, schema):
            key = record_key(rec)
            if key not in seen:
                seen.add(key)
                out.append(rec)
    return out


def done_keys(records: Iterable[Mapping[str, Any] | Record]) -> set[Key]:
    return {record_key(r) for r in records}


def quarantine(run_dir: Path, warn: Callable[[str], None] | None = None, schema: RecordSchema | None = None) -> int:
    """Move invalid complete lines (`scan` with `schema`) of every records file to
    records.quarantine.jsonl; returns how many.

    Each quarantined line is kept as {"file", "line", "problem", "text"} so nothing is lost, and
    `warn` (default: print to stderr) gets one line per damaged line naming file and line number.
    `reject(record)` returns why a valid record must go too (None: it stays); those are said in one
    line per file. Called by a writer holding the run lock (resume, merge), never by readers.
    """
    import sys
    warn = warn or (lambda msg: print(msg, file=sys.stderr))
    run_dir = Path(run_dir)
    moved = 0
    files = record_files(run_dir)
    invalid: dict[Path, list[Line]] = {}
    seen: set[Key] = set()
    repeated: set[Key] = set()   # keys held by more than one valid line: compared only then (a second read)
    for path in files:
        for line in scan(path, schema=schema):
            if line.record is None:
                invalid.setdefault(path, []).append(line)
            elif (key := record_key(line.record)) in seen:
                repeated.add(key)
            else:
                seen.add(key)
    conflicting = _conflicting_lines(run_dir, files, schema, repeated) if repeated else {}
    for path in files:
        bad = sorted(invalid.get(path, []) + conflicting.get(path, []), key=lambda line: line.number)
        if not bad:
            continue
        lines = "".join(json.dumps({"file": str(path.relative_to(run_dir)), "line": line.number,
                                    "problem": line.problem,
                                    "text": line.raw.decode("utf-8", "backslashreplace").rstrip("\n")}) + "\n"
                        for line in bad)
        with writes.AppendFile(run_dir / QUARANTINE, resume_advice()) as fh:
            fh.append(lines)
            fh.sync()
        numbers = {line.number for line in bad}
        with open(path, "rb") as src:
            writes.write_file(path, (raw for number, raw in enumerate(src, start=1) if number not in numbers),
                              resume_advice())
        # a problem shared by many lines (a method missing from run.json) is one warning, not 30,000
        for problem in dict.fromkeys(line.problem for line in bad):
            lines = [line.number for line in bad if line.problem == problem]
            if len(lines) <= 3:
                for number in lines:
                    warn(f"shiftlab: {path}:{number}: damaged record ({problem}) moved to "
                         f"{run_dir / QUARANTINE}; the sample is redone")
            else:
                warn(f"shiftlab: {path}: {len(lines)} record(s) moved to {run_dir / QUARANTINE} ({problem}; "
                     f"lines {lines[0]}, ...); their samples are redone")
        moved += len(bad)
    return moved


def _conflicting_lines(run_dir: Path, files: Sequence[Path], schema: RecordSchema | None,
                       repeated: set[Key]) -> dict[Path, list[Line]]:
    """Per file, its valid lines of a `repeated` key (sample, method, setting) that another valid line holds with
    another record (its `seconds` aside): which of the two is this run's cannot be told from their files' names or
    order (a shard swapped in from another run, a line edited by hand), so every copy goes and the sample is redone.
    Copies that agree are duplicates, left to the readers (the first is read)."""
    copies: dict[Key, list[tuple[Path, Line]]] = {}
    for path in files:
        for line in scan(path, schema=schema):
            if line.record is not None and record_key(line.record) in repeated:
                copies.setdefault(record_key(line.record), []).append((path, line))
    out: dict[Path, list[Line]] = {}
    for found in copies.values():
        if len({json.dumps({k: v for k, v in line.record.items() if k != "seconds"}, sort_keys=True)
                for _, line in found}) == 1:
            continue
        for path, line in found:
            others = ", ".join(dict.fromkeys(str(p.relative_to(run_dir)) for p, other in found if other is not line))
            out.setdefault(path, []).append(Line(line.number, line.raw, None, "another record of its sample, method "
                                                 f"and setting differs: {others}; neither is kept"))
    return out


def _sort_key(rec: Mapping[str, Any]) -> tuple:
    return (rec["id"], rec.get("setting", "clean"), rec.get("method") or "")


def merge_records(run_dir: Path, schema: RecordSchema | None = None) -> Path:
    """Fold shards into records.jsonl, deduplicated and sorted by (id, setting, method). Call
    `quarantine` first: a line this reader refuses would be dropped."""
    run_dir = Path(run_dir)
    records = sorted(load_records(run_dir, schema), key=_sort_key)
    target = writes.write_file(run_dir / RECORDS, (dumps(rec) for rec in records), resume_advice())
    shard_dir = run_dir / SHARDS
    if shard_dir.is_dir():
        for shard in shard_dir.glob("*.jsonl"):
            writes.remove(shard, resume_advice())
        if not any(shard_dir.iterdir()):
            writes.remove_dir(shard_dir, resume_advice())
    return target


# -- writing -------------------------------------------------------------------------------

class RunDirError(writes.WriteError):
    """The run directory cannot be written (a file in the way, read-only, disk full): a WriteError (an
    OSError) whose `filename` is always the path concerned, so the CLI prints one line naming it."""

    def __init__(self, err: int | None, reason: str, filename: str, advice: str | None = None):
        super().__init__(err, reason, filename, writes.what_to_do(err, resume_advice()) if advice is None else advice)


def run_dir_error(path: Path, exc: OSError) -> RunDirError:
    """An OSError while creating or writing a run directory -> a RunDirError naming the path
    (a failed write() on an open file carries no file name of its own)."""
    if isinstance(exc, writes.WriteError):
        return exc if isinstance(exc, RunDirError) else RunDirError(exc.errno, exc.strerror, exc.filename, exc.advice)
    return RunDirError(exc.errno, exc.strerror or str(exc), str(exc.filename or path))


def ensure_run_dir(run_dir: Path) -> Path:
    """Create the run directory; a RunDirError naming it when that is impossible (with no advice to resume: a
    folder that could not be made holds no records)."""
    run_dir = Path(run_dir)
    try:
        writes.make_dirs(run_dir)
    except OSError as exc:
        raise run_dir_error(run_dir, exc) from None
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise RunDirError(errno.EACCES, "Permission denied (the folder is not writable)", str(run_dir))
    return run_dir


class RecordWriter:
    """Appends one sample's records per call with a single write (writes.AppendFile: no buffer in this
    process). With `probs` (a shiftlab.rundir.probs.ProbsWriter), the records' probability vectors are
    written first, so a killed process never leaves a record without its vector."""

    def __init__(self, path: Path, probs: Any = None):
        self.path = Path(path)
        self.probs = probs
        try:
            writes.make_dirs(self.path.parent)
            self._fh = writes.AppendFile(self.path, resume_advice())
            _cut_torn_tail(self.path, self._fh)
        except OSError as exc:
            raise run_dir_error(self.path, exc) from None

    def write(self, records: Sequence[Mapping[str, Any] | Record]) -> None:
        if records:
            try:
                if self.probs is not None:
                    self.probs.write([(r.key, r.probs) for r in records
                                      if isinstance(r, Record) and r.probs is not None and r.error is None])
                self._fh.append("".join(dumps(r) for r in records))
            except OSError as exc:
                raise run_dir_error(self.path, exc) from None

    def close(self) -> None:
        self._fh.close()
        if self.probs is not None:
            self.probs.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _cut_torn_tail(path: Path, fh: writes.AppendFile) -> None:
    if not path.is_file() or path.stat().st_size == 0:
        return
    with open(path, "rb") as src:
        data = src.read()
    if not data.endswith(b"\n"):
        fh.cut(data.rfind(b"\n") + 1)
