"""Interleaved rounds: the floor, each method alone, all methods together, and the projection.

One round runs, on the same decoded views (decoded once, before the rounds):

1. the **floor**: the image tower over all views of every image, nothing else (what any
   method reading the views must pay);
2. each method **alone**, through the engine's step (`Runner.step`: encode + the method);
3. with a baseline, that method's straightforward **baseline** right after it;
4. **all methods** in one step;
5. **all methods from a feature store**: the same pass re-run with every feature read from a store
   filled before the rounds (what every run after the first costs: `shiftlab run --features DIR`,
   `shiftlab sweep`), with its reading (`store_read`) and each method's own share (a sweep point).

Rounds repeat A, B, C, ... A, B, C, ... in one process, so that a busy machine's load changes
hit every measurement alike; each figure is the median over rounds with its spread (min, max),
and each ratio (to the floor, baseline / library) is taken within a round, then its median.

The all-methods ratio is taken inside ONE pass: its wall time over the image-tower phase of the
same pass (the phase timer's `encode`), i.e. 1 + (methods + overhead) / encode. The encoding is
a sub-interval of the pass, so the ratio is >= 1 in every round whatever the machine's load does
between measurements; a ratio to the separately timed floor could come out below 1 (a busy CPU
once printed "all methods 0.60x floor"). The same pass's encode phase is the floor of the
projection's all-methods line, so that line is never below its floor either.
Decoding and view generation are outside these figures: a run does them in DataLoader workers
(`loader` in the result measures them), and the projection takes the slower of the two.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import torch

from ..engine.phases import PhaseTimer
from ..engine.step import BatchItem, Evaluator, Runner, StepContext

IMAGENET_R_IMAGES = 30_000
FULL_VIEWS = 64        # the leaderboard recipe's views per image (docs/PROTOCOL: view 0 + 63 augmented)


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, min, max and the values themselves."""
    vals = [float(v) for v in values]
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "values": vals}


def _batches(items: Sequence[BatchItem], size: int):
    for start in range(0, len(items), max(size, 1)):
        yield list(items[start:start + size])


def _floor(ev: Evaluator, items: Sequence[BatchItem], batch_size: int, now: Callable[[], float]) -> float:
    """The image tower over every view of every recipe family the items carry, nothing else."""
    t0 = now()
    for batch in _batches(items, batch_size):
        for key in batch[0].views:
            ev.contexts([item.views[key] for item in batch], [item.sample_id for item in batch], all_views=True)
    return now() - t0


def _pass(ev: Evaluator, source: Any, items: Sequence[BatchItem], methods: Sequence[str], batch_size: int,
          timer: PhaseTimer, recipes: Mapping[str, Any], features: Any = None) -> tuple[float, dict[str, float]]:
    """(wall seconds, its phases' seconds) of one engine pass of `methods` over `items`; with `features` (a
    filled store) every item is read from it instead of encoded."""
    runner = Runner(StepContext(ev, source, recipes, methods=list(methods), timer=timer, features=features))
    if features is not None:
        items = [BatchItem(item.sample_id, from_store=True) for item in items]
    timer.take()
    t0 = timer.now()
    for batch in _batches(items, batch_size):
        runner.step(batch)
    seconds = timer.now() - t0
    return seconds, timer.take()


def fill_store(ev: Evaluator, source: Any, items: Sequence[BatchItem], methods: Sequence[str], batch_size: int,
               recipes: Mapping[str, Any], root: Any) -> Any:
    """A feature store in `root` holding every encoding the all-methods pass makes of `items` (fp16, the
    default storage), as the run's view of it (`engine.features.RunFeatures`); None when a method needs pixels."""
    from ..engine.features import RunFeatures
    from ..rundir.feature_store import FeatureStore
    if any(ev.methods[m].spec.needs_pixels for m in methods):
        return None
    model = ev.model
    store = FeatureStore(root, "w", lock=False)
    base = {"samples_sha256": "bench", "model": model, "seed": next(iter(recipes.values())).seed,
            "checkpoint_sha256": model.checkpoint_sha256, "weights_sha256": None, "storage": "fp16"}
    features = RunFeatures(store, base, source, writable=True)
    runner = Runner(StepContext(ev, source, recipes, methods=list(methods), features=features))
    for batch in _batches(items, batch_size):
        runner.fill_store(batch)
    store.flush()
    return features


