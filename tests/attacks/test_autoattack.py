"""The AutoAttack attacks as shiftlab attacks: configs and their refusals, the 8-bit images in the budget
(L-inf and L2), per-sample seeding, and AutoAttack's records (which part broke each sample)."""
from __future__ import annotations

import pytest
import torch

from shiftlab.attacks import attack_config, build_attack, eps_255
from shiftlab.attacks.bounded import to_uint8
from shiftlab.attacks.budgets import BudgetConfig
from shiftlab.engine.step import Evaluator
from shiftlab.synthetic import random_image
from shiftlab.views.generator import ViewConfig, ViewGenerator

pytestmark = pytest.mark.usefixtures("one_thread")
FAST = {"apgd_ce": {"steps": 3}, "apgd_t": {"steps": 3, "targets": 2}, "square": {"queries": 30, "eps": 4 / 255},
        "fab_t": {"steps": 3, "targets": 2, "quantize": "truncate"},
        "autoattack": {"steps": 3, "targets": 2, "queries": 10}}


@pytest.fixture(scope="module")
def evaluator(golden_model):
    # the golden tiny CLIP (200 classes): zero-shot falls under small budgets, unlike tiny_clip(0) whose
    # six logits hardly depend on the image
    model, classnames = golden_model
    return Evaluator(model, classnames, ["zeroshot"])


@pytest.fixture(scope="module")
def samples(evaluator):
    """Three samples labelled with zero-shot's own prediction (so every one is attacked)."""
    gen = ViewGenerator(ViewConfig(n_views=2, size=64), seed=3)
    ids = [11, 12, 13]
    views = [gen(random_image((64, 64), seed=i), i) for i in ids]
    x = torch.stack([v[0] for v in views]).float() / 255
    with torch.no_grad():
        labels = (evaluator.model.logit_scale * evaluator.model.encode_pixels(x) @ evaluator.heads.zeroshot.T
                  ).argmax(dim=1).tolist()
    return ids, views, labels, gen


def _build(spec, evaluator):
    return build_attack(spec, evaluator.model, evaluator.heads.zeroshot)


def test_configs_record_their_threat_and_refuse_what_they_cannot_do():
    linf = attack_config({"name": "apgd_ce", "eps": 4 / 255})
    assert (linf["norm"], linf["budget"], linf["threat"], linf["steps"]) == ("Linf", 4 / 255, "eps=4/255", 100)
    l2 = attack_config({"name": "autoattack", "eps_l2": 0.5})
    assert (l2["norm"], l2["budget"], l2["threat"], l2["parts"]) == ("L2", 0.5, "L2 eps=0.5", "apgd_ce,apgd_t,fab_t")
    assert attack_config(l2) == l2        # a recorded config (derived fields included) builds the same config
    assert attack_config({"name": "autoattack"})["parts"] == "apgd_ce,apgd_t,fab_t,square"
    with pytest.raises(TypeError, match="eps_l2"):
        attack_config({"name": "square", "eps_l2": 0.5})     # Square is L-inf only here
    with pytest.raises(ValueError, match="square is L-inf only"):
        attack_config({"name": "autoattack", "eps_l2": 0.5, "parts": "apgd_ce,square"})
    with pytest.raises(ValueError, match="parts must be distinct names"):
        attack_config({"name": "autoattack", "parts": "apgd_ce,fgsm"})
    with pytest.raises(ValueError, match="eps"):
        attack_config({"name": "apgd_t", "eps": 2.0})


def test_an_l2_result_is_rounded_toward_the_clean_image_and_stays_in_the_ball():
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(0, 256, (3, 8, 8), dtype=torch.uint8, generator=g)
    direction = torch.randn(3, 8, 8, generator=g)
    x_adv = (clean.float() / 255 + 0.5 * direction / direction.norm()).clamp(0, 1)
    cfg = BudgetConfig(eps_l2=0.5)
    q = to_uint8(x_adv, clean, cfg)
    moved = (q.double() - clean.double()) / 255
    float_moved = x_adv.double() - clean.double() / 255
    assert moved.norm() <= 0.5 + 1e-9
    assert ((moved.abs() <= float_moved.abs() + 1e-9) & (moved * float_moved >= 0)).all()
    assert moved.abs().sum() > 0


