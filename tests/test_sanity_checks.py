"""The sanity checks of a robustness evaluation (shiftlab.results.sanity) on made-up numbers: each
check fires on the failure it names, with the method and what it suggests, and stays quiet otherwise."""
from __future__ import annotations

from shiftlab.results import sanity
from shiftlab.results.sanity import Point


def P(method="tpt", robust=10.0, budget=1 / 255, steps=100, target="transfer", attack="apgd_ce", norm="Linf"):
    return Point(method, attack, norm, budget, robust, steps, target)


def test_robust_accuracy_rising_with_the_budget_is_reported_per_method():
    ok = [P(robust=30, budget=1 / 255), P(robust=20, budget=2 / 255), P(robust=20, budget=4 / 255)]
    assert sanity.rises_with_budget(ok) == []
    bad = [P(robust=30, budget=1 / 255), P(robust=31.5, budget=4 / 255), P("tda", robust=5, budget=1 / 255),
           P("tda", robust=4, budget=4 / 255)]
    [w] = sanity.rises_with_budget(bad)
    assert (w.check, w.method) == ("rises_with_budget", "tpt")
    assert "30.00% to 31.50%" in w.message and "eps=1/255 -> eps=4/255" in w.message
    assert "weak" in w.message and "gradient masking" in w.message
    # other attacks, norms, steps or targets are not compared with each other
    apart = [P(robust=30, budget=1 / 255), P(robust=40, budget=4 / 255, attack="pgd"),
             P(robust=40, budget=4 / 255, steps=10), P(robust=40, budget=4 / 255, target="adaptive"),
             P(robust=40, budget=2.0, norm="L2")]
    assert sanity.rises_with_budget(apart) == []


def test_robust_accuracy_rising_with_more_steps_is_reported():
    assert sanity.rises_with_steps([P(robust=12, steps=10), P(robust=12, steps=100)]) == []
    [w] = sanity.rises_with_steps([P(robust=12, steps=10), P(robust=13, steps=100), P(robust=11, steps=1000)])
    assert w.check == "rises_with_steps" and "10 steps -> 100 steps" in w.message
    assert sanity.rises_with_steps([P(robust=1, steps=None), P(robust=5, steps=None)]) == []


def test_adaptive_above_transfer_is_reported_only_where_both_exist():
    assert sanity.adaptive_above_transfer([P(robust=20, target="adaptive")]) == []
    assert sanity.adaptive_above_transfer([P(robust=20), P(robust=15, target="adaptive")]) == []
    [w] = sanity.adaptive_above_transfer([P(robust=20), P(robust=25, target="adaptive"),
                                          P("tda", robust=20), P("tda", robust=5, target="adaptive")])
    assert (w.check, w.method) == ("adaptive_above_transfer", "tpt")
    assert "25.00%" in w.message and "20.00%" in w.message and "gradient masking" in w.message


def test_uniform_noise_beating_the_attack_is_reported():
    assert sanity.noise_beats_attack("apgd_ce", "Linf", 4 / 255, 80.0, 3.0) == []
    assert sanity.noise_beats_attack("apgd_ce", "Linf", 4 / 255, 80.0, None) == []
    [w] = sanity.noise_beats_attack("square", "L2", 0.5, 2.0, 9.0)
    assert w.method == "zeroshot" and "L2 eps=0.5" in w.message and "9.00%" in w.message


def test_zero_shot_surviving_a_large_budget_is_reported():
    big = 16 / 255
    assert sanity.large_budget_survives([P("zeroshot", robust=0.5, budget=big)]) == []
    assert sanity.large_budget_survives([P("zeroshot", robust=40, budget=4 / 255)]) == []    # not large
    assert sanity.large_budget_survives([P("tpt", robust=40, budget=big)]) == []             # not zero-shot
    assert sanity.large_budget_survives([P("zeroshot", robust=40, budget=big, target="adaptive")]) == []
    [w] = sanity.large_budget_survives([P("zeroshot", robust=12.5, budget=big)])
    assert "12.50% top-1 survives apgd_ce at eps=16/255" in w.message and "weak" in w.message


def test_a_summary_is_checked_from_its_own_numbers():
    summary = {"config": {}, "attack": {"name": "apgd_ce", "eps": 16 / 255, "norm": "Linf", "budget": 16 / 255,
                                        "steps": 100, "success_rate": 10.0, "noise_success_rate": 20.0},
               "methods": {"zeroshot": {"top1": 60.0, "robust": {"top1": 30.0}}, "tpt": {"top1": 61.0}}}
    found = sanity.check_summary(summary)
    assert [w["check"] for w in found] == ["large_budget_survives", "noise_beats_attack"]
    summary["attack"].update(success_rate=99.0, noise_success_rate=1.0)
    summary["methods"]["zeroshot"]["robust"]["top1"] = 0.0
    assert sanity.check_summary(summary) == []
    # a summary from before budgets were recorded (pgd: eps only) reads as L-inf at eps
    [p] = sanity.points_of_summary({"attack": {"name": "pgd", "eps": 1 / 255, "steps": 7},
                                    "methods": {"zeroshot": {"robust": {"top1": 3.0}}}})
    assert (p.norm, p.budget, p.steps, p.target) == ("Linf", 1 / 255, 7, "transfer")
