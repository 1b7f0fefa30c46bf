"""`shiftlab bench`: where the time goes, and how much the library saves.

For a fixed set of images (synthetic JPEGs, or the first N of a dataset) it measures:

1. every method in ONE pass (what `shiftlab run --methods a,b,c` costs): decode + views
   once, the image tower once for all views, then each method;
2. the loader alone (decode + views in DataLoader workers), to say whether the loader or
   the model limits throughput;
3. each method ALONE (what a one-method run costs): decode + the views that method needs
   (all, or view 0 only), encoding, the method; split into decode+views, image encoding,
   text tower (prompt tuning: `ContextPrompt.features` calls + the backward passes through
   them) and the rest of the method;
4. right after each method, its straightforward baseline (`shiftlab.bench.baseline`), one
   image at a time on the SAME views: seconds per image (with the same decode+views time
   added), the speed-up, top-1 agreement and the largest logit difference. Measuring the
   pair back to back keeps a busy machine's load changes from favouring either side;
5. `repeats` interleaved rounds (`shiftlab.bench.rounds`) of the floor (the image tower over
   the views alone), each method alone (+ its baseline), all methods together: medians with
   their spread, the ratios to the floor, and the projected time of the full ImageNet-R.

Peak memory is per phase: `torch.cuda.max_memory_allocated` on CUDA; on the CPU the
process's resident set size, sampled every few milliseconds from /proc (the process-wide
`ru_maxrss` only ever grows, so it cannot tell phases apart; it is reported as well).
Every pass runs the engine's own step (`shiftlab.engine.step.Runner`: `load` then `step`) and reads
its phase timer (`shiftlab.engine.phases`), so what is measured is what `shiftlab run` executes.
Timings are wall-clock with CUDA synchronised at every boundary; warm-up images run
through every path first and are not timed.
"""
from __future__ import annotations

import ctypes
import gc
import os
import platform
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch.utils.data import DataLoader

from ..datasets.imageio import decode_image
from ..engine.config import expand_methods, resolve_workers
from ..engine.phases import PhaseTimer
from ..engine.step import DEFAULT_RECIPE, BatchItem, Evaluator, Runner, ViewDataset
from ..methods.base import MethodOutput, list_methods
from ..models import ClipModel
from ..views.generator import ViewConfig, ViewGenerator
from .baseline import BASELINES, BaselineUnsupported, create_baseline
from .rounds import FULL_VIEWS, measure_rounds, projection

DEFAULT_METHODS = ("zeroshot", "prompt_ensemble", "view_ensemble", "tpt", "ctpt", "rtpt", "mta")
MiB = 1024 * 1024


@dataclass
class BenchConfig:
    methods: list[str] | None = None          # None: the DEFAULT_METHODS that are registered
    images: int = 3                           # timed images
    warmup: int = 1                           # untimed images run through every path first
    views: int = 64
    seed: int = 0
    batch_size: int = 8                       # images per engine step (shared encoding)
    workers: int = -1                         # DataLoader workers of the loader measurement; -1: as `shiftlab run`
    precision: str = "auto"                   # as `shiftlab run --precision` (fp16 autocast on CUDA, fp32 on CPU)
    baseline: bool = True
    baseline_methods: list[str] | None = None  # None: every measured method that has a baseline
    baseline_warmup: int | None = None        # warm-up images of each baseline; None: `warmup`
    method_config: dict[str, dict[str, Any]] = field(default_factory=dict)
    image_size: tuple[int, int] = (320, 256)  # synthetic images, (width, height)
    threads: int | None = None                # torch intra-op threads for the run; None: leave as is
    repeats: int = 3                          # interleaved rounds of floor / alone (+ baseline) / all; 0: none
    alone: bool = True                        # measure each method alone (and its baseline); False: all together only
    target_views: int = FULL_VIEWS            # the projection's views per image (scaled from `views` if different)


def default_methods() -> list[str]:
    registered = set(list_methods())
    return [m for m in DEFAULT_METHODS if m in registered]


def bench_classnames(n: int) -> list[str]:
    """The first `n` ImageNet-R class names (n <= 200), else the first `n` ImageNet-1k names."""
    from ..datasets.classes import classnames_for_wnids, imagenet_classnames, imagenet_r_wnids
    if n <= 200:
        return classnames_for_wnids(imagenet_r_wnids())[:n]
    return imagenet_classnames()[:n]


