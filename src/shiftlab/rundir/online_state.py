"""Checkpoints of online methods' state together with their records (docs/ONLINE.md).

Online records are held back and appended right after a checkpoint of the state that
produced them (atomic file replace); the checkpoint also keeps those records, so a process
killed between the two gets them written back on resume. State and records therefore never
disagree, and a resumed stream equals an uninterrupted one. A checkpoint is taken once
`every_samples` samples are held back (or `every_seconds` have passed), but never sooner than ten
times the last checkpoint's own duration after it (a DMN memory is tens of MB): a kill loses the
online work of about that many samples, or seconds, which the resume redoes, and checkpoints cost
at most a tenth of the run's time. Under torchrun only rank 0 runs online methods, so only rank 0
writes this file.

An online record is only ever computed by the state that precedes it in the stream: on
resume the methods continue from the checkpoint's position (`start`) and process EVERY sample
from there on, writing only the records that are missing. When a record before that position
is missing (a damaged line was quarantined, a line was deleted) or the checkpoint has no state
for one of the methods, no checkpoint before it exists any more, so the stream is replayed from
the initial state (`start` 0); the records that exist are kept, never rewritten.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import io
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .. import writes
from ..options import name_of, say
from ..writes import resume_advice
from .record_files import RecordWriter, run_dir_error
from .records import Record, RecordSchema, as_dict, record_key

SETTINGS_KEY = "settings_sha256"   # each method's settings (run.json's entry) the saved state was made under


def settings_digest(method: Any) -> str:
    """SHA-256 of a method's settings as run.json records them (`identity.method_config`: config, files, weights)."""
    from .identity import method_config
    entry = method_config(getattr(method, "method", method))   # a SettingStates holds the method
    return hashlib.sha256(json.dumps(entry, sort_keys=True, default=str).encode()).hexdigest()


