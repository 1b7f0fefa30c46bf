"""torchrun support (one run over many processes) and online-state checkpoints.

Under torchrun (RANK/WORLD_SIZE set; see docs/SCALE_OUT.md):

- `context()` initialises a gloo process group (coordination only: the engine runs
  no GPU collectives), pins the rank to `cuda:LOCAL_RANK`, and splits CPU threads
  among the ranks of a node.
- `plan()` assigns work. The stream is cut into blocks of `batch_size` positions,
  exactly the batches a single process would run; rank r takes blocks
  `r, r + world, ...` for the episodic methods (disjoint, deterministic). Keeping a
  single process's batches (not just its samples) keeps results bit-identical even
  where a kernel's rounding depends on the batch shape (CPU matmuls with one row,
  cuBLAS/cuDNN algorithm choice). Online methods (`episodic = False`) adapt along ONE
  stream, so rank 0 runs them over the whole stream, in order, while the episodic
  work stays sharded across all ranks.
- Every rank appends to its own `shards/records-rank<r>.jsonl` (append-only, a torn
  last line is cut before appending), so shards of an interrupted run with another
  world size are extended, never overwritten; `--resume` reads records.jsonl plus
  every shard, whatever world size wrote them.
- `prior_records()` is a collective: every rank reads the existing records before
  any rank writes, and all ranks agree whether the run directory is fresh.
- `gather_timings()` is a collective too: rank 0 gets every rank's timings (and
  checks it can see every rank's shard), then merges and writes the summary.

Per-sample seeding makes the records identical to a single-process run.
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from . import results

TIMEOUT_ENV = "SHIFTLAB_DIST_TIMEOUT"      # seconds a rank may wait for the others (default 7 days)
THREADS_ENV = "SHIFTLAB_NUM_THREADS"       # torch CPU threads per process (overrides the default split)
DEFAULT_TIMEOUT_S = 7 * 24 * 3600


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def context() -> DistContext:
    """Rank and world size from torchrun's environment; sets up the process once.

    World size 1 (no torchrun, or `--nproc-per-node 1` on one node): no process group.
    Otherwise: CPU threads per rank (`set_threads`), `torch.cuda.set_device(LOCAL_RANK)`
    when that GPU exists, and a gloo process group with a long timeout (ranks wait for
    rank 0 at the end, which may run online methods over the whole stream).
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        set_threads(1)
        return DistContext()
    import torch.distributed as dist
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    set_threads(local_world)
    if torch.cuda.is_available() and local_rank < torch.cuda.device_count():
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        timeout = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
        dist.init_process_group(backend="gloo", timeout=timedelta(seconds=timeout))
    return DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(),
                       local_rank=local_rank, local_world_size=local_world)


