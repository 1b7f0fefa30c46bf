"""Probability vectors beside the records (`shiftlab run --save-probs`): `probs/` in a run directory.

Each prediction record's probability vector (`MethodOutput.probabilities()`, the vector its
confidence, top-5 and true_prob come from) is stored in float16, so that any metric can be
computed later. One writer appends to a pair of files, `probs/<stem>.f16` (the vectors, raw
little-endian float16, back to back) and `probs/<stem>.jsonl` (one line per vector:
`{"id", "method", "setting", "offset", "classes", "crc32"}`, `offset` in bytes into the .f16 file,
`crc32` of the vector's bytes). The stem is `probs` for a single process, `rank<r>` per torchrun
rank (as records' shards); `merge_probs` (called by `summary.finish_run`, so also by `shiftlab merge`)
folds rank files into `probs.*`, appending only.

Consistency with records.jsonl: `shiftlab.rundir.record_files.RecordWriter` writes (and flushes) a sample's
vectors before its records line. A killed process therefore never leaves a record without its
vector; it may leave vectors whose record was never written, and that record is redone on resume,
which appends its vector again. Readers keep, per key, the last vector that agrees with the record
(`agrees`: float16 of the record's true_prob and confidence equal the vector's value at the label and
its maximum, exactly, since both come from the same float32 vector), and only for valid prediction
records. A vector that fails its crc32 or lies outside its .f16 file (damage, a crash of the
filesystem) is skipped: that record simply has none, and a report then leaves metrics that need
vectors out for its method.
"""
from __future__ import annotations

import json
import sys
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import writes
from ..options import say
from ..writes import resume_advice

PROBS = "probs"          # the folder in a run directory
MAIN = "probs"           # the stem of a single process's (and the merged) files
DTYPE = np.dtype("<f2")

Key = tuple   # (id, method, setting), records.record_key


def stem_for(rank: int, world_size: int) -> str:
    return MAIN if world_size == 1 else f"rank{rank}"


def has_probs(run_dir: Path) -> bool:
    return bool(_pairs(run_dir))


def _pairs(run_dir: Path) -> list[tuple[Path, Path]]:
    """(index, data) of every writer, the merged file first (its vectors are the oldest)."""
    folder = Path(run_dir) / PROBS
    if not folder.is_dir():
        return []
    stems = sorted(p.stem for p in folder.glob("*.jsonl"))
    stems.sort(key=lambda s: s != MAIN)
    return [(folder / f"{s}.jsonl", folder / f"{s}.f16") for s in stems]


class ProbsWriter:
    """Appends vectors to `probs/<stem>.{f16,jsonl}`; on opening, a torn index line is cut and the
    data file truncated to the end of the last indexed vector, so offsets stay right after a kill."""

    def __init__(self, run_dir: Path, stem: str = MAIN):
        from .record_files import run_dir_error
        folder = Path(run_dir) / PROBS
        self.index_path, self.data_path = folder / f"{stem}.jsonl", folder / f"{stem}.f16"
        self._data = self._index = None
        try:
            writes.make_dirs(folder, resume_advice())
            writes.clean_orphans(folder)
            self._data = writes.AppendFile(self.data_path, resume_advice())
            self._index = writes.AppendFile(self.index_path, resume_advice())
            self._size = _repair(self._index, self._data)
        except OSError as exc:
            self.close()
            raise run_dir_error(folder, exc) from None

    def write(self, entries: Sequence[tuple[Key, Any]]) -> None:
        """Append (key, vector) pairs (vector: (C,) array or tensor, stored as float16), each file in one write."""
        if not entries:
            return
        lines, blobs = [], []
        size = self._size
        for (sid, method, setting), vec in entries:
            blob = _as_f16(vec).tobytes()
            lines.append(json.dumps({"id": int(sid), "method": method, "setting": setting, "offset": size,
                                     "classes": len(blob) // DTYPE.itemsize, "crc32": zlib.crc32(blob)},
                                    sort_keys=True) + "\n")
            blobs.append(blob)
            size += len(blob)
        self._data.append(b"".join(blobs))
        self._size = size   # only once the data is written: a failed write leaves the offsets right
        self._index.append("".join(lines))

    def sync(self) -> None:
        for fh in (self._data, self._index):
            fh.sync()

    def close(self) -> None:
        for fh in (self._data, self._index):
            if fh is not None:
                fh.close()


def _as_f16(vec: Any) -> np.ndarray:
    if hasattr(vec, "detach"):   # a torch tensor (float16 already when it comes from a Record)
        vec = vec.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(vec).astype(DTYPE, copy=False).reshape(-1))


def _repair(index: writes.AppendFile, data: writes.AppendFile) -> int:
    """Cut a torn last index line and data past the last indexed vector; returns the data's end."""
    end = 0
    if index.path.is_file():
        raw = index.path.read_bytes()
        if raw and not raw.endswith(b"\n"):
            raw = raw[:raw.rfind(b"\n") + 1]
            index.cut(len(raw))
        for entry in _parse_index(raw):
            end = max(end, entry["offset"] + entry["classes"] * DTYPE.itemsize)
    size = data.path.stat().st_size if data.path.is_file() else 0
    if size > end:
        data.cut(end)
    return min(size, end)