class OnlineState:
    """The online methods' state along the stream, checkpointed with their records."""

    FILE = "online_state.pt"

    def __init__(self, run_dir: Path, methods: Mapping[str, Any], every_seconds: float = 60.0,
                 on_checkpoint: Callable[[Sequence[int]], None] | None = None, every_samples: int | None = None):
        self.path = Path(run_dir) / self.FILE
        self.methods = dict(methods)
        self.every_seconds = every_seconds
        self.every_samples = every_samples      # None: by the clock alone
        self.save_seconds = 0.0                 # what the last checkpoint took
        self.on_checkpoint = on_checkpoint      # called after a checkpoint is saved, before its records are appended
        self.processed: list[int] = []
        self.last_records: list[dict] = []
        self.last_probs: list = []              # their float16 probability vectors (None: not kept)
        self.replayed = False                   # True when `resume` had to restart the stream
        self.restored = 0                       # held-back records `resume` wrote back from the checkpoint
        self._initial = {n: copy.deepcopy(m.state_dict()) for n, m in self.methods.items()}
        self._pending_ids: list[int] = []
        self._pending_records: list[Record | dict] = []
        self._last_save = time.monotonic()
        self._digests: dict[str, str] | None = None

    def _settings_digests(self) -> dict[str, str]:
        if self._digests is None:   # once: the settings do not change along a run (and a file is hashed once)
            self._digests = {n: settings_digest(m) for n, m in self.methods.items()}
        return self._digests

    @property
    def start(self) -> int:
        """Stream position the methods' state has reached (the next sample to process)."""
        return len(self.processed)

    def load(self, stream: Sequence[int] | None = None, new: Sequence[str] = ()) -> bool:
        """Load the checkpoint; False when there is none (or it lacks a method's state). The state and
        held-back records of `new` methods (not in run.json: made with unknown settings) are ignored."""
        if not self.path.is_file():
            return False
        try:
            blob = torch.load(self.path, map_location="cpu", weights_only=True)
            # a state saved under other settings (a checkpoint copied from another run of the same stream) is not
            # this run's: that method has no state here (a replay), and its held-back records go with it
            theirs, mine = blob.get(SETTINGS_KEY) or {}, self._settings_digests()
            foreign = sorted(n for n in blob["states"] if n in theirs and n in mine and theirs[n] != mine[n])
            for name in foreign:
                print(f"shiftlab: warning: {self.path} holds {name}'s state under other settings (a checkpoint of "
                      "another run?); the online methods replay the stream from its start", file=sys.stderr,
                      flush=True)
            new = [*new, *foreign]
            blob["states"] = {n: state for n, state in blob["states"].items() if n not in new}
            vectors = blob.get("last_probs") or [None] * len(blob["last_records"])   # --save-probs (rundir.probs)
            kept = [(r, p) for r, p in zip(blob["last_records"], vectors) if r.get("method") not in new]
            blob["last_records"], self.last_probs = [r for r, _ in kept], [p for _, p in kept]
            processed = [int(sid) for sid in blob["processed"]]
        except Exception as exc:   # cut short, overwritten, another file: torch's, pickle's or a missing key's error
            print(f"shiftlab: warning: {self.path} is damaged or not an online checkpoint ({type(exc).__name__}); "
                  "the online methods replay the stream from its start", file=sys.stderr, flush=True)
            self.last_probs = []
            return False
        if stream is not None and list(stream[:len(processed)]) != processed:
            raise ValueError(f"{self.path} was built along a different stream (another {name_of('seed')}, "
                             f"{name_of('order')} or dataset); resuming would continue that state on this stream. "
                             f"Use the original settings or choose {say('out')}")
        for name, method in self.methods.items():
            if name in blob["states"]:
                method.load_state_dict(blob["states"][name])
        self.processed = processed
        self.last_records = list(blob["last_records"])
        return all(name in blob["states"] for name in self.methods)

    def resume(self, stream: Sequence[int], writer: RecordWriter, done: set, settings: Sequence[str],
               schema: RecordSchema | None = None, new: Sequence[str] = ()) -> int:
        """Continue from the checkpoint: restore its held-back records (those `schema` accepts), then
        decide where the methods restart (see the module docstring). Returns the start position.
        `new`: as `load`."""
        complete = self.load(stream, new)
        self.restore_missing(writer, done, schema)
        before = stream[:self.start]
        missing = any(record_key({"id": sid, "method": n, "setting": s}) not in done and (sid, None, s) not in done
                      for sid in before for n in self.methods for s in settings)
        if self.processed and (missing or not complete):
            self.reset()
            self.replayed = True
        return self.start

    def reset(self) -> None:
        """Back to the initial state at the start of the stream."""
        for name, method in self.methods.items():
            method.load_state_dict(copy.deepcopy(self._initial[name]))
        self.processed, self.last_records, self.last_probs = [], [], []

    def restore_missing(self, writer: RecordWriter, done: set, schema: RecordSchema | None = None) -> None:
        missing = [r for r in self.last_records if _valid(r, schema) and record_key(r) not in done]
        vectors = {record_key(r): p for r, p in zip(self.last_records, self.last_probs)}
        writer.write([dataclasses.replace(Record(**r), probs=vectors.get(record_key(r))) for r in missing])
        done.update(record_key(r) for r in missing)
        self.restored += len(missing)

    def add(self, ids: Sequence[int], online_records: Sequence[Record | dict], writer: RecordWriter) -> None:
        """Hold a batch's online records (the methods processed `ids`, in this order); checkpoint and
        append them when the interval has passed."""
        self._pending_ids.extend(ids)
        self._pending_records.extend(online_records)   # Records keep their probability vectors
        since = time.monotonic() - self._last_save
        by_count = (self.every_samples is not None and len(self._pending_ids) >= self.every_samples
                    and since >= 10 * self.save_seconds)   # checkpoints take at most a tenth of the time
        if by_count or since >= self.every_seconds:
            self.flush(writer)

    def flush(self, writer: RecordWriter) -> None:
        if not self._pending_ids:
            return
        started = time.monotonic()
        self.save(self._pending_ids, self._pending_records)
        self.save_seconds = time.monotonic() - started
        if self.on_checkpoint is not None:
            self.on_checkpoint(list(self._pending_ids))
        writer.write(self._pending_records)
        self._pending_ids, self._pending_records = [], []
        self._last_save = time.monotonic()

    def save(self, ids: Sequence[int], online_records: Sequence[Record | dict]) -> None:
        self.processed.extend(ids)
        blob = {"states": {n: m.state_dict() for n, m in self.methods.items()},
                "processed": self.processed, "last_records": [as_dict(r) for r in online_records],
                "last_probs": [getattr(r, "probs", None) for r in online_records],
                SETTINGS_KEY: self._settings_digests()}
        buffer = io.BytesIO()   # serialised in memory: the bytes reach the disk through shiftlab.writes
        torch.save(blob, buffer)
        try:
            writes.write_file(self.path, buffer.getbuffer(), resume_advice())
        except OSError as exc:
            raise run_dir_error(self.path, exc) from None


def _valid(rec: Any, schema: RecordSchema | None) -> bool:
    """A held-back record is restored only if the records' schema accepts it (else its sample is redone)."""
    try:
        (schema or RecordSchema()).check(rec)
    except ValueError:
        return False
    return True
