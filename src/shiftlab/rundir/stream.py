"""A run's stream: the order in which its samples are evaluated, a function of the sample count (and labels),
the stream kind, its parameter and a seed alone (records, resume and the record schema all derive it).

Stream kinds (docs/PROTOCOLS.md says where each comes from):

* ``shuffled`` (``iid``): a seeded i.i.d. shuffle, ``torch.randperm(n)`` seeded by the run seed (the default;
  runs made before stream kinds existed are exactly this);
* ``sorted``: the dataset's own order (sample ids ascending);
* ``class-sorted``: all of class 0, then class 1, ... (stable by sample id): mariodoebler/test-time-adaptation's
  ``correlated`` setting with ``DELTA_DIRICHLET = 0`` (classification/datasets/data_loading.py:228-231);
* ``continual``: several datasets of one class list (domains) in sequence, each shuffled as ``shuffled`` does
  (one generator seeded once, drawing each domain's permutation in turn), the online state kept across them:
  mariodoebler/test-time-adaptation's ``continual`` setting (test_time.py resets only for ``reset_each_shift``);
* ``mixed``: the same domains shuffled together into one i.i.d. stream (its ``mixed_domains`` setting:
  data_loading.py:219-221 concatenates the domains' samples, then its loader shuffles them);
* ``dirichlet``: label shift, classes correlated in time by a Dirichlet of concentration ``delta`` (smaller:
  longer runs of one class): the same repository's ``sort_by_dirichlet`` (data_loading.py:329-384, after
  NOTE and RoTTA), drawn from ``numpy.random.RandomState(seed)`` as its global ``np.random`` after
  ``np.random.seed(seed)``.

``stream.json`` in a run directory records the stream as run (`write_stream`): its kind, seed, delta, the
sample ids in order and which of the run's methods are online, so that the report can draw accuracy over the
stream without rebuilding it, and `shiftlab merge` knows the run's samples. It carries `self_sha256`, the SHA-256
of the rest: one edited by hand, or not of this shape, is said and not read (`read_stream`); one written before the
checksum has none and is read as before.

``order_seeds(seed, k)``: the seeds of ``--orders K`` streams, as OGA draws its runs' shuffles (cfuchs2023/OGA
runner.py:54-55, ``default_rng(master_seed).choice(range(10000 * n_runs), n_runs, replace=False)``).
"""
from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import writes
from ..options import name_of, say

STREAM_KINDS = ("shuffled", "sorted", "class-sorted", "dirichlet", "continual", "mixed")
ALIASES = {"iid": "shuffled"}
SEEDED_KINDS = ("shuffled", "dirichlet", "continual", "mixed")   # their order depends on the seed (--orders K > 1)
DOMAIN_KINDS = ("continual", "mixed")   # streams over several datasets (shiftlab.datasets.domains)
DIRICHLET_TRIES = 1000    # the authors stop after 120 s of tries; a bounded count keeps the outcome machine-free


def canonical_kind(kind: str) -> str:
    """A stream kind's canonical name ("iid" -> "shuffled"); a one-line ValueError for an unknown one."""
    kind = ALIASES.get(kind, kind)
    if kind not in STREAM_KINDS:
        raise ValueError(f"stream order must be one of {', '.join(STREAM_KINDS + tuple(ALIASES))}, got {kind!r}")
    return kind


def stream_problem(kind: str, delta: float | None, orders: int = 1) -> str | None:
    """Why (kind, delta, orders) is not a stream, as one line; None when it is one."""
    try:
        kind = canonical_kind(kind)
    except ValueError as exc:
        return str(exc)
    if kind == "dirichlet":
        if delta is None:
            return (f"the dirichlet stream needs its concentration: {say('delta', 'D')} "
                    "(e.g. 0.01 on ImageNet-C, 0.1 as RoTTA)")
        if not (isinstance(delta, (int, float)) and math.isfinite(delta) and delta > 0):
            return f"{name_of('delta')} must be a finite number > 0, got {delta!r}"
    elif delta is not None:
        return (f"{name_of('delta')} is the dirichlet stream's concentration; the {kind} stream has none "
                f"(drop {name_of('delta')})")
    if not isinstance(orders, int) or isinstance(orders, bool) or orders < 1:
        return f"{name_of('orders')} must be an integer >= 1, got {orders!r}"
    if orders > 1 and kind not in SEEDED_KINDS:
        return (f"{say('orders', orders)}: the {kind} stream has one order only (it ignores the seed); "
                f"use {say('order', ' or '.join(SEEDED_KINDS))}")
    return None