def _parse_index(raw: bytes) -> Iterator[dict]:
    for line in raw.split(b"\n"):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            continue
        if (isinstance(entry, dict) and all(isinstance(entry.get(k), int) and not isinstance(entry.get(k), bool)
                                            and entry[k] >= 0 for k in ("id", "offset", "classes", "crc32"))
                and isinstance(entry.get("method"), str) and isinstance(entry.get("setting"), str)):
            yield entry


def iter_vectors(run_dir: Path) -> Iterator[tuple[Key, np.ndarray]]:
    """Every intact (key, float16 vector) of a run directory, in writing order per file; damaged ones
    (bad crc32, outside the data file) are skipped."""
    return _vectors_of(_pairs(run_dir))


def agrees(vec: np.ndarray, rec: Mapping[str, Any]) -> bool:
    """Whether `vec` is the vector a prediction record's true_prob and confidence were read from."""
    label = rec.get("label")
    if not isinstance(label, int) or not 0 <= label < vec.shape[0]:
        return False
    return (np.float16(rec.get("true_prob")) == vec[label]) and (np.float16(rec.get("confidence")) == vec.max())


def match(run_dir: Path, recs: Sequence[Mapping[str, Any]]) -> dict[Key, np.ndarray]:
    """{key: vector} for the prediction records `recs`: per key the last stored vector agreeing with it."""
    from .records import record_key
    wanted = {record_key(r): r for r in recs if "error" not in r and r.get("method") is not None}
    out: dict[Key, np.ndarray] = {}
    for key, vec in iter_vectors(run_dir):
        rec = wanted.get(key)
        if rec is not None and agrees(vec, rec):
            out[key] = vec
    return out


def load_probs(run_dir: Path, warn: Callable[[str], None] | None = None) -> dict[Key, np.ndarray]:
    """{(id, method, setting): float16 array (C,)} for the run's valid prediction records that have a
    vector (records.load_records: records.jsonl and any shards).

    Records without an intact vector (a damaged or missing entry, or records written before the run had
    `--save-probs`) are never dropped without a word: `warn` (default: print to stderr) gets one line saying
    how many of how many, per method, so a caller never mistakes fewer vectors for fewer records."""
    from .record_files import load_records
    from .records import record_key
    if not has_probs(run_dir):
        return {}
    recs = [r for r in load_records(run_dir) if "error" not in r and r.get("method") is not None]
    found = match(run_dir, recs)
    lacking = Counter(r["method"] for r in recs if record_key(r) not in found)
    if lacking:
        per = ", ".join(f"{m} {n}" for m, n in sorted(lacking.items()))
        line = (f"shiftlab: {sum(lacking.values())} of {len(recs)} prediction record(s) in {run_dir} have no intact "
                f"probability vector in {Path(run_dir) / PROBS} ({per}): damaged, or written without "
                f"{say('save_probs')}; the vectors returned are fewer than the records")
        (warn or _stderr)(line)
    return found


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def merge_probs(run_dir: Path, recs: Sequence[Mapping[str, Any]]) -> None:
    """Fold the rank files into `probs.*` (appending the vectors of `recs` that the merged files lack or
    hold only a disagreeing one of), then remove them. Idempotent; a crash midway loses nothing."""
    pairs = _pairs(run_dir)
    ranks = [(i, d) for i, d in pairs if i.stem != MAIN]
    if not ranks:
        return
    from .records import record_key
    wanted = {record_key(r): r for r in recs if "error" not in r and r.get("method") is not None}
    main_dir = Path(run_dir)
    done = {k for k, v in _vectors_of([p for p in pairs if p[0].stem == MAIN])
            if k in wanted and agrees(v, wanted[k])}
    writer = ProbsWriter(main_dir, MAIN)
    try:
        for pair in ranks:
            todo = [(k, v) for k, v in _vectors_of([pair]) if k in wanted and k not in done and agrees(v, wanted[k])]
            writer.write(todo)
            done.update(k for k, _ in todo)
        writer.sync()
    finally:
        writer.close()
    for index, data in ranks:
        writes.remove(index, resume_advice())
        writes.remove(data, resume_advice())


def _vectors_of(pairs: list[tuple[Path, Path]]) -> Iterator[tuple[Key, np.ndarray]]:
    for index, data in pairs:
        if not index.is_file() or not data.is_file():
            continue
        buf = data.read_bytes()
        raw = index.read_bytes()
        for e in _parse_index(raw[:raw.rfind(b"\n") + 1]):   # a torn last line is not an entry
            start, stop = e["offset"], e["offset"] + e["classes"] * DTYPE.itemsize
            if stop <= len(buf) and not e["offset"] % DTYPE.itemsize and zlib.crc32(buf[start:stop]) == e["crc32"]:
                yield (e["id"], e["method"], e["setting"]), np.frombuffer(buf, DTYPE, e["classes"], start)
