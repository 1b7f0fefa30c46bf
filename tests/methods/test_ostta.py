"""OSTTA: its filter and loss against straightforward computations, and CLIPTTA's OSTTA (github.com/MarcLafon/
cliptta `ttavlm/methods/ostta.py`) on the golden tiny ViT (tests/fixtures/golden/ostta, made by the driver beside
the fixtures, float32 on the CPU).

Golden: 24 images in 3 batches of 8, their argparse defaults with 3 Adam steps at lr 3e-3, margin 0.01 and logit
scale 10 (continual; the filter keeps 0, 6 and 8 of the batches' images at the last step), and an episodic SGD
variant at margin 0.05 (every step falls back to all images); after every batch the logits (TUNED_LOGITS), the
recorded OOD scores (FEATURES), every adapted normalisation parameter (NORM_PARAMS), the predictions exactly after
a top-1 margin check.
"""
from __future__ import annotations

import json

import pytest
import torch

import shiftlab
from _golden import FEATURES, NORM_PARAMS, TUNED_LOGITS, assert_close, assert_top1_margin, stream_views
from shiftlab.methods.context import SampleContext
from shiftlab.methods.ostta.method import ostta_loss, wisdom_of_crowds_filter

pytestmark = pytest.mark.usefixtures("one_thread")

# the variants of the driver, as shiftlab configs (their argv: tests/fixtures/golden/ostta/ostta.json)
VARIANTS = {"ostta": {"steps": 3, "lr": 3e-3, "margin": 0.01, "logit_scale": 10.0},
            "ostta_sgd": {"steps": 3, "episodic": True, "optimizer": "sgd", "lr": 0.01, "margin": 0.05,
                          "mean_entropy_weight": 0.0}}


def test_filter_keeps_images_whose_source_class_gained_the_margin():
    source = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.5, 0.25, 0.25]])
    adapted = torch.tensor([[0.9, 0.05, 0.05], [0.1, 0.8, 0.1], [0.2, 0.7, 0.1]])
    assert wisdom_of_crowds_filter(adapted, source, 0.1).tolist() == [True, True, False]
    assert wisdom_of_crowds_filter(adapted, source, 0.2).tolist() == [True, False, False]


def test_loss_is_the_kept_images_entropy_or_everyones_when_none_is_kept():
    logits = torch.tensor([[3.0, 1.0, 0.0], [0.0, 2.0, 0.5], [1.0, 1.0, 1.0]])
    p = logits.softmax(-1)
    h = -(p * p.log()).sum(-1)
    pm = p.mean(0)
    hm = float(-(pm * (pm + 1e-6).log()).sum())
    kept = torch.tensor([True, False, True])
    assert float(ostta_loss(logits, kept, 1.0, 0.0)) == pytest.approx(float(h[kept].mean()), abs=1e-6)
    assert float(ostta_loss(logits, torch.zeros(3, dtype=torch.bool), 2.0, 0.5)) == pytest.approx(
        2 * float(h.mean()) - 0.5 * hm, abs=1e-6)


def test_bad_values_are_refused_in_one_line(tiny_model):
    for kw, match in (({"margin": 2.0}, "ostta.margin"), ({"score": "nope"}, "ostta.score"),
                      ({"mean_entropy_weight": -1.0}, "ostta.mean_entropy_weight")):
        with pytest.raises(ValueError, match=match):
            shiftlab.create_method("ostta", tiny_model, ["a", "b"], **kw)


@pytest.mark.golden
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_ostta_matches_cliptta_batch_by_batch(golden_vit, golden_dir, variant):
    model, names, heads = golden_vit
    want = torch.load(golden_dir / "ostta" / f"{variant}.pt", map_location="cpu", weights_only=True)
    info = json.loads((golden_dir / "ostta" / "ostta.json").read_text())["fixtures"][variant]
    assert_close(heads.zeroshot, want["prototypes"], FEATURES, "text head")
    config = {"logit_scale": 100.0, **VARIANTS[variant]}
    method = shiftlab.create_method("ostta", model, names, heads=heads, **config)
    assert method.tower.parameter_names == info["adapted"]
    views = [model.normalize(v) for v in stream_views(golden_dir, 1)]
    kept = []
    for b in range(info["n_batches"]):
        outs = method.adapt_batch([SampleContext(model, heads, v) for v in views[8 * b:8 * b + 8]])
        kept += [o.extras["kept"] for o in outs]
        logits = torch.stack([o.logits for o in outs])
        assert_close(logits, want[f"{b}/logits"], TUNED_LOGITS, f"batch {b} logits")
        assert_close(torch.tensor([o.ood_score for o in outs]), want[f"{b}/scores"], FEATURES, f"batch {b} scores")
        for name, value in method.tower.norm_state().items():
            assert_close(value, want[f"{b}/norm/{name}"], NORM_PARAMS, f"batch {b} {name}")
        assert_top1_margin(want[f"{b}/logits"], TUNED_LOGITS, f"batch {b}")
        assert torch.equal(logits.argmax(1), want[f"{b}/logits"].argmax(1))
    # the filter's two branches: some images kept and some not (ostta), none kept (ostta_sgd)
    assert (0 < sum(kept) < len(kept)) if variant == "ostta" else not any(kept)
