"""`shiftlab bench`'s interleaved rounds: floor, ratios, baseline per round, projection (issue 15.2).

Timings are never asserted: only that each reported ratio is the per-round quotient of the
reported seconds, and that the projection follows from the medians."""
from __future__ import annotations

import statistics

import pytest

from shiftlab.bench import BenchConfig, bench_classnames, run_bench
from shiftlab.bench.rounds import IMAGENET_R_IMAGES, spread

CLASSNAMES = bench_classnames(10)


def test_spread_is_median_min_max():
    assert spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "values": [3.0, 1.0, 2.0]}


def test_bench_rounds_report_floor_ratios_and_projection(tiny_model):
    result = run_bench(tiny_model, CLASSNAMES, BenchConfig(
        methods=["zeroshot", "tpt"], images=2, warmup=0, views=16, workers=0, repeats=2,
        baseline_methods=["tpt"]), log=None)
    rounds = result["rounds"]
    assert rounds["rounds"] == 2 and rounds["images"] == 2
    floor = rounds["floor_seconds_per_image"]["values"]
    assert len(floor) == 2 and all(f > 0 for f in floor)
    assert result["floor_seconds_per_image"] == statistics.median(floor)
    for name, r in rounds["methods"].items():
        secs = r["seconds_per_image"]["values"]
        assert r["ratio_to_floor"]["values"] == pytest.approx([s / f for s, f in zip(secs, floor)])
        assert result["methods"][name]["ratio_to_floor"] == r["ratio_to_floor"]["median"]
    tpt = rounds["methods"]["tpt"]
    base = tpt["baseline_seconds_per_image"]["values"]
    assert tpt["speedup"]["values"] == pytest.approx([b / s for b, s in zip(base, tpt["seconds_per_image"]["values"])])
    assert "speedup" not in rounds["methods"]["zeroshot"]
    allm = rounds["all_methods_seconds_per_image"]["values"]
    assert rounds["all_methods_ratio_to_floor"]["values"] == pytest.approx([a / f for a, f in zip(allm, floor)])
    proj = result["projection"]
    loader = result["loader"]["seconds_per_image"]
    assert proj["images"] == IMAGENET_R_IMAGES == 30_000
    assert proj["all_methods_seconds"] == pytest.approx(30_000 * max(statistics.median(allm), loader))
    assert proj["methods_seconds"]["tpt"] == pytest.approx(
        30_000 * max(tpt["seconds_per_image"]["median"], loader))


def test_bench_without_rounds(tiny_model):
    result = run_bench(tiny_model, CLASSNAMES, BenchConfig(methods=["zeroshot"], images=1, warmup=0, views=4,
                                                           workers=0, repeats=0, baseline=False), log=None)
    assert result["rounds"] is None and result["projection"] is None and result["floor_seconds_per_image"] is None
