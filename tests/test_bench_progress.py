"""`shiftlab bench --quick` (issue 34, finding 7): a progress line at least every 5 s, and a round whose
figures contradict each other marked UNRELIABLE. Logic only, on made-up clocks and round data: a
benchmark reports timings, tests never assert them."""
from __future__ import annotations

import subprocess
import sys

import pytest

from shiftlab.bench.progress import EVERY, SPEAK_AFTER, Heartbeat
from shiftlab.bench.report import format_report
from shiftlab.bench.rounds import contradictions, round_figures, summarize_rounds, unreliable_rounds


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_heartbeat_says_the_phase_before_5_s_pass_without_a_line():
    clock, said = Clock(), []
    beat = Heartbeat(lambda line: said.append((clock.t, line)), clock)
    beat.say("bench: loading")
    beat.phase("loading torch")
    # a silent minute, ticked every 0.4 s as the thread does (10 ticks per SPEAK_AFTER)
    for _ in range(150):
        clock.t += 0.4
        beat.tick()
    times = [t for t, _ in said]
    # a line at least every SPEAK_AFTER (+ one tick): 1 s of slack under the 5 s promise for a late thread
    assert times[0] == 100.0 and max(b - a for a, b in zip(times, times[1:])) <= SPEAK_AFTER + 0.4 < EVERY
    assert len(said) == 1 + 15
    assert said[1][1] == "  ... loading torch (4 s)" and said[-1][1] == "  ... loading torch (60 s)"


def test_heartbeat_stays_quiet_while_lines_come_and_names_each_new_phase():
    clock, said = Clock(), []
    beat = Heartbeat(lambda line: said.append(line), clock, every=5.0)
    for k in range(20):            # a line every 4 s: the heartbeat adds nothing
        clock.t += 4.0
        assert not beat.tick()
        beat.say(f"line {k}")
    assert said == [f"line {k}" for k in range(20)]
    beat.phase("round 1/1: all methods")
    clock.t += 4.9
    assert not beat.tick()
    clock.t += 0.1
    assert beat.tick() and said[-1] == "  ... round 1/1: all methods (5 s)"
    beat.phase("round 1/1: all methods from the feature store")
    clock.t += 5.0
    assert beat.tick() and said[-1] == "  ... round 1/1: all methods from the feature store (5 s)"


def test_heartbeat_thread_starts_and_stops():
    said = []
    beat = Heartbeat(said.append, every=0.01)
    beat.phase("x")
    with beat:
        while not said:
            beat._stop.wait(0.01)
    n = len(said)
    beat._stop.wait(0.05)
    assert len(said) == n and said[0].startswith("  ... x (")


def test_the_heartbeat_loads_without_torch():
    code = "import sys, shiftlab.bench.progress; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


# -- rounds whose figures contradict each other ---------------------------------------------------------

def rounds_data(**overrides):
    """Two rounds: round 1 consistent, round 2 as the issue saw it (store 70.9 s/img > all methods 63.5)."""
    data = {"floor": [10.0, 10.5], "all_methods": [60.0, 63.5], "all_methods_encode": [10.2, 11.0],
            "store": [48.0, 70.9], "store_read": [0.001, 0.001], "store_method:tpt": [40.0, 60.0],
            "alone:tpt": [55.0, 50.0], "alone_encode:tpt": [10.0, 10.0]}
    return data | overrides


def test_store_re_read_slower_than_the_pass_that_encodes_is_unreliable():
    data = rounds_data()
    assert contradictions(round_figures(data, 0)) == []
    assert contradictions(round_figures(data, 1)) == [
        "the re-run from the feature store (70.900 s/image) was slower than the all-methods pass that encodes "
        "(63.500)"]
    assert unreliable_rounds(data) == [{"round": 2, "reasons": contradictions(round_figures(data, 1))}]


