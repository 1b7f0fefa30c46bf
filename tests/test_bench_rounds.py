"""`shiftlab bench`'s interleaved rounds: floor, ratios, baseline per round, projection.

Timings are never asserted: only that each reported ratio is the per-round quotient of the
reported seconds, and that the projection follows from the medians."""
from __future__ import annotations

import statistics

import pytest

from shiftlab.bench.images import bench_classnames
from shiftlab.bench.rounds import IMAGENET_R_IMAGES, projection, spread, summarize_rounds
from shiftlab.bench.runner import BenchConfig, run_bench
from shiftlab.cli import build_parser
from shiftlab.commands.bench import QUICK, settings

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
    enc = rounds["all_methods_encode_seconds_per_image"]["values"]
    assert rounds["all_methods_ratio_to_floor"]["values"] == pytest.approx([a / e for a, e in zip(allm, enc)])
    assert all(r >= 1.0 for r in rounds["all_methods_ratio_to_floor"]["values"])
    proj = result["projection"]
    loader = result["loader"]["seconds_per_image"] * 64 / 16
    assert proj["images"] == IMAGENET_R_IMAGES == 30_000 and proj["views"] == 64 and proj["measured_views"] == 16
    assert proj["floor_seconds"] == pytest.approx(30_000 * max(4 * statistics.median(enc), loader))
    assert proj["all_methods_seconds"] == pytest.approx(
        30_000 * max(statistics.median(allm) + 3 * statistics.median(enc), loader))
    assert proj["methods_seconds"]["tpt"] == pytest.approx(30_000 * max(
        tpt["seconds_per_image"]["median"] + 3 * tpt["encode_seconds_per_image"]["median"], loader))
    assert proj["methods_seconds"]["zeroshot"] == pytest.approx(     # view 0 only: nothing to scale
        30_000 * max(rounds["methods"]["zeroshot"]["seconds_per_image"]["median"], loader))


def test_bench_rounds_rerun_every_method_from_a_feature_store(tiny_model):
    result = run_bench(tiny_model, CLASSNAMES, BenchConfig(
        methods=["zeroshot", "tda"], images=2, warmup=0, views=8, workers=0, repeats=2, baseline=False,
        alone=False), log=None)
    rounds = result["rounds"]
    store = rounds["store"]
    floor = rounds["floor_seconds_per_image"]["values"]
    allm = rounds["all_methods_seconds_per_image"]["values"]
    spent, read = store["seconds_per_image"]["values"], store["read_seconds_per_image"]["values"]
    assert len(spent) == 2 and all(0 < r <= s for r, s in zip(read, spent))   # reading is part of the re-run
    assert store["read_speedup"]["values"] == pytest.approx([f / r for f, r in zip(floor, read)])
    enc = rounds["all_methods_encode_seconds_per_image"]["values"]
    budget = [max(a - e, 0.0) + 0.05 * f for a, e, f in zip(allm, enc, floor)]
    assert store["budget_seconds_per_image"]["values"] == pytest.approx(budget)
    assert store["over_budget"]["values"] == pytest.approx([s / b for s, b in zip(spent, budget)])
    assert set(store["method_ratio_to_floor"]) == {"zeroshot", "tda"}
    proj = result["projection"]
    assert proj["later_runs_seconds"] == pytest.approx(
        IMAGENET_R_IMAGES * (statistics.median(spent) + statistics.median(read) * (64 / 8 - 1)))
    quiet = run_bench(tiny_model, CLASSNAMES, BenchConfig(methods=["zeroshot"], images=1, warmup=0, views=4,
                                                          workers=0, repeats=1, baseline=False, alone=False,
                                                          store=False), log=None)
    assert "store" not in quiet["rounds"] and quiet["projection"]["later_runs_seconds"] is None


def test_bench_without_rounds(tiny_model):
    result = run_bench(tiny_model, CLASSNAMES, BenchConfig(methods=["zeroshot"], images=1, warmup=0, views=4,
                                                           workers=0, repeats=0, baseline=False), log=None)
    assert result["rounds"] is None and result["projection"] is None and result["floor_seconds_per_image"] is None


