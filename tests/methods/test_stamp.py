"""STAMP: its memory and loss against straightforward computations, and CLIPTTA's STAMP (github.com/MarcLafon/
cliptta `ttavlm/methods/stamp.py`, `optimizers/sam.py`) on the golden tiny ViT (tests/fixtures/golden/stamp, made by
the driver beside the fixtures, float32 on the CPU).

Golden: 24 images in 3 continual batches of 8, 2 Adam steps at lr 3e-3 and logit scale 30, entropy margin 0.72 ln C,
a memory of 6 images: with consistency filtering and SAM, and without either. After every batch the memory's
images (exactly, in order), the logits (TUNED_LOGITS), the recorded OOD scores (FEATURES), every adapted
normalisation parameter (STAMP_NORM_PARAMS: their loss is badly conditioned on the tiny ViT), the predictions exactly.
"""
from __future__ import annotations

import json

import pytest
import torch

import shiftlab
from _golden import FEATURES, TUNED_LOGITS, assert_close, assert_top1_margin, stream_views
from shiftlab.methods.context import SampleContext
from shiftlab.methods.stamp.method import ClassBalancedMemory, reliability_weighted_entropy

pytestmark = pytest.mark.usefixtures("one_thread")

COMMON = {"steps": 2, "lr": 3e-3, "logit_scale": 30.0, "memory_length": 6, "entropy_margin": 0.72}
# their loss is the entropy of the raw cosines (scale 1), whose gradients on the tiny ViT are near Adam's eps:
# a relative change of 1e-6 in the loss's scale moves the adapted parameters by 2.6e-5 after one batch, so the
# parameters are compared within this (measured against their code: 4.4e-5 without SAM, 1.8e-4 with, whose
# normalised ascent direction amplifies the noise); the logits stay within TUNED_LOGITS
STAMP_NORM_PARAMS = 3e-4
# the variants of the driver, as shiftlab configs (their argv: tests/fixtures/golden/stamp/stamp.json)
VARIANTS = {"stamp": {**COMMON, "consistency_filtering": True, "sam": True}, "stamp_plain": COMMON}


def test_memory_drops_the_oldest_image_of_the_class_with_the_largest_running_count():
    memory = ClassBalancedMemory(num_classes=3, capacity=3, seed=0)
    image = [torch.full((1,), float(i)) for i in range(5)]
    memory.add(torch.stack(image[:3]), [0, 0, 1])
    memory.replay()                               # running counts 0.2, 0.1, 0
    assert torch.allclose(memory.counts, torch.tensor([0.2, 0.1, 0.0]))
    memory.add(image[3][None], [2])               # class 0 has the largest count: its oldest image goes
    assert memory.images == [[image[1]], [image[2]], [image[3]]]
    assert memory.replay().flatten().tolist() == [1.0, 2.0, 3.0]


def test_loss_weighs_each_entropy_by_its_normalised_exp_minus_entropy():
    logits = torch.tensor([[3.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    p = logits.softmax(-1)
    h = -(p * p.log()).sum(-1)
    w = torch.exp(-h) / torch.exp(-h).sum()
    assert float(reliability_weighted_entropy(logits, 4)) == pytest.approx(float((h * w * 4).mean()), abs=1e-6)


def test_bad_values_are_refused_in_one_line(tiny_model):
    for kw, match in (({"memory_length": 0}, "stamp.memory_length"), ({"entropy_margin": 0.0}, "stamp.entropy_margin"),
                      ({"loss_logit_scale": -1.0}, "stamp.loss_logit_scale")):
        with pytest.raises(ValueError, match=match):
            shiftlab.create_method("stamp", tiny_model, ["a", "b"], **kw)


@pytest.mark.golden
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_stamp_matches_cliptta_batch_by_batch(golden_vit, golden_dir, variant):
    model, names, heads = golden_vit
    want = torch.load(golden_dir / "stamp" / f"{variant}.pt", map_location="cpu", weights_only=True)
    info = json.loads((golden_dir / "stamp" / "stamp.json").read_text())["fixtures"][variant]
    assert_close(heads.zeroshot, want["prototypes"], FEATURES, "text head")
    method = shiftlab.create_method("stamp", model, names, heads=heads, **VARIANTS[variant])
    assert method.tower.parameter_names == info["adapted"]
    views = [model.normalize(v) for v in stream_views(golden_dir, 1)]
    pixels = torch.cat([v[:1] for v in views])
    reliable = []
    for b in range(info["n_batches"]):
        outs = method.adapt_batch([SampleContext(model, heads, v) for v in views[8 * b:8 * b + 8]])
        reliable += [o.extras["reliable"] for o in outs]
        stored = [int((pixels == im).flatten(1).all(1).nonzero()[0]) for stored in method.memory.images
                  for im in stored]
        assert stored == want[f"{b}/memory"].tolist(), f"batch {b} memory"
        logits = torch.stack([o.logits for o in outs])
        assert_close(logits, want[f"{b}/logits"], TUNED_LOGITS, f"batch {b} logits")
        assert_close(torch.tensor([o.ood_score for o in outs]), want[f"{b}/scores"], FEATURES, f"batch {b} scores")
        for name, value in method.tower.norm_state().items():
            assert_close(value, want[f"{b}/norm/{name}"], STAMP_NORM_PARAMS, f"batch {b} {name}")
        assert_top1_margin(want[f"{b}/logits"], TUNED_LOGITS, f"batch {b}")
        assert torch.equal(logits.argmax(1), want[f"{b}/logits"].argmax(1))
    # images refused and admitted (2 steps x the admitted ones overflow the memory of 6)
    assert 0 < sum(reliable) < len(reliable)
