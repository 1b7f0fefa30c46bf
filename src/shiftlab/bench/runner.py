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
   the views alone), each method alone (+ its baseline), all methods together and all methods
   re-run from a feature store: medians with their spread, the ratios to the floor, and the
   projected time of the full ImageNet-R, first run and every later one.

Views are each method's own recipe (`engine.step.view_generators`), as in a run. Peak memory is
per phase (`shiftlab.bench.memory`).
Every pass runs the engine's own step (`shiftlab.engine.step.Runner`: `load` then `step`) and reads
its phase timer (`shiftlab.engine.phases`), so what is measured is what `shiftlab run` executes.
Timings are wall-clock with CUDA synchronised at every boundary; warm-up images run
through every path first and are not timed.
"""
from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader

from ..engine.config import RunConfig, expand_methods, resolve_workers
from ..engine.phases import PhaseTimer
from ..engine.run_plan import RunPlan, resolve_plan
from ..engine.step import BatchItem, Evaluator, Runner, StepContext, ViewDataset, recipe_key, view_generators
from ..methods.base import MethodOutput, list_methods
from ..methods.catalogue.declarations import TEST_SET
from ..models import ClipModel
from ..views.generator import ViewGenerator
from .baseline import BASELINES, BaselineMethod, BaselineUnsupported, create_baseline
from .images import SyntheticImages
from .memory import PeakMemory, process_peak_rss_mib
from .rounds import FULL_VIEWS, measure_rounds, projection

DEFAULT_METHODS = ("zeroshot", "prompt_ensemble", "view_ensemble", "tpt", "ctpt", "rtpt", "mta")


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
    store: bool = True                        # rounds include all methods re-run from a feature store


def default_methods() -> list[str]:
    registered = set(list_methods())
    return [m for m in DEFAULT_METHODS if m in registered]


# -- measuring ----------------------------------------------------------------------------------

def bench_plan(model: ClipModel, methods: Sequence[str], config: BenchConfig) -> RunPlan:
    """The bench's methods resolved as a run of them resolves them (`engine.run_plan`): the leaderboard protocol
    (no dataset: no per-dataset values), `views` views, the bench's precision and --set values."""
    return resolve_plan(RunConfig(dataset="", model=model.name, methods=list(methods),
                                  method_config=dict(config.method_config), views=config.views,
                                  precision=config.precision))


def _clock(device: torch.device) -> Callable[[], float]:
    if device.type == "cuda":
        def now() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()
        return now
    return time.perf_counter


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


def _first(batch):
    return batch[0]


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


def shared_from_rounds(rounds: dict, decode_seconds: float, n: int) -> dict:
    """The all-methods pass's figures (seconds over `n` images, its split, each method's share) as the
    rounds' medians of that pass; the decoding measured once before them (the rounds reuse the views)."""
    encode = rounds["all_methods_encode_seconds_per_image"]["median"] * n
    per_method = {m: r["median"] * n for m, r in rounds.get("all_methods_method_seconds_per_image", {}).items()}
    return {"seconds": rounds["all_methods_seconds_per_image"]["median"] * n + decode_seconds,
            "split": {"decode_views": decode_seconds, "image_encode": encode}, "per_method": per_method,
            "logits": {}}


def _log_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the benchmark ------------------------------------------------------------------------------

def run_bench(model: ClipModel, classnames: Sequence[str], config: BenchConfig | None = None, source: Any = None,
              log: Callable[[str], None] | None = _log_stderr, model_info: dict | None = None,
              on_phase: Callable[[str], None] | None = None) -> dict:
    """Measure `config.methods` on `model`; returns the JSON-able result (see docs/BENCHMARKS.md).

    `source` has `image(i)` and `len()` (a dataset); None: `images + warmup` synthetic JPEGs.
    `on_phase(what)`: called as each phase starts (the CLI's heartbeat, `bench.progress`).
    """
    config = config or BenchConfig()
    methods = expand_methods(config.methods or default_methods())
    own_source = source is None
    if own_source:
        source = SyntheticImages(config.images + config.warmup, config.image_size, config.seed)
    threads = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        bench = Bench(model, list(classnames), config, methods, source, log or (lambda msg: None), model_info or {},
                      on_phase)
        try:
            return bench.measure()
        finally:
            bench.close()
    finally:
        torch.set_num_threads(threads)
        if own_source:
            source.close()


