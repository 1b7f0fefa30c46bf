"""Encode once: a directory of view features keyed by everything that decides them.

    store = FeatureStore("feats")                       # read-only; many readers at once
    entry = store.find(model="RN50", n_views=64)        # the one entry that matches
    feats = entry.features(sample_id)                   # (N, D) float32, or None

Layout (also in docs/ARCHITECTURE.md)::

    DIR/store.json                 {"format": FORMAT}
    DIR/run.lock                   one writer at a time (runtime.lock; readers take no lock)
    DIR/<digest>/key.json          an entry's full key; <digest> = first 16 hex of its SHA-256
    DIR/<digest>/<shard>.bin       raw little-endian features (n, N, D) in the entry's storage dtype
    DIR/<digest>/<shard>.json      the shard's index, written last (its presence commits the shard):
                                   sample ids, each sample's identity (source, content SHA-256,
                                   label), each row's checksum, shape, dtype, the .bin's SHA-256,
                                   and the index's own SHA-256

A key (`feature_key`) holds the sample list digest, the model's checkpoint or weights digest, its
preprocessing, the view recipe (family + the count encoded) and seed, the precision, the device
type, the storage dtype and the view generator's version; a different key is another entry, so
nothing is mixed. A method's own frozen encoder (COSMIC's DINOv2) stores its output of view 0 in an
entry of its own, whose key adds the encoder's identity (model, checkpoint SHA-256 or random seed):
another checkpoint is another entry, never a stale hit.

Every byte read back is verified against what it claims to be:
- a sample is served only when its **content digest** (SHA-256 of the encoded image bytes: a file, a
  webdataset member, a parquet cell) equals the one stored with its row, so an image replaced by
  another of the same size with its mtime restored (`cp -p`, rsync, tar) is encoded again. Hashing
  a JPEG costs less than 1/4,000 of decoding and encoding its views even with the tiny model
  (docs/ARCHITECTURE.md, "Feature store"), so there is no size+mtime fast path;
- a row's checksum is the SHA-256 of (entry key digest, sample id, content digest, feature bytes), so
  rows moved, swapped or copied between samples or entries in an edited index fail their check;
- an index whose own SHA-256 does not match is not read.
A row that fails is not served: the caller recomputes it, with one warning per shard. Shard names
carry the torchrun rank and the writer's pid, so ranks write their own shards into one store; each
file is written to a temporary name and renamed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .. import writes
from ..views.generator import VIEW_GENERATOR_VERSION
from .lock import store_advice

FORMAT = 2   # 2: rows bound to key, sample id and content digest; samples carry source and label
STORAGE_DTYPES = {"fp16": torch.float16, "fp32": torch.float32}
SHARD_ROWS = 256          # samples per shard: RN50 64 views fp16 is 32 MiB a shard


def file_digest(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_info(path: str | os.PathLike, label: int | None = None) -> dict[str, Any]:
    """A sample's identity as its own file gives it: source, content SHA-256, label (sha256 None when
    the file cannot be read: then it is never served)."""
    try:
        return sample_info(str(path), file_digest(path), label)
    except OSError:
        return sample_info(str(path), None, label)


def sample_info(source: str, sha256: str | None, label: int | None = None) -> dict[str, Any]:
    """What the index keeps of a sample: where it came from, its content digest, its label."""
    return {"source": source, "sha256": sha256, "label": label}


def row_checksum(digest: str, sid: int, content: str | None, data: bytes) -> str:
    """A row's checksum: bound to its entry, its sample id and the sample's content, not to its place."""
    return hashlib.sha256(f"{digest}\x1f{int(sid)}\x1f{content}\x1f".encode() + data).hexdigest()


def _index_digest(meta: Mapping[str, Any]) -> str:
    body = {k: v for k, v in meta.items() if k != "index_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def feature_key(*, samples_sha256: str, model: Any, recipe: Any, n_views: int, seed: int, precision: str,
                storage: str = "fp16", checkpoint_sha256: str | None = None,
                weights_sha256: str | None = None, corruption: Mapping[str, Any] | None = None,
                encoder: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The key of an entry: every input that decides its features (see the module docstring);
    `corruption` (run.json's, when the run corrupts its images) is part of it when given; `encoder` (a method's
    own frozen encoder's identity, shiftlab.methods.frozen_encoder: its model, checkpoint SHA-256 or seed, what
    it reads) makes the entry that encoder's output of view 0 (one row per sample) instead of the CLIP views'."""
    if storage not in STORAGE_DTYPES:
        raise ValueError(f"features dtype must be one of {sorted(STORAGE_DTYPES)}, got {storage!r}")
    family = recipe.family.to_dict() if hasattr(recipe, "family") else dict(recipe)
    return {"format": FORMAT, "view_generator": VIEW_GENERATOR_VERSION, "samples_sha256": samples_sha256,
            "model": getattr(model, "name", str(model)),
            "checkpoint_sha256": checkpoint_sha256 or getattr(model, "checkpoint_sha256", None),
            "weights_sha256": None if checkpoint_sha256 else weights_sha256,
            "preprocess": dataclasses.asdict(model.preprocess) if hasattr(model, "preprocess") else None,
            "recipe": json.loads(json.dumps(family)), "n_views": int(n_views), "seed": int(seed),
            "precision": precision, "device": getattr(getattr(model, "device", None), "type", "cpu"),
            "storage": storage} | ({"corruption": json.loads(json.dumps(dict(corruption)))} if corruption else {}) \
        | ({"encoder": json.loads(json.dumps(dict(encoder), sort_keys=True))} if encoder else {})