class SyntheticImages:
    """`n` JPEG files of `random_image(size, seed)` in a temporary folder, decoded like dataset files."""

    def __init__(self, n: int, size: tuple[int, int] = (320, 256), seed: int = 0):
        from ..synthetic import random_image
        self.root = Path(tempfile.mkdtemp(prefix="shiftlab-bench-"))
        self.paths = []
        for i in range(n):
            path = self.root / f"img_{i:05d}.jpg"
            random_image(tuple(size), seed=seed * 1_000_003 + i).save(path, format="JPEG", quality=90)
            self.paths.append(path)
        self.samples = [(p.name, 0) for p in self.paths]

    def __len__(self) -> int:
        return len(self.paths)

    def path(self, i: int) -> Path:
        return self.paths[i]

    def image(self, i: int) -> Image.Image:
        return decode_image(self.paths[i])

    def label(self, i: int) -> int:
        return 0

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


# -- measuring ----------------------------------------------------------------------------------

def _clock(device: torch.device) -> Callable[[], float]:
    if device.type == "cuda":
        def now() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()
        return now
    return time.perf_counter


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def process_peak_rss_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / MiB if sys.platform == "darwin" else peak / 1024   # bytes on macOS, KiB on Linux


def _release_freed_memory() -> None:
    """Collect garbage and return freed heap pages to the OS (glibc), so that a phase's RSS is not
    inflated by what an earlier phase (a baseline's 77-token backward) left behind."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """Peak memory (MiB) of a phase: CUDA allocator peak, or the sampled process RSS on the CPU."""

    def __init__(self, device: torch.device, interval: float = 0.005):
        self.device, self.interval = device, interval
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, _rss_bytes() or 0)
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif _rss_bytes() is not None:
            _release_freed_memory()
            self.peak_bytes = _rss_bytes() or 0
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device)
        elif self._thread is not None:
            self._stop.set()
            self._thread.join()
            self.peak_bytes = max(self.peak_bytes, _rss_bytes() or 0)
        else:   # no /proc: the process-wide high-water mark is all there is
            self.peak_bytes = int(process_peak_rss_mib() * MiB)

    @property
    def mib(self) -> float:
        return self.peak_bytes / MiB


def _chunks(items: Sequence[int], size: int):
    for start in range(0, len(items), max(size, 1)):
        yield list(items[start:start + size])


def _per_image(seconds: dict[str, float], n: int) -> dict[str, float]:
    return {k: v / max(n, 1) for k, v in seconds.items()}


def _collector(logits: dict[str, dict[int, torch.Tensor]]):
    def on_outputs(name: str, setting: str, ids: list[int], outs: list[MethodOutput]) -> None:
        for sid, out in zip(ids, outs):
            logits.setdefault(name, {})[sid] = out.logits.detach().float().cpu()
    return on_outputs


def _shared_pass(ev: Evaluator, timer: PhaseTimer, source, ids: Sequence[int], views: ViewGenerator,
                 batch_size: int, keep: dict[int, torch.Tensor] | None = None) -> dict:
    """Every method in one pass over `ids`: the engine's step."""
    logits: dict[str, dict[int, torch.Tensor]] = {name: {} for name in ev.methods}
    runner = Runner(ev, source, {DEFAULT_RECIPE: views}, timer=timer, on_outputs=_collector(logits))
    timer.take()
    t_start = timer.now()
    for batch in _chunks(ids, batch_size):
        items = runner.load(batch)
        runner.step(items)
        if keep is not None:
            keep.update((item.sample_id, item.views[DEFAULT_RECIPE]) for item in items)
    total = timer.now() - t_start
    phases = timer.take()
    split = {"decode_views": phases.get("decode_views", 0.0), "image_encode": phases.get("encode", 0.0)}
    per_method = {name: phases.get(f"predict:{name}", 0.0) for name in ev.methods}
    return {"seconds": total, "split": split, "per_method": per_method, "logits": logits}


