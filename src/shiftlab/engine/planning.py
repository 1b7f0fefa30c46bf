"""Work planning: which (sample, method) pairs each process evaluates, and in which batches.

The stream is cut into blocks of `batch_size` positions, exactly the batches a single
process would run; rank r takes blocks `r, r + world, ...` for the episodic methods
(disjoint, deterministic). Keeping a single process's batches (not just its samples)
keeps results bit-identical even where a kernel's rounding depends on the batch shape
(CPU matmuls with one row, cuBLAS/cuDNN algorithm choice). Online methods
(`episodic = False`) adapt along ONE stream, so rank 0 runs them over the whole stream,
in order, while the episodic work stays sharded across all ranks.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..rundir.records import is_missing
from .distributed import DistContext


def shard(order: Sequence[int], ctx: DistContext, block: int = 1) -> list[int]:
    """This rank's samples for episodic methods: blocks `rank, rank + world, ...` of `block`
    consecutive stream positions (`block=1`: `order[rank::world]`), in stream order."""
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

    def __post_init__(self) -> None:
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
                if any(self.owns(sid, n) and is_missing(sid, n, s, done) for n in methods for s in settings)]

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
    episodic = tuple(n for n, m in methods.items() if getattr(getattr(m, "spec", m), "episodic", True))
    online = tuple(n for n, m in methods.items() if not getattr(getattr(m, "spec", m), "episodic", True))
    block = max(1, int(block))
    position = {sid: i for i, sid in enumerate(order)}
    mine = shard(order, ctx, block=block)
    if ctx.world_size == 1:
        return Plan(list(order), set(order), episodic, online, block, position)
    if ctx.rank == 0 and online:
        return Plan(list(order), set(mine), episodic, online, block, position)
    return Plan(mine, set(mine), episodic, (), block, position)