def stream_order(n: int, order: str, seed: int, labels: Sequence[int] | None = None,
                 delta: float | None = None, domains: Sequence[int] | None = None) -> list[int]:
    """Sample ids 0..n-1 in the stream's order. `labels` (n ints) is needed by the label-aware kinds, `domains`
    (n domain indices, 0..D-1) by the domain streams."""
    kind = canonical_kind(order)
    if kind == "sorted":
        return list(range(n))
    if kind in DOMAIN_KINDS:
        if domains is None or len(domains) != n or len(set(domains)) < 2:
            raise ValueError(f"the {kind} stream runs several datasets of one class list as domains: give two or "
                             f"more ({say('datasets', 'a,b')} or {name_of('suite')})")
        if kind == "mixed":
            return stream_order(n, "shuffled", seed)
        import torch
        gen = torch.Generator().manual_seed(int(seed))
        order: list[int] = []
        for d in sorted(set(domains)):
            members = [i for i in range(n) if domains[i] == d]
            order += [members[j] for j in torch.randperm(len(members), generator=gen).tolist()]
        return order
    if kind == "shuffled":
        import torch  # here: reading a recorded stream (the report) needs no torch
        gen = torch.Generator().manual_seed(int(seed))
        return torch.randperm(n, generator=gen).tolist()
    if labels is None or len(labels) != n:
        raise ValueError(f"the {kind} stream needs the label of each of the {n} samples")
    if kind == "class-sorted":
        return sorted(range(n), key=lambda i: labels[i])
    if delta is None:
        raise ValueError("the dirichlet stream needs its concentration delta")
    return dirichlet_order(labels, float(delta), seed)


