"""Interleaved rounds: the floor, each method alone, all methods together, and the projection.

One round runs, on the same decoded views (decoded once, before the rounds):

1. the **floor**: the image tower over all views of every image, nothing else (what any
   method reading the views must pay);
2. each method **alone**, through the engine's step (`Runner.step`: encode + the method);
3. with a baseline, that method's straightforward **baseline** right after it;
4. **all methods** in one step.

Rounds repeat A, B, C, ... A, B, C, ... in one process, so that a busy machine's load changes
hit every measurement alike; each figure is the median over rounds with its spread (min, max),
and each ratio (to the floor, baseline / library) is taken within a round, then its median.
Decoding and view generation are outside these figures: a run does them in DataLoader workers
(`loader` in the result measures them), and the projection takes the slower of the two.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..phases import PhaseTimer
from ..step import DEFAULT_RECIPE, BatchItem, Evaluator, Runner

IMAGENET_R_IMAGES = 30_000


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, min, max and the values themselves."""
    vals = [float(v) for v in values]
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "values": vals}


def _batches(items: Sequence[BatchItem], size: int):
    for start in range(0, len(items), max(size, 1)):
        yield list(items[start:start + size])


def _floor(ev: Evaluator, items: Sequence[BatchItem], batch_size: int, now: Callable[[], float]) -> float:
    t0 = now()
    for batch in _batches(items, batch_size):
        ev.contexts([item.views[DEFAULT_RECIPE] for item in batch], [item.sample_id for item in batch],
                    all_views=True)
    return now() - t0


def _pass(ev: Evaluator, source: Any, items: Sequence[BatchItem], methods: Sequence[str], batch_size: int,
          timer: PhaseTimer) -> float:
    runner = Runner(ev, source, {}, methods=list(methods), timer=timer)
    t0 = timer.now()
    for batch in _batches(items, batch_size):
        runner.step(batch)
    seconds = timer.now() - t0
    timer.take()
    return seconds


def measure_rounds(ev: Evaluator, source: Any, items: Sequence[BatchItem], methods: Sequence[str], rounds: int,
                   batch_size: int, timer: PhaseTimer,
                   baselines: Mapping[str, Callable[[BatchItem], torch.Tensor]] | None = None,
                   log: Callable[[str], None] = lambda msg: None) -> dict[str, Any]:
    """Seconds per image over `rounds` interleaved rounds (see the module docstring)."""
    baselines = baselines or {}
    n = len(items)
    per_image: dict[str, list[float]] = {"floor": [], "all_methods": []}
    per_image |= {f"alone:{m}": [] for m in methods} | {f"baseline:{m}": [] for m in baselines}
    for r in range(rounds):
        timer.take()
        per_image["floor"].append(_floor(ev, items, batch_size, timer.now) / n)
        for name in methods:
            per_image[f"alone:{name}"].append(_pass(ev, source, items, [name], batch_size, timer) / n)
            if name in baselines:
                t0 = timer.now()
                for item in items:
                    baselines[name](item)
                per_image[f"baseline:{name}"].append((timer.now() - t0) / n)
        per_image["all_methods"].append(_pass(ev, source, items, methods, batch_size, timer) / n)
        log(f"  round {r + 1}/{rounds}: floor {per_image['floor'][-1]:.3f} s/image, all methods "
            f"{per_image['all_methods'][-1]:.3f} s/image")

    floor = per_image["floor"]

    def ratio(key: str, to: list[float]) -> dict[str, Any]:
        return spread([a / b for a, b in zip(per_image[key], to)])

    out: dict[str, Any] = {
        "rounds": rounds, "images": n,
        "floor_seconds_per_image": spread(floor),
        "all_methods_seconds_per_image": spread(per_image["all_methods"]),
        "all_methods_ratio_to_floor": ratio("all_methods", floor),
        "methods": {},
    }
    for name in methods:
        row = {"seconds_per_image": spread(per_image[f"alone:{name}"]),
               "ratio_to_floor": ratio(f"alone:{name}", floor)}
        if name in baselines:
            row["baseline_seconds_per_image"] = spread(per_image[f"baseline:{name}"])
            row["speedup"] = ratio(f"baseline:{name}", per_image[f"alone:{name}"])
        out["methods"][name] = row
    return out


def projection(rounds: dict[str, Any], loader_seconds_per_image: float | None,
               images: int = IMAGENET_R_IMAGES) -> dict[str, Any]:
    """Projected wall time of `images` images on this device: the model's median seconds per image
    times `images`, or the loader's if it is slower (loader and model run concurrently in a run)."""
    loader = loader_seconds_per_image or 0.0

    def wall(model_spi: float) -> float:
        return images * max(model_spi, loader)

    return {
        "images": images,
        "loader_seconds": images * loader,
        "floor_seconds": wall(rounds["floor_seconds_per_image"]["median"]),
        "all_methods_seconds": wall(rounds["all_methods_seconds_per_image"]["median"]),
        "methods_seconds": {name: wall(r["seconds_per_image"]["median"]) for name, r in rounds["methods"].items()},
        "note": "median model seconds per image x images, or the loader's seconds if larger",
    }