def _alone(ev: Evaluator, timer: PhaseTimer, name: str, source, ids: Sequence[int], views: ViewGenerator,
           batch_size: int) -> dict:
    """One method as a one-method run would do it: decode + its views, encoding, the method."""
    logits: dict[str, dict[int, torch.Tensor]] = {name: {}}
    runner = Runner(ev, source, {DEFAULT_RECIPE: views}, methods=[name], timer=timer,
                    on_outputs=_collector(logits))
    timer.take()
    with PeakMemory(ev.model.device) as mem:
        for batch in _chunks(ids, batch_size):
            runner.step(runner.load(batch))
    phases = timer.take()
    text = phases.get(f"text:{name}", 0.0)
    split = {"decode_views": phases.get("decode_views", 0.0), "image_encode": phases.get("encode", 0.0),
             "text_tower": text, "method": phases.get(f"predict:{name}", 0.0) - text}
    return {"seconds": sum(split.values()), "split": split, "logits": logits[name], "peak_memory_mib": mem.mib}


def _first(batch):
    return batch[0]


def _loader(source, ids: Sequence[int], views: ViewGenerator, workers: int) -> dict:
    """Decode + views through DataLoader workers alone (no model), as `shiftlab run` loads images."""
    n = max(len(ids), 4 * max(workers, 1))
    loader_ids = [ids[i % len(ids)] for i in range(n)]
    loader = DataLoader(ViewDataset(source, loader_ids, {DEFAULT_RECIPE: views}), batch_size=1, num_workers=workers,
                        collate_fn=_first, prefetch_factor=4 if workers > 0 else None)
    t0 = time.perf_counter()
    first = None
    for _ in loader:
        if first is None:
            first = time.perf_counter() - t0
    wall = time.perf_counter() - t0
    steady = (wall - first) / (n - 1) if n > 1 else wall
    return {"workers": workers, "images": n, "seconds_per_image": steady, "startup_seconds": first}


def _agreement(ours: dict[int, torch.Tensor], theirs: dict[int, torch.Tensor]) -> tuple[float, float]:
    same = [int(ours[i].argmax()) == int(theirs[i].argmax()) for i in ours]
    diff = max(float((ours[i] - theirs[i]).abs().max()) for i in ours)
    return sum(same) / len(same), diff