def set_threads(local_world_size: int) -> int | None:
    """torch CPU threads for this process; returns the number set, or None when left alone.

    SHIFTLAB_NUM_THREADS wins. Otherwise, with several processes on a node, each gets
    max(1, usable CPUs // processes on the node), unless OMP_NUM_THREADS is set to
    something other than 1 (torchrun sets 1 when it is unset, which starves CPU runs).
    """
    explicit = os.environ.get(THREADS_ENV)
    if explicit:
        n = max(1, int(explicit))
    elif local_world_size > 1 and os.environ.get("OMP_NUM_THREADS", "1") == "1":
        n = max(1, _usable_cpus() // local_world_size)
    else:
        return None
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def shutdown() -> None:
    """Destroy the process group (end of a torchrun run); a no-op without one."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def shard(order: Sequence[int], ctx: DistContext, online_present: bool = False, block: int = 1) -> list[int]:
    """This rank's samples for episodic methods: blocks `rank, rank + world, ...` of `block`
    consecutive stream positions (`block=1`: `order[rank::world]`), in stream order.

    `online_present` is accepted for compatibility; online methods are placed by `plan`.
    """
    block = max(1, int(block))
    return [sid for i, sid in enumerate(order) if (i // block) % ctx.world_size == ctx.rank]


@dataclass
class Plan:
    """Which (sample, method) pairs this rank evaluates, and in which batches.

    `ids`: the samples this rank may touch, in stream order (rank 0 with online
    methods: the whole stream; otherwise its shard). `owns(sid, method)` says whether
    this rank writes that method's records for that sample.
    """
    ids: list[int]
    mine: set[int]
    episodic: tuple[str, ...]
    online: tuple[str, ...]
    block: int = 1
    position: dict[int, int] = field(default_factory=dict, repr=False)   # sample id -> stream position
    _online_set: frozenset = field(default=frozenset(), repr=False)

    def __post_init__(self):
        self._online_set = frozenset(self.online)
        if not self.position:
            self.position = {sid: i for i, sid in enumerate(self.ids)}

    def owns(self, sid: int, method: str) -> bool:
        return method in self._online_set or (sid in self.mine and method not in self._online_set
                                              and method in self.episodic)

    def pending(self, settings: Iterable[str], done: set) -> list[int]:
        """Samples with at least one owned (method, setting) record missing, in stream order.

        An error record with method None covers every method of its setting.
        """
        settings = list(settings)
        methods = self.episodic + self.online
        return [sid for sid in self.ids
                if any(self.owns(sid, n) and (sid, n, s) not in done and (sid, None, s) not in done
                       for n in methods for s in settings)]

    def batches(self, pending: Sequence[int]) -> list[list[int]]:
        """Indices into `pending`, grouped by stream block: a fresh run gets exactly a single
        process's batches; after a resume only the interrupted blocks are smaller."""
        out: list[list[int]] = []
        last = None
        for i, sid in enumerate(pending):
            blk = self.position[sid] // self.block
            if blk != last:
                out.append([])
                last = blk
            out[-1].append(i)
        return out


def plan(order: Sequence[int], ctx: DistContext, methods: Mapping[str, Any], block: int = 1) -> Plan:
    """Assign work: episodic methods sharded over all ranks by blocks of `block` stream
    positions (use the batch size), online methods on rank 0 over the whole stream."""
    episodic = tuple(n for n, m in methods.items() if getattr(m, "episodic", True))
    online = tuple(n for n, m in methods.items() if not getattr(m, "episodic", True))
    block = max(1, int(block))
    position = {sid: i for i, sid in enumerate(order)}
    mine = shard(order, ctx, block=block)
    if ctx.world_size == 1:
        return Plan(list(order), set(order), episodic, online, block, position)
    if ctx.rank == 0 and online:
        return Plan(list(order), set(mine), episodic, online, block, position)
    return Plan(mine, set(mine), episodic, (), block, position)


def records_path(run_dir: Path, ctx: DistContext) -> Path:
    if ctx.world_size == 1:
        return Path(run_dir) / results.RECORDS
    return Path(run_dir) / results.SHARDS / f"records-rank{ctx.rank}.jsonl"


def _all_gather(ctx: DistContext, obj: Any) -> list[Any]:
    if ctx.world_size == 1:
        return [obj]
    import torch.distributed as dist
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def prior_records(run_dir: Path, resume: bool, ctx: DistContext) -> set[tuple]:
    """Done keys of the run directory (records.jsonl and every shard) for `--resume`.

    A collective under torchrun: every rank reads before any rank writes, and all
    ranks raise FileExistsError together when a fresh run (no --resume) would mix
    with existing records.
    """
    files = results.record_files(run_dir)
    occupied = bool(files) and not resume
    done = results.done_keys(results.load_records(run_dir)) if resume else set()
    if any(_all_gather(ctx, occupied)):
        raise FileExistsError(f"{run_dir} already holds records; pass --resume to continue it or choose another --out")
    return done


def gather_timings(ctx: DistContext, run_dir: Path, wall_seconds: float, images: int,
                   encode_seconds: float) -> dict | None:
    """Collect every rank's timings on rank 0 (a collective); None on the other ranks.

    Rank 0 gets `wall_seconds` (the slowest rank), `images` (image encodings over all
    ranks), `shared_seconds_per_image` (encoding time per image, not divided by the
    number of ranks) and `per_rank`. It also returns None, after a message on stderr,
    when it cannot see a shard another rank wrote (the run directory is not on a
    filesystem shared by all nodes): then the shards must be copied together and
    merged with `shiftlab merge`.
    """
    if ctx.world_size == 1:
        return {"wall_seconds": wall_seconds, "images": images,
                "shared_seconds_per_image": encode_seconds / max(images, 1)}
    path = records_path(run_dir, ctx)
    size = path.stat().st_size if path.is_file() else 0
    mine = {"rank": ctx.rank, "host": os.uname().nodename if hasattr(os, "uname") else "",
            "wall_seconds": wall_seconds, "images": images, "encode_seconds": encode_seconds,
            "shard": str(path.relative_to(run_dir)), "shard_bytes": size}
    everyone = _all_gather(ctx, mine)
    if ctx.rank != 0:
        return None
    unseen = [p for p in everyone if p["shard_bytes"] and
              (not (Path(run_dir) / p["shard"]).is_file()
               or (Path(run_dir) / p["shard"]).stat().st_size < p["shard_bytes"])]
    if unseen:
        print(f"shiftlab: rank 0 cannot see the record shards of rank(s) "
              f"{', '.join(str(p['rank']) + '@' + p['host'] for p in unseen)} under {run_dir}: the run directory "
              f"is not shared by all nodes. Copy every node's {results.SHARDS}/ into one run directory and run "
              f"`shiftlab merge RUN_DIR`.", file=sys.stderr)
        return None
    total = sum(p["images"] for p in everyone)
    return {"wall_seconds": max(p["wall_seconds"] for p in everyone), "images": total,
            "shared_seconds_per_image": sum(p["encode_seconds"] for p in everyone) / max(total, 1),
            "ranks": ctx.world_size,
            "per_rank": [{k: p[k] for k in ("rank", "host", "wall_seconds", "images", "encode_seconds")}
                         for p in everyone]}


def barrier(ctx: DistContext) -> None:
    if ctx.world_size > 1:
        import torch.distributed as dist
        dist.barrier()


class OnlineState:
    """Checkpoint of online methods' state together with their records.

    Online records are held back and appended right after a checkpoint of the state
    that produced them (atomic file replace); the checkpoint also keeps those records,
    so a process killed between the two gets them written back on resume. State and
    records therefore never disagree, and a resumed stream equals an uninterrupted one.
    Checkpoints are taken at most every `every_seconds` (a DMN memory is tens of MB),
    so a kill loses at most that much online work, which the resume redoes.
    Under torchrun only rank 0 runs online methods, so only rank 0 writes this file.
    """

    FILE = "online_state.pt"

    def __init__(self, run_dir: Path, methods: dict, every_seconds: float = 60.0):
        self.path = Path(run_dir) / self.FILE
        self.methods = methods
        self.every_seconds = every_seconds
        self.processed: list[int] = []
        self.last_records: list[dict] = []
        self._pending_ids: list[int] = []
        self._pending_records: list[dict] = []
        self._last_save = time.monotonic()

    def load(self, stream: Sequence[int] | None = None) -> None:
        if not self.path.is_file():
            return
        blob = torch.load(self.path, map_location="cpu", weights_only=True)
        processed = list(blob["processed"])
        if stream is not None and list(stream[:len(processed)]) != processed:
            raise ValueError(f"{self.path} was built along a different stream (another --seed, --order or "
                             "dataset); resuming would continue that state on this stream. Use the original "
                             "settings or a new --out")
        for name, method in self.methods.items():
            if name in blob["states"]:
                method.load_state_dict(blob["states"][name])
        self.processed = processed
        self.last_records = list(blob["last_records"])

    def restore_missing(self, writer: results.RecordWriter, done: set) -> None:
        missing = [r for r in self.last_records if results.record_key(r) not in done]
        writer.write(missing)
        done.update(results.record_key(r) for r in missing)

    def add(self, ids: Sequence[int], online_records: list[dict], writer: results.RecordWriter) -> None:
        """Hold a batch's online records; checkpoint and append them when the interval has passed."""
        self._pending_ids.extend(ids)
        self._pending_records.extend(online_records)
        if time.monotonic() - self._last_save >= self.every_seconds:
            self.flush(writer)

    def flush(self, writer: results.RecordWriter) -> None:
        if not self._pending_ids:
            return
        self.save(self._pending_ids, self._pending_records)
        writer.write(self._pending_records)
        self._pending_ids, self._pending_records = [], []
        self._last_save = time.monotonic()

    def save(self, ids: Sequence[int], online_records: list[dict]) -> None:
        self.processed.extend(ids)
        blob = {"states": {n: m.state_dict() for n, m in self.methods.items()},
                "processed": self.processed, "last_records": online_records}
        tmp = self.path.with_suffix(".tmp")
        torch.save(blob, tmp)
        os.replace(tmp, self.path)