class Bench:
    """One bench run: the model, its evaluator (every method, the bench's view count as the methods'
    recipe, so a method that needs more views refuses in one line up front), the images, and the
    measurements (`measure`), each through the engine's own step."""

    def __init__(self, model: ClipModel, classnames: list[str], config: BenchConfig, methods: list[str],
                 source: Any, log: Callable[[str], None], model_info: dict,
                 on_phase: Callable[[str], None] | None = None):
        self.model, self.classnames, self.config, self.methods = model, classnames, config, methods
        self.source, self.log, self.model_info, self.on_phase = source, log, model_info, on_phase
        self.device = model.device
        self.now = _clock(self.device)
        self.machine = machine_info(self.device)
        n = min(config.images, len(source))
        if n < 1:
            raise ValueError("bench needs at least one image")
        self.ids = list(range(n))
        spare = list(range(n, len(source)))
        self.warm_ids = [spare[i] if i < len(spare) else self.ids[i % n] for i in range(config.warmup)]
        log(f"bench: {len(methods)} method(s), {n} image(s) (+{len(self.warm_ids)} warm-up), {config.views} views, "
            f"{len(classnames)} classes, device {self.device}")
        self.t0 = time.perf_counter()
        self.phase("setup: class heads and prompts")
        self.timer = PhaseTimer(self.now, text=True)
        self.ev = Evaluator(model, classnames, methods, config.method_config, config.precision,
                            text_timer=self.timer, configs=bench_plan(model, methods, config).method_configs())
        self.setup_seconds = time.perf_counter() - self.t0
        self.recipes = self.recipes_of(methods)
        # a test-set method (the transductive track) is shown the bench's images first, as a run shows it the test
        # set: its cost per image, apart from the per-image times, which then measure its stream as a run's do
        self.test_set_seconds = self.test_set_pass()
        self.views: dict[int, dict[str, torch.Tensor]] = {}   # each sample's decoded views, per recipe family

    def close(self) -> None:
        self.ev.close()

    def test_set_pass(self) -> dict[str, float]:
        """The engine's test-set pass (`engine.loop.test_set_pass`) over the bench's images, one test-set method
        at a time: each one's seconds per image (decoding, its pass's views and encoding, `end_test_set`)."""
        from ..engine.loop import test_set_pass
        out: dict[str, float] = {}
        for name in [m for m in self.methods if self.ev.methods[m].spec.reads_ahead == TEST_SET]:
            self.phase(f"{name}: the test-set pass")
            t0 = self.now()
            test_set_pass(self.ev, self.source, self.recipes_of([name]), self.ids, self.config.batch_size,
                          seed=self.config.seed, names=[name])
            out[name] = (self.now() - t0) / self.n
            self.log(f"  {name}: test-set pass {out[name]:.3f} s/image over {self.n} image(s) (not in its per-image "
                     "times)")
        return out

    @property
    def n(self) -> int:
        return len(self.ids)

    def recipes_of(self, names: Sequence[str]) -> dict[str, ViewGenerator]:
        """The view generators a run of `names` draws with (one per recipe family)."""
        return view_generators({m: self.ev.methods[m] for m in names}, self.model.preprocess, self.config.seed)

    def views_of(self, name: str, sid: int) -> torch.Tensor:
        """The uint8 views method `name` reads of sample `sid`: the first n of its recipe family's."""
        method = self.ev.methods[name]
        return self.views[sid][recipe_key(method.view_recipe)][:method.view_recipe.n_views]

    # -- the passes -------------------------------------------------------------------------------
    def shared_pass(self, ids: Sequence[int]) -> dict:
        """Every method in one pass over `ids`: the engine's step; keeps the decoded views."""
        logits: dict[str, dict[int, torch.Tensor]] = {name: {} for name in self.methods}
        runner = Runner(StepContext(self.ev, self.source, self.recipes, timer=self.timer,
                                    on_outputs=_collector(logits)))
        self.timer.take()
        t_start = self.timer.now()
        for batch in _chunks(ids, self.config.batch_size):
            items = runner.load(batch)
            runner.step(items)
            self.views.update((item.sample_id, item.views) for item in items if item.error is None)
        total = self.timer.now() - t_start
        phases = self.timer.take()
        split = {"decode_views": phases.get("decode_views", 0.0), "image_encode": phases.get("encode", 0.0)}
        per_method = {name: phases.get(f"predict:{name}", 0.0) for name in self.methods}
        return {"seconds": total, "split": split, "per_method": per_method, "logits": logits}

    def alone(self, name: str, ids: Sequence[int]) -> dict:
        """One method as a one-method run does it: decode + its views, encoding, the method."""
        logits: dict[str, dict[int, torch.Tensor]] = {name: {}}
        runner = Runner(StepContext(self.ev, self.source, self.recipes_of([name]), methods=[name], timer=self.timer,
                                    on_outputs=_collector(logits)))
        self.timer.take()
        with PeakMemory(self.device) as mem:
            for batch in _chunks(ids, self.config.batch_size):
                runner.step(runner.load(batch))
        phases = self.timer.take()
        text = phases.get(f"text:{name}", 0.0)
        split = {"decode_views": phases.get("decode_views", 0.0), "image_encode": phases.get("encode", 0.0),
                 "text_tower": text, "method": phases.get(f"predict:{name}", 0.0) - text}
        return {"seconds": sum(split.values()), "split": split, "logits": logits[name], "peak_memory_mib": mem.mib,
                "peak_memory_added_mib": mem.added_mib}

    def loader(self, workers: int) -> dict:
        """Decode + views through DataLoader workers alone (no model), as `shiftlab run` loads images."""
        n = max(self.n, 4 * max(workers, 1))
        loader_ids = [self.ids[i % self.n] for i in range(n)]
        loader = DataLoader(ViewDataset(self.source, loader_ids, self.recipes), batch_size=1, num_workers=workers,
                            collate_fn=_first, prefetch_factor=4 if workers > 0 else None)
        t0 = time.perf_counter()
        first = None
        for _ in loader:
            if first is None:
                first = time.perf_counter() - t0
        wall = time.perf_counter() - t0
        steady = (wall - first) / (n - 1) if n > 1 else wall
        return {"workers": workers, "images": n, "seconds_per_image": steady, "startup_seconds": first}

    def baseline(self, row: dict, name: str, alone: dict, warm_ids: Sequence[int]) -> BaselineMethod | None:
        """Measure `name`'s baseline into `row` on the views its method read; returns the set-up baseline
        (None if unsupported)."""
        method = self.ev.methods[name]
        base = create_baseline(name, self.model, self.classnames, method.config, precision=self.config.precision)
        t0 = time.perf_counter()
        try:
            base.setup()
        except BaselineUnsupported as exc:
            row["baseline_skipped"] = str(exc)
            return None
        row["baseline_setup_seconds"] = time.perf_counter() - t0

        def views(sid: int) -> torch.Tensor:
            v = self.views_of(name, sid)
            return v if base.needs_views else v[:1]

        for wid in warm_ids:
            base.predict(views(wid))
        base.reset_split()
        logits: dict[int, torch.Tensor] = {}
        with PeakMemory(self.device) as mem:
            for sid in self.ids:
                logits[sid] = base.predict(views(sid)).detach().float().cpu()
        split = {"decode_views": alone["split"]["decode_views"]} | base.split
        spi = sum(split.values()) / self.n
        agree, diff = _agreement(alone["logits"], logits)
        row.update({
            "baseline_seconds_per_image": spi,
            "baseline_split_seconds_per_image": _per_image(split, self.n),
            "baseline_peak_memory_mib": mem.mib,
            "baseline_peak_memory_added_mib": mem.added_mib,
            "speedup": spi / row["seconds_per_image"] if row["seconds_per_image"] > 0 else None,
            "top1_agreement": agree,
            "max_abs_logit_diff": diff,
        })
        self.log(f"  {name} baseline: {spi:.2f} s/image (x{row['speedup']:.1f}), top-1 agreement {agree:.0%}, "
                 f"max |logit diff| {diff:.2e}")
        return base

    # -- the whole measurement --------------------------------------------------------------------
    def measure(self) -> dict:
        config, n, log = self.config, self.n, self.log
        log(f"  setup (class heads, prompts): {self.setup_seconds:.1f} s")
        if self.warm_ids:
            self.phase("warm-up")
            self.shared_pass(self.warm_ids)
            counts = {self.ev.methods[m].view_recipe.n_views: m for m in self.methods}
            for count, name in sorted(counts.items()) if config.alone else []:
                if count < max(counts):   # a one-method run's smaller tower batch (view 0 only), once
                    self.alone(name, self.warm_ids[:1])
            log(f"  warm-up: {time.perf_counter() - self.t0 - self.setup_seconds:.1f} s")
        # The all-methods pass of the rounds is that pass already: a separate one is measured only when
        # the methods are also measured alone (their rows read it) or there are no rounds. `--quick` thus
        # runs the methods twice (the pass, its re-run from the store), not three times.
        separate = config.alone or config.repeats < 1
        decode_seconds = 0.0
        if separate:
            self.phase("all methods in one pass")
            with PeakMemory(self.device) as mem:
                shared = self.shared_pass(self.ids)
            log(f"  all methods in one pass: {shared['seconds'] / n:.2f} s/image")
            loader = self._loader_row(shared)
        else:
            self.phase("decoding the images' views")
            decode_seconds = self.decode_views(self.ids)
        results, baselines = self._alone_rows(shared) if separate else ({}, {})
        rounds = None
        if config.repeats > 0:
            items = [BatchItem(sid, dict(self.views[sid])) for sid in self.ids]
            log(f"  {config.repeats} interleaved round(s): floor, "
                + (f"each method alone{' (+ baseline)' if baselines else ''}, " if config.alone else "")
                + "all methods" + (", all methods from a feature store" if config.store else ""))
            with PeakMemory(self.device) as rounds_mem:
                rounds = measure_rounds(self.ev, self.source, items, self.methods, config.repeats,
                                        config.batch_size, self.timer, self.recipes, baselines=baselines, log=log,
                                        alone=config.alone, store=config.store, phase=self.phase)
            for name, r in rounds["methods"].items():
                results[name]["ratio_to_floor"] = r["ratio_to_floor"]["median"]
                results[name]["rounds_seconds_per_image"] = r["seconds_per_image"]["median"]
        if not separate:
            shared, mem = shared_from_rounds(rounds, decode_seconds, n), rounds_mem
            log(f"  all methods in one pass (the rounds' median): {shared['seconds'] / n:.2f} s/image")
            loader = self._loader_row(shared)
        return self._result(shared, mem.mib, loader, results, rounds)

    def phase(self, what: str) -> None:
        """Name what runs now (the progress heartbeat repeats it while it lasts)."""
        if self.on_phase is not None:
            self.on_phase(what)

    def decode_views(self, ids: Sequence[int]) -> float:
        """Decode and draw the views of `ids` (kept for the rounds), as the engine's loader does; seconds."""
        runner = Runner(StepContext(self.ev, self.source, self.recipes, timer=self.timer))
        self.timer.take()
        for batch in _chunks(ids, self.config.batch_size):
            items = runner.load(batch)
            self.views.update((item.sample_id, item.views) for item in items if item.error is None)
        return self.timer.take().get("decode_views", 0.0)

    def _loader_row(self, shared: dict) -> dict:
        workers = resolve_workers(self.config.workers, self.device)
        self.phase("the loader alone")
        loader = self.loader(workers)
        model_spi = (shared["seconds"] - shared["split"]["decode_views"]) / self.n
        loader.update({
            "in_process_seconds_per_image": shared["split"]["decode_views"] / self.n,
            "model_seconds_per_image": model_spi,
            "bottleneck": "loader" if loader["seconds_per_image"] > model_spi else "model",
        })
        if self.device.type == "cpu":
            loader["note"] = "on the CPU the loader workers and the model share the same cores"
        self.log(f"  loader ({workers} workers): {loader['seconds_per_image']:.2f} s/image "
                 f"vs model {model_spi:.2f} s/image -> {loader['bottleneck']} bound")
        return loader

    def _alone_rows(self, shared: dict) -> tuple[dict[str, dict], dict[str, Callable[[BatchItem], torch.Tensor]]]:
        """Each method alone, then its baseline right after it, so that both see the same machine load."""
        config = self.config
        wanted = config.baseline_methods if config.baseline_methods is not None else self.methods
        base_warm = self.warm_ids if config.baseline_warmup is None else self.warm_ids[:config.baseline_warmup]
        results: dict[str, dict] = {}
        kept: dict[str, Callable[[BatchItem], torch.Tensor]] = {}
        for name in self.methods if config.alone else []:
            method = self.ev.methods[name]
            self.phase(f"{name} alone")
            alone = self.alone(name, self.ids)
            spi = alone["seconds"] / self.n
            results[name] = row = {
                "seconds_per_image": spi,
                "images_per_second": 1.0 / spi if spi > 0 else None,
                "split_seconds_per_image": _per_image(alone["split"], self.n),
                "peak_memory_mib": alone["peak_memory_mib"],
                "peak_memory_added_mib": alone["peak_memory_added_mib"],
                "all_methods_pass_method_seconds_per_image": shared["per_method"][name] / self.n,
                "views": method.view_recipe.n_views if method.spec.needs_views else 1,
                "baseline_seconds_per_image": None, "baseline_split_seconds_per_image": None,
                "baseline_setup_seconds": None, "baseline_peak_memory_mib": None,
                "baseline_peak_memory_added_mib": None,
                "speedup": None, "top1_agreement": None, "max_abs_logit_diff": None,
            }
            self.log(f"  {name} alone: {spi:.2f} s/image")
            if not config.baseline or name not in wanted:
                continue
            if name not in BASELINES:
                row["baseline_skipped"] = "no baseline transcription for this method"
                continue
            self.phase(f"{name} baseline")
            base = self.baseline(row, name, alone, base_warm)
            if base is not None:
                kept[name] = lambda item, base=base, name=name: base.predict(
                    self.views_of(name, item.sample_id)[:None if base.needs_views else 1])
        return results, kept

    def _result(self, shared: dict, shared_peak: float, loader: dict, results: dict, rounds: dict | None) -> dict:
        config, n = self.config, self.n
        total_alone = sum(r["seconds_per_image"] for r in results.values())
        all_spi = shared["seconds"] / n
        return {
            "device": str(self.device) + (f" ({self.machine['gpu']})" if "gpu" in self.machine else ""),
            "machine": self.machine | ({"loadavg_at_end": [round(x, 2) for x in os.getloadavg()]}
                                       if hasattr(os, "getloadavg") else {}),
            "config": asdict(config) | {"methods": self.methods, "classes": len(self.classnames), "images": n,
                                        "warmup": len(self.warm_ids), "model": self.model_info,
                                        "baseline_warmup": len(self.warm_ids) if config.baseline_warmup is None
                                        else min(config.baseline_warmup, len(self.warm_ids)),
                                        "image_size": self.model.image_size},
            "methods": results,
            "all_methods_seconds_per_image": all_spi,
            "all_methods_split_seconds_per_image": _per_image(shared["split"], n) | {
                "methods": _per_image(shared["per_method"], n)},
            "all_methods_peak_memory_mib": shared_peak,
            "sum_of_individual_seconds_per_image": total_alone,
            "all_to_sum_ratio": all_spi / total_alone if total_alone > 0 else None,
            "setup_seconds": self.setup_seconds,
            "test_set_pass_seconds_per_image": self.test_set_seconds,
            "loader": loader,
            "process_peak_rss_mib": process_peak_rss_mib(),
            "floor_seconds_per_image": rounds["floor_seconds_per_image"]["median"] if rounds else None,
            "all_methods_ratio_to_floor": rounds["all_methods_ratio_to_floor"]["median"] if rounds else None,
            "rounds": rounds,
            "projection": projection(rounds, loader["seconds_per_image"], views=config.views,
                                     target_views=config.target_views,
                                     view_methods=[m for m in self.methods if self.ev.methods[m].spec.needs_views])
            if rounds else None,
        }