# -- the all-methods ratio comes from the pass that contains its floor (a busy machine skews the rest) ------

def _per_image(floor, allm, encode, alone=None):
    return {"floor": floor, "all_methods": allm, "all_methods_encode": encode} | (alone or {})


def test_all_methods_ratio_is_its_pass_over_its_own_encoding():
    # a busy round: the floor timed on its own took 1.0 s, the all-methods pass 0.6 s (of which 0.5 s
    # encoding); over the separate floor it would read "0.60x", below the encoding it contains
    out = summarize_rounds(_per_image([1.0, 2.0, 0.8], [0.6, 1.3, 1.2], [0.5, 1.0, 0.75],
                                      {"alone:tpt": [1.1, 2.2, 1.0], "alone_encode:tpt": [0.9, 1.8, 0.8]}),
                           ["tpt"], [], images=2)
    assert out["all_methods_ratio_to_floor"]["values"] == pytest.approx([1.2, 1.3, 1.6])
    assert out["all_methods_ratio_to_floor"]["median"] == pytest.approx(1.3)
    assert out["all_methods_encode_seconds_per_image"]["median"] == 0.75
    assert out["methods"]["tpt"]["ratio_to_floor"]["values"] == pytest.approx([1.1, 1.1, 1.25])
    assert out["rounds"] == 3 and out["images"] == 2


@pytest.mark.parametrize("allm,encode", [([0.4], [0.5]), ([0.4], [0.0])])
def test_all_methods_pass_must_contain_its_encoding(allm, encode):
    with pytest.raises(ValueError, match="encode phase"):
        summarize_rounds(_per_image([1.0], allm, encode), [], [], images=1)


def test_a_pass_of_methods_that_read_no_features_is_compared_with_the_floor():
    """TTL alone: the all-methods pass has no encode phase (TTL encodes through its own tower), so its
    ratio and the projection's floor come from the floor row; an encode phase there is an error."""
    out = summarize_rounds(_per_image([1.0, 2.0], [3.0, 3.0], [0.0, 0.0]), [], [], images=1, encodes=False)
    assert out["all_methods_ratio_to_floor"]["values"] == pytest.approx([3.0, 1.5])
    assert projection(out, None)["floor_seconds"] == pytest.approx(1.5 * IMAGENET_R_IMAGES)
    with pytest.raises(ValueError, match="read no features"):
        summarize_rounds(_per_image([1.0], [3.0], [0.5]), [], [], images=1, encodes=False)


@pytest.mark.slow
def test_bench_of_ttl_alone_has_no_encoding_and_a_baseline(tiny_model):
    result = run_bench(tiny_model, CLASSNAMES, BenchConfig(methods=["ttl"], images=1, warmup=0, views=8, workers=0,
                                                           repeats=1), log=None)
    row = result["methods"]["ttl"]
    assert row["split_seconds_per_image"]["image_encode"] == 0 and row["views"] == 8
    assert row["top1_agreement"] == 1.0 and row["max_abs_logit_diff"] <= 1e-3
    assert result["rounds"]["all_methods_encodes"] is False
    assert result["projection"]["floor_seconds"] > 0


def test_projection_at_the_full_recipe_is_the_medians_times_the_images():
    rounds = summarize_rounds(_per_image([1.0, 3.0], [2.0, 4.0], [1.5, 2.5],
                                         {"alone:mta": [1.6, 2.6], "alone_encode:mta": [1.5, 2.5]}),
                              ["mta"], [], images=1)
    proj = projection(rounds, 0.1)
    assert (proj["views"], proj["measured_views"], proj["encode_scale"]) == (64, 64, 1.0)
    assert proj["floor_seconds"] == pytest.approx(30_000 * 2.0)
    assert proj["all_methods_seconds"] == pytest.approx(30_000 * 3.0)
    assert proj["methods_seconds"]["mta"] == pytest.approx(30_000 * 2.1)
    assert proj["loader_seconds"] == pytest.approx(3_000) and "extrapolated" not in proj
    assert projection(rounds, 5.0)["all_methods_seconds"] == pytest.approx(30_000 * 5.0)   # loader-bound


