"""torchrun support: the process group, threads per rank, and the two collectives of a run.

Under torchrun (RANK/WORLD_SIZE set; see docs/SCALE_OUT.md):

- `context()` initialises a gloo process group (coordination only: the engine runs
  no GPU collectives), pins the rank to `cuda:LOCAL_RANK`, and splits CPU threads
  among the ranks of a node. Who does what is planned in `runtime.planning`.
- Every rank appends to its own `shards/records-rank<r>.jsonl` (`records_path`;
  append-only, a torn last line is cut before appending), so shards of an interrupted
  run with another world size are extended, never overwritten; `--resume` reads
  records.jsonl plus every shard, whatever world size wrote them.
- `prior_records()` is a collective: every rank reads the existing records before
  any rank writes, and all ranks agree whether the run directory is fresh.
- `gather_timings()` is a collective too: rank 0 gets every rank's timings (and
  checks it can see every rank's shard), then merges and writes the summary.

Per-sample seeding makes the records identical to a single-process run.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from ..options import say
from ..rundir import record_files, records
from ..rundir.lock import RunLock, RunLockedError
from ..rundir.record_files import RunDirError

TIMEOUT_ENV = "SHIFTLAB_DIST_TIMEOUT"      # seconds a rank may wait for the others (default 7 days)
THREADS_ENV = "SHIFTLAB_NUM_THREADS"       # torch CPU threads per process (overrides the default split)
DEFAULT_TIMEOUT_S = 7 * 24 * 3600


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1


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


def records_path(run_dir: Path, ctx: DistContext) -> Path:
    if ctx.world_size == 1:
        return Path(run_dir) / record_files.RECORDS
    return Path(run_dir) / record_files.SHARDS / f"records-rank{ctx.rank}.jsonl"


def all_gather(ctx: DistContext, obj: Any) -> list[Any]:
    if ctx.world_size == 1:
        return [obj]
    import torch.distributed as dist
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def prior_records(run_dir: Path, resume: bool, ctx: DistContext,
                  schema: records.RecordSchema | None = None) -> set[tuple]:
    """Done keys of the run directory (records.jsonl and every shard) for `--resume`.

    A collective under torchrun: every rank reads before any rank writes, and all
    ranks raise FileExistsError together when a fresh run (no --resume) would mix
    with existing records. On resume, rank 0 (which holds the run lock) first moves
    the lines `schema` refuses (damaged, or not this run's) to the quarantine file, so their
    samples count as not done; every rank then reads with the same schema.
    """
    if resume:
        if ctx.rank == 0:
            record_files.quarantine(run_dir, schema=schema)
        all_gather(ctx, None)   # the others read only after the quarantine
    files = record_files.record_files(run_dir)
    occupied = bool(files) and not resume
    done = record_files.done_keys(record_files.load_records(run_dir, schema)) if resume else set()
    if any(all_gather(ctx, occupied)):
        raise FileExistsError(f"{run_dir} already holds records; pass {say('resume')} to continue it or choose "
                              f"{say('out')}")
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
    everyone = all_gather(ctx, mine)
    if ctx.rank != 0:
        return None
    unseen = [p for p in everyone if p["shard_bytes"] and
              (not (Path(run_dir) / p["shard"]).is_file()
               or (Path(run_dir) / p["shard"]).stat().st_size < p["shard_bytes"])]
    if unseen:
        print(f"shiftlab: rank 0 cannot see the record shards of rank(s) "
              f"{', '.join(str(p['rank']) + '@' + p['host'] for p in unseen)} under {run_dir}: the run directory "
              f"is not shared by all nodes. Copy every node's {record_files.SHARDS}/ into one run directory and run "
              f"`shiftlab merge RUN_DIR`.", file=sys.stderr)
        return None
    total = sum(p["images"] for p in everyone)
    return {"wall_seconds": max(p["wall_seconds"] for p in everyone), "images": total,
            "shared_seconds_per_image": sum(p["encode_seconds"] for p in everyone) / max(total, 1),
            "ranks": ctx.world_size,
            "per_rank": [{k: p[k] for k in ("rank", "host", "wall_seconds", "images", "encode_seconds")}
                         for p in everyone]}


def acquire_for_job(run_dir: Path, ctx: DistContext, purpose: str = "run") -> RunLock | None:
    """Rank 0 takes the lock; every rank raises RunLockedError together if it is refused.

    Returns the held lock on rank 0 (release it at the end of the run), None on other ranks."""
    lock = RunLock(run_dir, purpose) if ctx.rank == 0 else None
    problem = None
    if lock is not None:
        try:
            lock.acquire()
        except RunLockedError as exc:
            problem = ("locked", str(exc), None, None)
        except OSError as exc:
            problem = ("os", exc.errno, exc.strerror or str(exc), exc.filename, getattr(exc, "advice", None))
    problems = [p for p in all_gather(ctx, problem) if p]
    if problems:
        if lock is not None:
            lock.release()
        kind, *details = problems[0]
        raise RunLockedError(details[0]) if kind == "locked" else RunDirError(*details)
    return lock
