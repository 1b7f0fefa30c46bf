"""A run's stream: the order in which its samples are evaluated, a function of the sample count, the
order setting and the run seed alone (records, resume and the record schema all derive it)."""
from __future__ import annotations

import torch


def stream_order(n: int, order: str, seed: int) -> list[int]:
    if order == "sorted":
        return list(range(n))
    if order != "shuffled":
        raise ValueError(f"order must be 'shuffled' or 'sorted', got {order!r}")
    gen = torch.Generator().manual_seed(int(seed))
    return torch.randperm(n, generator=gen).tolist()