def dirichlet_order(labels: Sequence[int], delta: float, seed: int) -> list[int]:
    """Sample positions in a label-shifted order (mariodoebler/test-time-adaptation data_loading.py:329-384).

    Every class is split over C chunks (C: the classes, max label + 1) by Dirichlet(delta) proportions,
    skipping chunks already holding N / C samples; the draw is repeated until every chunk holds at least
    `min(10, N // C)` samples (ours: the authors' 10, which no dataset under 10 samples per class can reach,
    so their loop would end in its 120 s timeout); then each chunk is emitted class by class in a shuffled
    class order. Consumes `RandomState(seed)` exactly as their code consumes `np.random` after
    `np.random.seed(seed)`: with 10 or more samples per class the two orders are equal."""
    import numpy as np  # here: the CLI checks a stream's flags (`stream_problem`) without numpy
    rng = np.random.RandomState(int(seed) % 2 ** 32)
    class_labels = np.asarray(list(labels), dtype=np.int64)
    n = len(class_labels)
    if n == 0:
        return []
    n_classes = int(class_labels.max() + 1)
    n_chunks = n_classes
    min_size_thresh = min(10, n // n_chunks)
    members = [np.flatnonzero(class_labels == k) for k in range(n_classes)]   # each class's samples, sorted
    alpha, share, no_cuts = np.repeat(delta, n_chunks), n / n_chunks, np.zeros(n_chunks - 1, dtype=int)
    for _ in range(DIRICHLET_TRIES):
        # what the authors' lists of every chunk's samples decide is only each chunk's size: counted, not
        # concatenated (a try over 200 classes and 30,000 samples in milliseconds, not a tenth of a second)
        sizes = np.zeros(n_chunks, dtype=np.int64)
        drawn: list[tuple[np.ndarray, np.ndarray]] = []   # per class: (its shuffled samples, the cuts into chunks)
        for k in range(n_classes):
            if not len(members[k]):   # a class without samples draws its proportions and places nothing
                rng.dirichlet(alpha)
                drawn.append((members[k], no_cuts))
                continue
            idx_k = members[k].copy()
            rng.shuffle(idx_k)
            proportions = rng.dirichlet(alpha)
            # balance: a chunk that already holds its share takes no more
            proportions = proportions * (sizes < share)
            with np.errstate(invalid="ignore", divide="ignore"):   # 0 / 0 when no chunk is open: read below
                proportions = proportions / proportions.sum()
                cuts = (np.cumsum(proportions) * len(idx_k)).astype(int)[:-1]
            bounds = np.concatenate(([0], cuts, [len(idx_k)]))
            if (np.diff(bounds) >= 0).all():   # cuts in order, as np.split then gives: each part's size
                sizes += np.diff(bounds)
            else:   # rounding left no chunk open (0 / 0): np.split's own reading of the cuts
                sizes += np.fromiter(map(len, np.split(idx_k, cuts)), dtype=np.int64, count=n_chunks)
            drawn.append((idx_k, cuts))
        if sizes.min() >= min_size_thresh:
            break
    else:
        raise ValueError(f"no dirichlet stream with delta {delta} gives every one of the {n_chunks} chunks "
                         f"{min_size_thresh} samples in {DIRICHLET_TRIES} draws; try another {name_of('delta')} or "
                         f"{name_of('seed')}")
    parts_of = [np.split(idx_k, cuts) for idx_k, cuts in drawn]   # per class: its part in each chunk
    order: list[int] = []
    for chunk in range(n_chunks):
        cls_seq = list(range(n_classes))
        rng.shuffle(cls_seq)
        for cls in cls_seq:
            order.extend(int(i) for i in parts_of[cls][chunk])
    return order


def order_seeds(seed: int, orders: int) -> list[int]:
    """The stream seeds of `orders` orders: the run seed alone for one order (today's stream); else OGA's
    draw of its runs' seeds from the run seed as master seed (OGA runner.py:54-55)."""
    if orders <= 1:
        return [int(seed)]
    import numpy as np
    rng = np.random.default_rng(int(seed))
    return [int(s) for s in rng.choice(range(10000 * orders), size=orders, replace=False)]


STREAM_FILE = "stream.json"


def write_stream(run_dir: Path | str, ids: Sequence[int], kind: str, seed: int, delta: float | None,
                 online: Sequence[str], batch_size: int | None, domains: Sequence[str] | None = None,
                 domain_index: Sequence[int] | None = None) -> None:
    """Record the run's stream (`STREAM_FILE`): {"order", "seed", "delta", "batch_size", "online", "ids"}, and
    for a stream of domains "domains" (their names) and "domain_of" (each id's domain, in stream order)."""
    path = Path(run_dir) / STREAM_FILE
    data = {"order": canonical_kind(kind), "seed": int(seed), "delta": delta, "batch_size": batch_size,
            "online": list(online), "ids": [int(i) for i in ids]}
    if domains is not None and domain_index is not None:
        data["domains"] = list(domains)
        data["domain_of"] = [int(domain_index[i]) for i in ids]
    data[SELF_CHECKSUM] = _checksum(data)
    writes.write_file(path, json.dumps(data) + "\n", writes.resume_advice())


SELF_CHECKSUM = "self_sha256"


def _checksum(data: dict[str, Any]) -> str:
    body = {k: v for k, v in data.items() if k != SELF_CHECKSUM}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_stream(run_dir: Path | str) -> dict[str, Any] | None:
    """A run directory's recorded stream, or None: a run made before streams were recorded, or a file that is not
    one as written (damaged, edited by hand, another shape: said in one warning)."""
    path = Path(run_dir) / STREAM_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return _unread(f"{path} is not a stream record ({type(exc).__name__})")
    if not (isinstance(data, dict) and isinstance(data.get("ids"), list) and all(map(_is_int, data["ids"]))
            and isinstance(data.get("online"), list) and all(isinstance(n, str) for n in data["online"])
            and isinstance(data.get("order", ""), str)
            and (data.get("delta") is None or (isinstance(data["delta"], (int, float)) and not isinstance(
                data["delta"], bool)))):
        return _unread(f"{path} is not a stream record (order, ids, online)")
    if SELF_CHECKSUM in data and data[SELF_CHECKSUM] != _checksum(data):
        return _unread(f"{path} does not match its own checksum (edited by hand?)")
    return data


def _unread(why: str) -> None:
    print(f"shiftlab: warning: {why}; it is not read", file=sys.stderr, flush=True)
    return None