def key_digest(key: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _warn(msg: str) -> None:
    print(f"shiftlab: warning: {msg}", file=sys.stderr, flush=True)


def _atomic_write(path: Path, data: bytes | str) -> None:
    """A store file, replaced whole (shiftlab.writes); a failure says the run's records are safe."""
    writes.write_file(path, data, store_advice())


# what a caller knows of a sample's content: its digest, or a function that computes it when needed
Digest = str | Callable[[], str | None] | None


class Entry:
    """The stored features of one key: `features(sid)` -> (N, D) float32 tensor or None; `label(sid)`
    and `source(sid)` say which sample they are, so stored features can be scored on their own."""

    def __init__(self, root: Path, key: Mapping[str, Any]):
        self.root, self.key = Path(root), dict(key)
        self.digest = key_digest(key)
        self.dir = self.root / self.digest
        # sid -> its copies (bin, row, sample info, row checksum): a sample re-stored after its shard was
        # found damaged has two, and the first intact one is read
        self._rows: dict[int, list[tuple[Path, int, dict, str]]] = {}
        self._shape: dict[Path, tuple[int, int, str, str]] = {}   # bin -> (N, D, storage, encoder's dtype)
        self._seen: set[Path] = set()
        self._bad: set[Path] = set()
        self.refresh()

    def __repr__(self) -> str:
        k = self.key
        return (f"<FeatureStore entry {self.digest}: {k.get('model')}, {k.get('n_views')} views "
                f"({(k.get('recipe') or {}).get('kind', 'views')}), seed {k.get('seed')}, {k.get('precision')}, "
                f"stored {k.get('storage')}; {len(self)} samples>")

    def refresh(self) -> None:
        """Read the index files of shards committed since the last call (not their features)."""
        if not self.dir.is_dir():
            return
        for index in sorted(self.dir.glob("*.json")):
            if index.name == "key.json" or index in self._seen:
                continue
            self._seen.add(index)
            try:
                meta = json.loads(index.read_text())
                if meta.get("index_sha256") != _index_digest(meta):
                    raise ValueError("its own checksum does not match")
                binary = index.with_suffix(".bin")
                n, d = int(meta["shape"][1]), int(meta["shape"][2])
                self._shape[binary] = (n, d, meta["dtype"], meta.get("features_dtype", "float32"))
                for row, (sid, info, sha) in enumerate(zip(meta["ids"], meta["samples"], meta["rows_sha256"],
                                                           strict=True)):
                    self._rows.setdefault(int(sid), []).append((binary, row, dict(info), sha))
            except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
                _warn(f"feature store: unreadable or altered shard index {index}; its samples are encoded again")

    def __contains__(self, sid: int) -> bool:
        return self.has(sid)

    def __len__(self) -> int:
        return len(self._rows)

    def ids(self) -> list[int]:
        return sorted(self._rows)

    def label(self, sid: int) -> int | None:
        """The label sample `sid` had when it was stored (None: not stored, or stored without one)."""
        found = self._copy(sid)
        return None if found is None else found[2].get("label")

    def source(self, sid: int) -> str | None:
        """Where sample `sid`'s image came from (a file; `shard.tar/member`; `file.parquet#row`)."""
        found = self._copy(sid)
        return None if found is None else found[2].get("source")

    def has(self, sid: int, path: str | os.PathLike | None = None, *, digest: Digest = None) -> bool:
        """Whether `sid` is stored and is still the same image: its content digest (`digest`, or
        computed from the file `path`) equals the stored one. With neither, whether anything is
        stored for `sid`."""
        return self._find(sid, path, digest) is not None

    def _find(self, sid: int, path: str | os.PathLike | None, digest: Digest) -> tuple[Path, int, dict, str] | None:
        """The first intact copy of `sid` stored from the same image (see `has`)."""
        copies = [c for c in self._rows.get(sid, ()) if c[0] not in self._bad]
        if not copies or (path is None and digest is None):
            return copies[0] if copies else None
        if callable(digest):
            digest = digest()
        elif digest is None and path is not None:
            try:
                digest = file_digest(path)
            except OSError:
                digest = None
        return next((c for c in copies if digest is not None and c[2].get("sha256") == digest), None)

    def _copy(self, sid: int) -> tuple[Path, int, dict, str] | None:
        return self._find(sid, None, None)

    def features(self, sid: int, path: str | os.PathLike | None = None, *,
                 digest: Digest = None) -> torch.Tensor | None:
        """(N, D) features of sample `sid` in the encoder's dtype (None: not stored, another image now
        (see `has`), or damaged)."""
        if callable(digest):
            digest = digest()
        found = self._find(sid, path, digest)
        if found is None:
            return None
        binary, row, info, sha = found
        n, d, dtype, out = self._shape[binary]
        storage = STORAGE_DTYPES[dtype]
        size = n * d * torch.empty((), dtype=storage).element_size()
        try:
            with open(binary, "rb") as fh:
                fh.seek(row * size)
                data = fh.read(size)
        except OSError:
            data = b""
        if len(data) != size or row_checksum(self.digest, sid, info.get("sha256"), data) != sha:
            self._bad.add(binary)
            _warn(f"feature store: shard {binary} is damaged or truncated, or its index was altered; "
                  "its samples are encoded again")
            return self.features(sid, path, digest=digest)   # another intact copy, or None
        return torch.frombuffer(bytearray(data), dtype=storage).view(n, d).to(getattr(torch, out))


class NotAFeatureStore(FileNotFoundError, ValueError):
    """`FeatureStore(root, "r")` on a folder (or file) that holds no store: missing, and a bad argument."""


class FeatureStore:
    """A feature store directory; mode "r" (no lock, many readers) or "w" (one writer: the lock).

    `lock` (mode "w") is a held runtime.lock.RunLock or None; the engine takes it per job with
    `engine.distributed.acquire_for_job` under torchrun and passes `lock=False` on ranks other than 0."""

    def __init__(self, root: str | os.PathLike, mode: str = "r", rank: int = 0, lock: Any = None):
        if not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"root must be a directory path, got {type(root).__name__}")
        if mode not in ("r", "w"):
            raise ValueError(f"mode must be 'r' or 'w', got {mode!r}")
        self.root, self.mode, self.rank = Path(root), mode, int(rank)
        self._entries: dict[str, Entry] = {}
        self._pending: dict[str, list[tuple[int, list, torch.Tensor, torch.dtype]]] = {}
        self._count = 0
        self.lock = None
        if mode == "r":
            if not (self.root / "store.json").is_file():
                raise NotAFeatureStore(f"root: {self.root} is not a feature store (no store.json)")
            return
        writes.make_dirs(self.root, store_advice())
        if lock is None:
            from .lock import RunLock
            lock = RunLock(self.root, purpose="feature store").acquire()
        self.lock = lock or None
        try:
            if self.lock is not None:   # the lock holder alone cleans: other ranks' temporaries are live
                for folder in (self.root, *(p for p in self.root.iterdir() if p.is_dir())):
                    writes.clean_orphans(folder)
            if not (self.root / "store.json").is_file():
                _atomic_write(self.root / "store.json", json.dumps({"format": FORMAT}).encode())
        except BaseException:
            self.close()   # nothing buffered yet: releases the lock
            raise

    def __repr__(self) -> str:
        keys = self.keys()
        models = sorted({str(k.get("model")) for k in keys})
        of = f" of {', '.join(models)}" if models else ""
        return (f"<FeatureStore {str(self.root)!r} ({'read-only' if self.mode == 'r' else 'writing'}): "
                f"{len(keys)} entr{'y' if len(keys) == 1 else 'ies'}{of}>")

    # reading
    def keys(self) -> list[dict[str, Any]]:
        """The key of every entry whose key.json is that entry's (its digest names the folder); any other is said
        (one warning) and left out: an edited key would list an empty entry and hide the stored one."""
        out = []
        for path in sorted(self.root.glob("*/key.json")):
            try:
                key = json.loads(path.read_text())
                digest = key_digest(key) if isinstance(key, dict) else None
            except (OSError, ValueError, TypeError) as exc:
                _warn(f"feature store: {path} is unreadable ({type(exc).__name__}); its entry is not listed")
                continue
            if digest != path.parent.name:
                _warn(f"feature store: {path} is not the key of its entry {path.parent.name} (edited or moved); "
                      "the entry is not listed")
                continue
            out.append(key)
        return out

    def entry(self, key: Mapping[str, Any]) -> Entry:
        digest = key_digest(key)
        if digest not in self._entries:
            self._entries[digest] = Entry(self.root, key)
        return self._entries[digest]

    def find(self, **match: Any) -> Entry:
        """The one entry whose key has these values (e.g. model="RN50", n_views=64, storage="fp16")."""
        hits = [k for k in self.keys() if all(k.get(f) == v for f, v in match.items())]
        if len(hits) != 1:
            raise ValueError(f"{len(hits)} entries of {self.root} match {match}; narrow the match "
                             f"(keys differ in: {_differing(hits)})" if hits else
                             f"no entry of {self.root} matches {match}")
        return self.entry(hits[0])

    # writing
    def put(self, key: Mapping[str, Any], sid: int, path: str | os.PathLike | None, features: torch.Tensor, *,
            info: Mapping[str, Any] | None = None) -> None:
        """Buffer (N, D) features of `sid`; a full shard is written at once, the rest by `flush`.
        `info`: the sample's identity (`sample_info`: source, content digest, label); without it,
        the file `path` gives it (`file_info`)."""
        if self.mode != "w":
            raise ValueError("put() needs a store opened with mode='w'")
        digest = key_digest(key)
        entry = self.entry(key)
        info = dict(info) if info is not None else file_info(path)
        if entry.has(sid, digest=info["sha256"] or ""):   # the same image is stored: nothing to add
            return
        buf = self._pending.setdefault(digest, [])
        if buf and features.dtype != buf[0][3]:
            self._write(digest)
            buf = self._pending.setdefault(digest, [])
        buf.append((int(sid), info, features.detach().to("cpu", STORAGE_DTYPES[key["storage"]], copy=True),
                    features.dtype))
        if len(buf) >= SHARD_ROWS:
            self._write(digest)

    def flush(self) -> None:
        for digest in list(self._pending):
            self._write(digest)

    def _write(self, digest: str) -> None:
        rows = self._pending.pop(digest, [])
        if not rows:
            return
        entry = self._entries[digest]
        writes.make_dirs(entry.dir, store_advice())
        if not (entry.dir / "key.json").is_file():
            _atomic_write(entry.dir / "key.json", json.dumps(entry.key, sort_keys=True, indent=1).encode())
        feats = torch.stack([r[2] for r in rows]).contiguous()
        blobs = [r[2].contiguous().view(torch.uint8).numpy().tobytes() for r in rows]
        self._count += 1
        name = f"r{self.rank:03d}-{os.getpid()}-{time.time_ns()}-{self._count:05d}"
        data = b"".join(blobs)
        _atomic_write(entry.dir / f"{name}.bin", data)
        meta = {"ids": [r[0] for r in rows], "samples": [r[1] for r in rows],
                "features_dtype": str(rows[0][3]).removeprefix("torch."),
                "rows_sha256": [row_checksum(digest, r[0], r[1]["sha256"], b) for r, b in zip(rows, blobs)],
                "shape": list(feats.shape), "dtype": entry.key["storage"], "sha256": hashlib.sha256(data).hexdigest()}
        meta["index_sha256"] = _index_digest(meta)
        _atomic_write(entry.dir / f"{name}.json", json.dumps(meta).encode())   # commits the shard
        entry.refresh()

    def close(self) -> None:
        try:
            if self.mode == "w":
                self.flush()
        finally:
            if self.lock is not None:
                self.lock.release()
                self.lock = None

    def __enter__(self) -> FeatureStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __iter__(self) -> Iterator[Entry]:
        return (self.entry(k) for k in self.keys())


def _differing(keys: Sequence[Mapping[str, Any]]) -> str:
    fields = sorted({f for k in keys for f in k if len({json.dumps(x.get(f), sort_keys=True) for x in keys}) > 1})
    return ", ".join(fields) or "nothing"