def measure_rounds(ev: Evaluator, source: Any, items: Sequence[BatchItem], methods: Sequence[str], rounds: int,
                   batch_size: int, timer: PhaseTimer, recipes: Mapping[str, Any],
                   baselines: Mapping[str, Callable[[BatchItem], torch.Tensor]] | None = None,
                   log: Callable[[str], None] = lambda msg: None, alone: bool = True,
                   store: bool = True, phase: Callable[[str], None] = lambda what: None) -> dict[str, Any]:
    """Seconds per image over `rounds` interleaved rounds (see the module docstring); `alone=False`
    skips each method's own pass (and its baseline), `store=False` the re-run from a feature store.
    `phase(what)` is told each pass as it starts (progress); a round whose figures contradict each
    other (`contradictions`) is marked UNRELIABLE in its line and listed in the result."""
    import tempfile
    baselines = baselines if alone and baselines else {}
    alone_methods = list(methods) if alone else []
    n = len(items)
    per_image: dict[str, list[float]] = {"floor": [], "all_methods": [], "all_methods_encode": []}
    per_image |= {f"all_method:{m}": [] for m in methods}
    per_image |= {f"{k}:{m}": [] for m in alone_methods for k in ("alone", "alone_encode")}
    per_image |= {f"baseline:{m}": [] for m in baselines}
    with tempfile.TemporaryDirectory(prefix="shiftlab-bench-store-") as root:
        if store:
            phase("filling the feature store (encoding every view once)")
        features = fill_store(ev, source, items, methods, batch_size, recipes, root) if store else None
        if features is not None:
            per_image |= {"store": [], "store_read": []} | {f"store_method:{m}": [] for m in methods}
        for r in range(rounds):
            timer.take()
            phase(f"round {r + 1}/{rounds}: the floor")
            per_image["floor"].append(_floor(ev, items, batch_size, timer.now) / n)
            for name in alone_methods:
                phase(f"round {r + 1}/{rounds}: {name} alone")
                seconds, phases = _pass(ev, source, items, [name], batch_size, timer, recipes)
                per_image[f"alone:{name}"].append(seconds / n)
                per_image[f"alone_encode:{name}"].append(phases.get("encode", 0.0) / n)
                if name in baselines:
                    phase(f"round {r + 1}/{rounds}: {name} baseline")
                    t0 = timer.now()
                    for item in items:
                        baselines[name](item)
                    per_image[f"baseline:{name}"].append((timer.now() - t0) / n)
            phase(f"round {r + 1}/{rounds}: all methods")
            seconds, phases = _pass(ev, source, items, methods, batch_size, timer, recipes)
            per_image["all_methods"].append(seconds / n)
            per_image["all_methods_encode"].append(phases.get("encode", 0.0) / n)
            for m in methods:
                per_image[f"all_method:{m}"].append(phases.get(f"predict:{m}", 0.0) / n)
            line = (f"  round {r + 1}/{rounds}: floor {per_image['floor'][-1]:.3f} s/image, all methods "
                    f"{per_image['all_methods'][-1]:.3f} s/image "
                    f"(its encoding {per_image['all_methods_encode'][-1]:.3f})")
            if features is not None:
                phase(f"round {r + 1}/{rounds}: all methods from the feature store")
                seconds, phases = _pass(ev, source, items, methods, batch_size, timer, recipes, features)
                if phases.get("encode", 0.0) or phases.get("decode_views", 0.0):
                    raise RuntimeError("the feature-store pass decoded or encoded: its store does not serve every item")
                per_image["store"].append(seconds / n)
                per_image["store_read"].append(phases.get("store_read", 0.0) / n)
                for m in methods:
                    per_image[f"store_method:{m}"].append(phases.get(f"predict:{m}", 0.0) / n)
                line += f", from the store {per_image['store'][-1]:.3f}"
            problems = contradictions(round_figures(per_image, r))
            if problems:
                line += " -- UNRELIABLE: " + "; ".join(problems)
            log(line)
        if features is not None:
            features.close()
    return summarize_rounds(per_image, alone_methods, list(baselines), n, store_methods=methods,
                            encodes=any(ev.methods[m].spec.reads_features for m in methods))