@pytest.mark.parametrize("overrides, expected", [
    ({"alone:tpt": [61.0, 50.0]}, "tpt alone (61.000 s/image) was slower than all methods together (60.000)"),
    ({"floor": [25.0, 10.5]}, "the floor (25.000 s/image) and the all-methods pass's own encoding (10.200), the same "
                              "work, differ by more than 2x"),
    ({"floor": [4.0, 10.5]}, "the floor (4.000 s/image) and the all-methods pass's own encoding (10.200), the same "
                             "work, differ by more than 2x"),
])
def test_other_contradictions(overrides, expected):
    data = rounds_data(**overrides)
    assert contradictions(round_figures(data, 0)) == [expected]
    # at the bounds: equal figures, exactly 2x, contradict nothing
    assert contradictions({"all_methods": 5.0, "store": 5.0, "alone:tpt": 5.0, "floor": 2.0,
                           "all_methods_encode": 4.0}) == []


def test_unreliable_rounds_reach_the_result_and_the_table():
    data = rounds_data() | {"all_method:tpt": [45.0, 48.0]}
    out = summarize_rounds(data, ["tpt"], [], 1, store_methods=["tpt"])
    assert [r["round"] for r in out["unreliable_rounds"]] == [2]
    assert out["all_methods_method_seconds_per_image"]["tpt"]["values"] == [45.0, 48.0]
    result = {"device": "cpu", "machine": {"torch": "x", "torch_threads": 1}, "methods": {},
              "config": {"classes": 200, "views": 16, "images": 1, "warmup": 0, "model": {"name": "RN50"}},
              "all_methods_seconds_per_image": 60.0, "all_methods_peak_memory_mib": 1.0,
              "all_methods_split_seconds_per_image": {"decode_views": 0.1, "image_encode": 10.0,
                                                      "methods": {"tpt": 45.0}},
              "sum_of_individual_seconds_per_image": 0, "all_to_sum_ratio": None, "process_peak_rss_mib": 1.0,
              "rounds": out, "projection": {"images": 30000, "views": 64, "measured_views": 16,
                                            "floor_seconds": 1.0, "all_methods_seconds": 2.0, "loader_seconds": 0.0},
              "loader": {"workers": 0, "seconds_per_image": 0.1, "startup_seconds": 0.0,
                         "in_process_seconds_per_image": 0.1, "model_seconds_per_image": 60.0, "bottleneck": "model"}}
    text = format_report(result)
    assert "round 2 UNRELIABLE" in text and "(70.900 s/image) was slower than the all-methods pass" in text
    assert "round 1 UNRELIABLE" not in text


def test_quick_shape_runs_the_methods_once_per_pass_and_names_every_phase(tiny_model):
    from shiftlab.bench.images import bench_classnames
    from shiftlab.bench.runner import BenchConfig, run_bench
    phases, lines = [], []
    result = run_bench(tiny_model, bench_classnames(10), BenchConfig(
        methods=["zeroshot", "tpt"], images=1, warmup=0, views=8, workers=0, repeats=1, baseline=False,
        alone=False), log=lines.append, on_phase=phases.append)
    assert phases == ["setup: class heads and prompts", "decoding the images' views",
                      "filling the feature store (encoding every view once)", "round 1/1: the floor",
                      "round 1/1: all methods", "round 1/1: all methods from the feature store",
                      "the loader alone"]
    # no separate pass: the all-methods line is the round's pass (+ the decoding measured once)
    rounds = result["rounds"]
    split = result["all_methods_split_seconds_per_image"]
    assert result["all_methods_seconds_per_image"] == pytest.approx(
        rounds["all_methods_seconds_per_image"]["median"] + split["decode_views"])
    assert split["image_encode"] == pytest.approx(rounds["all_methods_encode_seconds_per_image"]["median"])
    assert split["methods"] == {m: pytest.approx(r["median"])
                                for m, r in rounds["all_methods_method_seconds_per_image"].items()}
    assert set(split["methods"]) == {"zeroshot", "tpt"}
    assert any(line.startswith("  all methods in one pass (the rounds' median)") for line in lines)