@pytest.mark.parametrize("name", sorted(FAST))
def test_each_attack_stays_in_its_8bit_budget_and_is_seeded_per_sample(evaluator, samples, name):
    ids, views, labels, gen = samples
    spec = {"name": name, "eps": 1 / 255, **FAST[name]}
    eps = spec["eps"]
    attack = _build(spec, evaluator)
    adv, info = attack.perturb(ids, views, labels, gen)
    for sid, clean, a in zip(ids, views, adv):
        assert a.dtype == torch.uint8 and a.shape == clean.shape
        assert info[sid]["linf_255"] <= eps_255(eps)
        assert (info[sid]["name"], info[sid]["norm"], info[sid]["budget"]) == (name, "Linf", eps)
    assert any(i["flipped"] for i in info.values())   # zero-shot on the golden tiny CLIP falls (Square: at 4/255)
    again, _ = attack.perturb(ids[::-1], views[::-1], labels[::-1], gen)
    assert all(torch.equal(a, b) for a, b in zip(adv, again[::-1]))   # order does not matter


def test_autoattack_records_which_part_broke_each_sample(evaluator, samples):
    ids, views, labels, gen = samples
    # no APGD step (steps=0: only their random starts), so Square is left to break what it can
    attack = _build({"name": "autoattack", "eps": 2 / 255, "steps": 0, "targets": 2, "queries": 10}, evaluator)
    adv, info = attack.perturb(ids, views, labels, gen)
    for sid in ids:
        assert info[sid]["broken_by"] in (None, "apgd_ce", "apgd_t", "fab_t", "square")
        # a part broke the sample exactly when the 8-bit image fools zero-shot (the label is its clean
        # prediction); rounding to 8 bits may undo a break at the decision boundary, never make one
        if info[sid]["broken_by"] is None:
            assert not info[sid]["flipped"]
    assert {i["broken_by"] for i in info.values()} == {"square", None}
    assert all(i["flipped"] for i in info.values() if i["broken_by"] == "square")


def test_autoattack_counts_a_break_only_if_it_survives_8_bits(evaluator, samples):
    # FAB-T's closest points on these samples lie under half a grey level from the clean image: in float
    # they fool zero-shot, rounded they do not, so Square must still get those samples
    ids, views, labels, gen = samples
    spec = {"name": "autoattack", "eps": 4 / 255, "steps": 3, "targets": 2, "queries": 10, "parts": "fab_t,square"}
    adv, info = _build(spec, evaluator).perturb(ids, views, labels, gen)
    assert all((i["broken_by"] is not None) == i["flipped"] for i in info.values())
    assert "square" in {i["broken_by"] for i in info.values()}
    fab, _ = _build({"name": "fab_t", "eps": 4 / 255, "steps": 3, "targets": 2}, evaluator).perturb(ids, views, labels,
                                                                                                   gen)
    assert all(torch.equal(a, clean) for a, clean in zip(fab, views))   # rounded back to the clean images
    # truncated toward 0 instead, FAB-T's points keep their breaks, and the records name FAB-T
    _, info = _build({**spec, "quantize": "truncate"}, evaluator).perturb(ids, views, labels, gen)
    assert all(i["broken_by"] == "fab_t" and i["flipped"] for i in info.values())


@pytest.mark.parametrize("name", ["apgd_ce", "fab_t"])
def test_l2_attacks_keep_the_l2_budget_in_8_bits(evaluator, samples, name):
    ids, views, labels, gen = samples
    attack = _build({"name": name, "eps_l2": 0.5, "steps": 3}, evaluator)
    adv, info = attack.perturb(ids, views, labels, gen)
    for sid, clean, a in zip(ids, views, adv):
        assert ((a[0].double() - clean[0].double()) / 255).norm() <= 0.5 + 1e-9
        assert (info[sid]["norm"], info[sid]["budget"]) == ("L2", 0.5)


def test_the_targeted_dlr_attacks_refuse_fewer_than_four_classes(evaluator):
    head = evaluator.heads.zeroshot[:3]
    for name in ("apgd_t", "autoattack"):
        with pytest.raises(ValueError, match=f"attack {name}: needs at least 4 classes .* the run has 3"):
            build_attack({"name": name}, evaluator.model, head)
    assert build_attack({"name": "autoattack", "parts": "apgd_ce,square"}, evaluator.model, head) is not None
    assert build_attack({"name": "apgd_ce"}, evaluator.model, head) is not None