def summarize_rounds(per_image: Mapping[str, Sequence[float]], methods: Sequence[str], baselines: Sequence[str],
                     images: int, store_methods: Sequence[str] = (), encodes: bool = True) -> dict[str, Any]:
    """The rounds' result from seconds per image per round: keys `floor`, `all_methods`,
    `all_methods_encode` (that pass's encode phase), `alone:<m>` and `alone_encode:<m>` for `methods`,
    `baseline:<m>` for `baselines`, and, when the rounds re-ran from a feature store, `store`,
    `store_read` and `store_method:<m>` for `store_methods`; each a list with one value per round.
    `encodes=False`: no method of the all-methods pass reads the frozen tower's features (TTL alone), so
    the pass has no encode phase and its ratio is taken over the floor of the same round."""
    floor = list(per_image["floor"])

    def ratio(key: str, to: Sequence[float]) -> dict[str, Any]:
        return spread([a / b for a, b in zip(per_image[key], to)])

    encode = list(per_image["all_methods_encode"])
    if encodes and any(e <= 0 for e in encode):
        raise ValueError("all-methods pass without an encode phase: no ratio to its floor")
    if not encodes and any(e > 0 for e in encode):
        raise ValueError("an encode phase in a pass of methods that read no features")
    if any(a < e * (1 - 1e-9) for a, e in zip(per_image["all_methods"], encode)):   # float sums of nested spans
        raise ValueError("an all-methods pass shorter than its own encode phase: the phases are not nested")
    out: dict[str, Any] = {
        "rounds": len(floor), "images": images,
        "floor_seconds_per_image": spread(floor),
        "all_methods_seconds_per_image": spread(per_image["all_methods"]),
        "all_methods_encode_seconds_per_image": spread(encode),
        "all_methods_encodes": encodes,
        "all_methods_ratio_to_floor": ratio("all_methods", encode if encodes else floor),
        "all_methods_ratio_note": "per round: the all-methods pass over its own encode phase (>= 1)" if encodes else
                                  "per round: the all-methods pass over the floor (no method of it reads the frozen "
                                  "tower's features: it has no encode phase)",
        "methods": {},
        "unreliable_rounds": unreliable_rounds(per_image),
    }
    if all(f"all_method:{m}" in per_image for m in store_methods):
        out["all_methods_method_seconds_per_image"] = {m: spread(per_image[f"all_method:{m}"]) for m in store_methods}
    for name in methods:
        row = {"seconds_per_image": spread(per_image[f"alone:{name}"]),
               "encode_seconds_per_image": spread(per_image.get(f"alone_encode:{name}", [0.0] * len(floor))),
               "ratio_to_floor": ratio(f"alone:{name}", floor)}
        if name in baselines:
            row["baseline_seconds_per_image"] = spread(per_image[f"baseline:{name}"])
            row["speedup"] = ratio(f"baseline:{name}", per_image[f"alone:{name}"])
        out["methods"][name] = row
    if "store" in per_image:
        out["store"] = store_summary(per_image, floor, store_methods)
    return out


def round_figures(per_image: Mapping[str, Sequence[float]], r: int) -> dict[str, float]:
    """Round r's seconds per image, by the keys of `per_image` (those measured in it)."""
    return {key: values[r] for key, values in per_image.items() if len(values) > r}


# The floor and the all-methods pass's own encoding are the same work (the image tower over the same
# views): apart by more than this factor, the machine's load changed within the round.
SAME_WORK_FACTOR = 2.0


def contradictions(fig: Mapping[str, float]) -> list[str]:
    """Why one round's figures (`round_figures`) cannot all be true of one machine, [] when they can:
    the re-run from the feature store does the all-methods pass's work minus the encoding, so it cannot
    be slower; a method alone does part of the all-methods pass's work; the floor and that pass's
    encoding are the same work. Such a round measured a machine whose load changed under it."""
    problems = []
    full = fig.get("all_methods")
    if full is not None and fig.get("store") is not None and fig["store"] > full:
        problems.append(f"the re-run from the feature store ({fig['store']:.3f} s/image) was slower than the "
                        f"all-methods pass that encodes ({full:.3f})")
    for key, value in fig.items():
        if key.startswith("alone:") and full is not None and value > full:
            problems.append(f"{key[6:]} alone ({value:.3f} s/image) was slower than all methods together "
                            f"({full:.3f})")
    floor, encode = fig.get("floor"), fig.get("all_methods_encode")
    if floor and encode and max(floor / encode, encode / floor) > SAME_WORK_FACTOR:
        problems.append(f"the floor ({floor:.3f} s/image) and the all-methods pass's own encoding ({encode:.3f}), "
                        f"the same work, differ by more than {SAME_WORK_FACTOR:g}x")
    return problems


def unreliable_rounds(per_image: Mapping[str, Sequence[float]]) -> list[dict[str, Any]]:
    """[{"round": k (from 1), "reasons": [...]}] for each round whose figures contradict each other."""
    out = []
    for r in range(len(per_image["floor"])):
        problems = contradictions(round_figures(per_image, r))
        if problems:
            out.append({"round": r + 1, "reasons": problems})
    return out