def test_projection_scales_the_image_tower_to_64_views():
    rounds = summarize_rounds(_per_image([0.5], [2.0], [0.5],
                                         {"alone:zeroshot": [0.2], "alone_encode:zeroshot": [0.1],
                                          "alone:tpt": [1.6], "alone_encode:tpt": [0.5]}),
                              ["zeroshot", "tpt"], [], images=1)
    proj = projection(rounds, 0.05, views=16, view_methods=["tpt"])
    assert proj["encode_scale"] == 4.0 and proj["measured_views"] == 16 and proj["views"] == 64
    assert proj["floor_seconds"] == pytest.approx(30_000 * 2.0)             # 0.5 s x 64/16
    assert proj["all_methods_seconds"] == pytest.approx(30_000 * 3.5)       # 1.5 s of methods + 2.0 s encoding
    assert proj["methods_seconds"]["tpt"] == pytest.approx(30_000 * 3.1)    # 1.1 + 0.5 x 4
    assert proj["methods_seconds"]["zeroshot"] == pytest.approx(30_000 * 0.2)   # view 0 only: as measured
    assert proj["loader_seconds"] == pytest.approx(30_000 * 0.2)
    assert "16 views" in proj["extrapolated"] and "64 views" in proj["extrapolated"]
    with pytest.raises(ValueError, match="at least one view"):
        projection(rounds, 0.05, views=0)


# -- --quick ---------------------------------------------------------------------------------------

def _bench_args(*argv):
    return build_parser().parse_args(["bench", *argv])


def test_quick_settings():
    got = settings(_bench_args("--quick"), "cpu")
    assert got == QUICK | {"alone": False}
    assert got == {"methods": ["zeroshot", "view_ensemble", "tpt", "ctpt", "rtpt", "mta"], "images": 1, "warmup": 0,
                   "views": 16, "repeats": 1, "baseline": False, "alone": False, "workers": 0}
    assert settings(_bench_args("--quick", "--methods", "tpt"), "cpu")["methods"] == ["tpt"]


def test_quick_gives_way_to_explicit_flags_and_the_defaults_are_unchanged():
    got = settings(_bench_args("--quick", "--views", "32", "--images", "2", "--baseline"), "cpu")
    assert (got["views"], got["images"], got["baseline"], got["alone"], got["repeats"]) == (32, 2, True, True, 1)
    assert settings(_bench_args(), "cpu") == {"methods": None, "images": 3, "warmup": 1, "views": 64, "repeats": 3,
                                               "baseline": True, "alone": True, "workers": -1}
    assert settings(_bench_args(), "cuda")["images"] == 32
    assert settings(_bench_args("--no-baseline"), "cpu")["alone"] is True


def test_quick_run_measures_floor_and_all_methods_only(tiny_model):
    result = run_bench(tiny_model, CLASSNAMES, BenchConfig(
        methods=["zeroshot", "tpt"], images=1, warmup=0, views=8, workers=0, repeats=1, baseline=False,
        alone=False), log=None)
    assert result["methods"] == {} and result["rounds"]["methods"] == {}
    proj = result["projection"]
    assert proj["measured_views"] == 8 and proj["views"] == 64 and proj["encode_scale"] == 8.0
    enc = result["rounds"]["all_methods_encode_seconds_per_image"]["median"]
    allm = result["rounds"]["all_methods_seconds_per_image"]["median"]
    loader = result["loader"]["seconds_per_image"] * 8
    assert proj["all_methods_seconds"] == pytest.approx(30_000 * max(allm + 7 * enc, loader))
    from shiftlab.bench.report import format_report
    text = format_report(result)
    assert "extrapolated, not measured" in text and "30000 images, 64 views" in text