def machine_info(device: torch.device) -> dict:
    import open_clip

    from ..version import __version__
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "open_clip": open_clip.__version__, "shiftlab": __version__}
    if hasattr(os, "getloadavg"):
        info["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def _log_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the benchmark ------------------------------------------------------------------------------

def run_bench(model: ClipModel, classnames: Sequence[str], config: BenchConfig | None = None, source: Any = None,
              log: Callable[[str], None] | None = _log_stderr, model_info: dict | None = None) -> dict:
    """Measure `config.methods` on `model`; returns the JSON-able result (see docs/BENCHMARKS.md).

    `source` has `image(i)` and `len()` (a dataset); None: `images + warmup` synthetic JPEGs.
    """
    config = config or BenchConfig()
    log = log or (lambda msg: None)
    device = model.device
    now = _clock(device)
    methods = expand_methods(config.methods or default_methods())
    own_source = source is None
    if own_source:
        source = SyntheticImages(config.images + config.warmup, config.image_size, config.seed)
    threads = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        return _run(model, list(classnames), config, methods, source, log, now, model_info or {})
    finally:
        torch.set_num_threads(threads)
        if own_source:
            source.close()


def _run(model, classnames, config, methods, source, log, now, model_info) -> dict:
    device = model.device
    machine = machine_info(device)
    n = min(config.images, len(source))
    if n < 1:
        raise ValueError("bench needs at least one image")
    ids = list(range(n))
    spare = list(range(n, len(source)))
    warm_ids = [spare[i] if i < len(spare) else ids[i % n] for i in range(config.warmup)]
    full = ViewGenerator(ViewConfig(n_views=config.views), seed=config.seed, preprocess=model.preprocess)
    one = ViewGenerator(ViewConfig(n_views=1), seed=config.seed, preprocess=model.preprocess)

    log(f"bench: {len(methods)} method(s), {n} image(s) (+{len(warm_ids)} warm-up), {config.views} views, "
        f"{len(classnames)} classes, device {device}")
    t0 = time.perf_counter()
    timer = PhaseTimer(now, text=True)
    # the bench's views are the methods' recipe, so a method that needs more refuses in one line up front
    ev = Evaluator(model, classnames, methods, config.method_config, config.precision, text_timer=timer,
                   run_views={"n_views": config.views})
    try:
        return _measure(ev, timer, model, classnames, config, methods, source, log, now, model_info, t0, ids,
                        warm_ids, full, one, machine, n)
    finally:
        ev.close()


def _measure(ev, timer, model, classnames, config, methods, source, log, now, model_info, t0, ids, warm_ids,
             full, one, machine, n) -> dict:
    device = model.device
    setup_seconds = time.perf_counter() - t0
    log(f"  setup (class heads, prompts): {setup_seconds:.1f} s")
    shared_views = full if ev.needs_views else one

    views_cache: dict[int, torch.Tensor] = {}
    if warm_ids:
        _shared_pass(ev, timer, source, warm_ids, shared_views, config.batch_size, keep=views_cache)
        first_view_only = [name for name, m in ev.methods.items() if not m.needs_views]
        if first_view_only:   # the one-view shape of the methods that run alone on view 0
            runner = Runner(ev, source, {DEFAULT_RECIPE: one}, methods=first_view_only[:1], timer=timer)
            runner.step(runner.load(warm_ids[:1]))
            timer.take()
        log(f"  warm-up: {time.perf_counter() - t0 - setup_seconds:.1f} s")

    with PeakMemory(device) as mem:
        shared = _shared_pass(ev, timer, source, ids, shared_views, config.batch_size, keep=views_cache)
    shared_peak = mem.mib
    log(f"  all methods in one pass: {shared['seconds'] / n:.2f} s/image")

    workers = resolve_workers(config.workers, device)
    loader = _loader(source, ids, shared_views, workers)
    model_spi = (shared["seconds"] - shared["split"]["decode_views"]) / n
    loader.update({
        "in_process_seconds_per_image": shared["split"]["decode_views"] / n,
        "model_seconds_per_image": model_spi,
        "bottleneck": "loader" if loader["seconds_per_image"] > model_spi else "model",
    })
    if device.type == "cpu":
        loader["note"] = "on the CPU the loader workers and the model share the same cores"
    log(f"  loader ({workers} workers): {loader['seconds_per_image']:.2f} s/image "
        f"vs model {model_spi:.2f} s/image -> {loader['bottleneck']} bound")

    # each method alone, then its baseline right after it, so that both see the same machine load
    wanted = config.baseline_methods if config.baseline_methods is not None else methods
    base_warm = warm_ids if config.baseline_warmup is None else warm_ids[:config.baseline_warmup]
    results: dict[str, dict] = {}
    kept_baselines: dict[str, Callable[[BatchItem], torch.Tensor]] = {}
    for name in methods if config.alone else []:
        method = ev.methods[name]
        alone = _alone(ev, timer, name, source, ids, full if method.needs_views else one, config.batch_size)
        spi = alone["seconds"] / n
        results[name] = row = {
            "seconds_per_image": spi,
            "images_per_second": 1.0 / spi if spi > 0 else None,
            "split_seconds_per_image": _per_image(alone["split"], n),
            "peak_memory_mib": alone["peak_memory_mib"],
            "all_methods_pass_method_seconds_per_image": shared["per_method"][name] / n,
            "views": config.views if method.needs_views else 1,
            "baseline_seconds_per_image": None, "baseline_split_seconds_per_image": None,
            "baseline_setup_seconds": None, "baseline_peak_memory_mib": None,
            "speedup": None, "top1_agreement": None, "max_abs_logit_diff": None,
        }
        log(f"  {name} alone: {spi:.2f} s/image")
        if not config.baseline or name not in wanted:
            continue
        if name not in BASELINES:
            row["baseline_skipped"] = "no baseline transcription for this method"
            continue
        base = _baseline(row, name, model, classnames, method.config, config.precision, ids, base_warm,
                         views_cache, alone, now, log)
        if base is not None:
            kept_baselines[name] = lambda item, base=base: base.predict(
                item.views[DEFAULT_RECIPE] if base.needs_views else item.views[DEFAULT_RECIPE][:1])

    rounds = None
    if config.repeats > 0:
        items = [BatchItem(sid, {DEFAULT_RECIPE: views_cache[sid]}) for sid in ids]
        log(f"  {config.repeats} interleaved round(s): floor, "
            + (f"each method alone{' (+ baseline)' if kept_baselines else ''}, " if config.alone else "")
            + "all methods")
        rounds = measure_rounds(ev, source, items, methods, config.repeats, config.batch_size, timer,
                                baselines=kept_baselines, log=log, alone=config.alone)
        for name, r in rounds["methods"].items():
            results[name]["ratio_to_floor"] = r["ratio_to_floor"]["median"]
            results[name]["rounds_seconds_per_image"] = r["seconds_per_image"]["median"]

    total_alone = sum(r["seconds_per_image"] for r in results.values())
    all_spi = shared["seconds"] / n
    return {
        "device": str(device) + (f" ({machine['gpu']})" if "gpu" in machine else ""),
        "machine": machine | ({"loadavg_at_end": [round(x, 2) for x in os.getloadavg()]}
                              if hasattr(os, "getloadavg") else {}),
        "config": asdict(config) | {"methods": methods, "classes": len(classnames), "images": n,
                                    "warmup": len(warm_ids), "model": model_info,
                                    "baseline_warmup": len(warm_ids) if config.baseline_warmup is None
                                    else min(config.baseline_warmup, len(warm_ids)),
                                    "image_size": model.image_size},
        "methods": results,
        "all_methods_seconds_per_image": all_spi,
        "all_methods_split_seconds_per_image": _per_image(shared["split"], n) | {
            "methods": _per_image(shared["per_method"], n)},
        "all_methods_peak_memory_mib": shared_peak,
        "sum_of_individual_seconds_per_image": total_alone,
        "all_to_sum_ratio": all_spi / total_alone if total_alone > 0 else None,
        "setup_seconds": setup_seconds,
        "loader": loader,
        "process_peak_rss_mib": process_peak_rss_mib(),
        "floor_seconds_per_image": rounds["floor_seconds_per_image"]["median"] if rounds else None,
        "all_methods_ratio_to_floor": rounds["all_methods_ratio_to_floor"]["median"] if rounds else None,
        "rounds": rounds,
        "projection": projection(rounds, loader["seconds_per_image"], views=config.views,
                                 target_views=config.target_views,
                                 view_methods=[m for m in methods if ev.methods[m].needs_views]) if rounds else None,
    }


def _baseline(row: dict, name: str, model: ClipModel, classnames, method_config, precision: str, ids, warm_ids,
              views_cache: dict[int, torch.Tensor], alone: dict, now, log):
    """Measure `name`'s baseline into `row`; returns the set-up baseline (None if unsupported)."""
    device = model.device
    base = create_baseline(name, model, classnames, method_config, precision=precision)
    t0 = time.perf_counter()
    try:
        base.setup()
    except BaselineUnsupported as exc:
        row["baseline_skipped"] = str(exc)
        return None
    row["baseline_setup_seconds"] = time.perf_counter() - t0

    def views_of(sid: int) -> torch.Tensor:
        v = views_cache[sid]
        return v if base.needs_views else v[:1]

    for wid in warm_ids:
        base.predict(views_of(wid))
    base.reset_split()
    logits: dict[int, torch.Tensor] = {}
    with PeakMemory(device) as mem:
        for sid in ids:
            logits[sid] = base.predict(views_of(sid)).detach().float().cpu()
    n = len(ids)
    decode_views = alone["split"]["decode_views"]
    split = {"decode_views": decode_views} | base.split
    spi = sum(split.values()) / n
    agree, diff = _agreement(alone["logits"], logits)
    row.update({
        "baseline_seconds_per_image": spi,
        "baseline_split_seconds_per_image": _per_image(split, n),
        "baseline_peak_memory_mib": mem.mib,
        "speedup": spi / row["seconds_per_image"] if row["seconds_per_image"] > 0 else None,
        "top1_agreement": agree,
        "max_abs_logit_diff": diff,
    })
    log(f"  {name} baseline: {spi:.2f} s/image (x{row['speedup']:.1f}), top-1 agreement {agree:.0%}, "
        f"max |logit diff| {diff:.2e}")
    return base