# what a re-run from the store may cost beyond the methods' own share, and a sweep point, as shares of the floor
STORE_OVERHEAD, SWEEP_POINT = 0.05, 0.05


def store_summary(per_image: Mapping[str, Sequence[float]], floor: Sequence[float],
                  methods: Sequence[str]) -> dict[str, Any]:
    """The feature-store re-run against its targets, each taken within a round: the re-run of all methods
    costs at most the methods' own share of the all-methods pass + STORE_OVERHEAD x floor; reading is
    `read_speedup` times faster than encoding; each method's own time in the re-run (what one more sweep
    point of it costs, the reading shared) as a share of the floor.

    The methods' share is the all-methods pass minus its own encode phase, the floor it contains (as for
    the all-methods ratio, module docstring): the separately timed floor moves with the machine's load
    between the two measurements, and on a busy CPU it made the share of one round 40 s and of the next 4 s."""
    store, read, full = per_image["store"], per_image["store_read"], per_image["all_methods"]
    budget = [max(a - e, 0.0) + STORE_OVERHEAD * f
              for a, e, f in zip(full, per_image["all_methods_encode"], floor)]
    return {
        "seconds_per_image": spread(store),
        "read_seconds_per_image": spread(read),
        "ratio_to_floor": spread([s / f for s, f in zip(store, floor)]),
        "budget_seconds_per_image": spread(budget),
        "over_budget": spread([s / b if b > 0 else float("inf") for s, b in zip(store, budget)]),
        "read_speedup": spread([f / r if r > 0 else float("inf") for f, r in zip(floor, read)]),
        "method_ratio_to_floor": {m: spread([s / f for s, f in zip(per_image[f"store_method:{m}"], floor)])
                                  for m in methods},
        "targets": {"over_budget": "<= 1 (budget: the all-methods pass minus its encode phase + "
                                   f"{STORE_OVERHEAD:g} x floor)", "read_speedup": ">= 20",
                    "method_ratio_to_floor": f"<= {SWEEP_POINT:g} for a training-free method (a sweep point)"},
    }


def projection(rounds: dict[str, Any], loader_seconds_per_image: float | None,
               images: int = IMAGENET_R_IMAGES, views: int = FULL_VIEWS, target_views: int = FULL_VIEWS,
               view_methods: Collection[str] | None = None) -> dict[str, Any]:
    """Projected wall time of `images` images of the `target_views`-view recipe on this device, from
    rounds measured at `views` views: median model seconds per image x `images`, or the loader's if
    it is slower (loader and model run concurrently in a run).

    When `views != target_views`, the image-tower phase of each pass that encodes every view (the
    all-methods pass, and the methods in `view_methods`; None: all) and the loader are scaled by
    target_views / views; the rest of each pass (the methods) is taken as measured.
    """
    if views < 1 or target_views < 1:
        raise ValueError(f"projection needs at least one view, got {views} -> {target_views}")
    factor = target_views / views
    loader = (loader_seconds_per_image or 0.0) * factor

    def wall(total: float, encode: float) -> float:
        return images * max(total + encode * (factor - 1), loader)

    encode = rounds["all_methods_encode_seconds_per_image"]["median"]
    floor = encode if rounds.get("all_methods_encodes", True) else rounds["floor_seconds_per_image"]["median"]
    methods = {}
    for name, r in rounds["methods"].items():
        scaled = view_methods is None or name in view_methods
        methods[name] = wall(r["seconds_per_image"]["median"],
                             r.get("encode_seconds_per_image", {"median": 0.0})["median"] if scaled else 0.0)
    store = rounds.get("store")
    out = {
        "images": images, "views": target_views, "measured_views": views,
        "encode_scale": factor,
        "loader_seconds": images * loader,
        "floor_seconds": wall(floor, floor),
        "all_methods_seconds": wall(rounds["all_methods_seconds_per_image"]["median"], encode),
        "methods_seconds": methods,
        # a re-run reads features instead of decoding (no loader); of it only the reading scales with the views
        "later_runs_seconds": images * (store["seconds_per_image"]["median"]
                                        + store["read_seconds_per_image"]["median"] * (factor - 1)) if store else None,
        "note": "median model seconds per image x images, or the loader's seconds if larger; the floor is "
                "the all-methods pass's own encode phase; later runs: the all-methods re-run from a feature store",
    }
    if factor != 1:
        out["extrapolated"] = (f"measured at {views} views: image-tower phases and the loader scaled x{factor:g} "
                               f"to {target_views} views, the methods' own time taken as measured")
    return out
