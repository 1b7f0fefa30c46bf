"""torchrun support and online-state checkpoints.

Under torchrun (RANK/WORLD_SIZE set) each rank takes the stream positions
`rank, rank + world, ...`, writes `shards/records-rank<r>.jsonl`, and rank 0
merges after a barrier. Per-sample seeding makes the records identical to a
single-process run.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from . import results


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0


def context() -> DistContext:
    """Rank and world size from torchrun's environment; initialises the process group once."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext()
    import torch.distributed as dist
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend)
    return DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(),
                       local_rank=int(os.environ.get("LOCAL_RANK", "0")))


def shard(order: Sequence[int], ctx: DistContext, online_present: bool = False) -> list[int]:
    if ctx.world_size > 1 and online_present:
        raise ValueError("online methods adapt along one stream; run them in a single process "
                         "(drop them from --methods under torchrun and run them separately)")
    return list(order[ctx.rank::ctx.world_size])


def records_path(run_dir: Path, ctx: DistContext) -> Path:
    if ctx.world_size == 1:
        return Path(run_dir) / results.RECORDS
    return Path(run_dir) / results.SHARDS / f"records-rank{ctx.rank}.jsonl"


def barrier(ctx: DistContext) -> None:
    if ctx.world_size > 1:
        import torch.distributed as dist
        dist.barrier()


class OnlineState:
    """Checkpoint of online methods' state, saved atomically BEFORE each batch's records.

    It also holds that batch's online records, so a process killed between the
    checkpoint and the append gets them written back on resume: state and records
    never disagree, and a resumed stream equals an uninterrupted one.
    """

    FILE = "online_state.pt"

    def __init__(self, run_dir: Path, methods: dict):
        self.path = Path(run_dir) / self.FILE
        self.methods = methods
        self.processed: list[int] = []
        self.last_records: list[dict] = []

    def load(self) -> None:
        if not self.path.is_file():
            return
        blob = torch.load(self.path, map_location="cpu", weights_only=False)
        for name, method in self.methods.items():
            if name in blob["states"]:
                method.load_state_dict(blob["states"][name])
        self.processed = list(blob["processed"])
        self.last_records = list(blob["last_records"])

    def restore_missing(self, writer: results.RecordWriter, done: set) -> None:
        missing = [r for r in self.last_records if results.record_key(r) not in done]
        writer.write(missing)
        done.update(results.record_key(r) for r in missing)

    def save(self, ids: Sequence[int], online_records: list[dict]) -> None:
        self.processed.extend(ids)
        blob = {"states": {n: m.state_dict() for n, m in self.methods.items()},
                "processed": self.processed, "last_records": online_records}
        tmp = self.path.with_suffix(".tmp")
        torch.save(blob, tmp)
        os.replace(tmp, self.path)
