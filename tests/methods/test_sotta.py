"""SoTTA: its memory against straightforward expectations, and CLIPTTA's SoTTA (github.com/MarcLafon/cliptta
`ttavlm/methods/sotta.py`, `memory/hus.py`, `optimizers/sam.py`) on the golden tiny ViT (tests/fixtures/golden/sotta,
made by the driver beside the fixtures, float32 on the CPU).

Golden: 24 images in 3 continual batches of 8, 2 Adam steps at lr 3e-3 and logit scale 10, a memory of 6 images
admitting max_prob >= 0.995 at logit scale 100: their unmodified code with SAM (the loss on the memory's first
image), and their code without SAM with the memory handed over as one view (the loss on every stored image,
shiftlab's default). After every batch the memory's images (exactly, in order), the logits (TUNED_LOGITS), the
recorded OOD scores (FEATURES), every adapted normalisation parameter (NORM_PARAMS), the predictions exactly.
"""
from __future__ import annotations

import json

import pytest
import torch

import shiftlab
from _golden import FEATURES, NORM_PARAMS, TUNED_LOGITS, assert_close, assert_top1_margin, stream_views
from shiftlab.methods.context import SampleContext
from shiftlab.methods.sotta.method import BalancedMemory

pytestmark = pytest.mark.usefixtures("one_thread")

COMMON = {"steps": 2, "lr": 3e-3, "logit_scale": 10.0, "capacity": 6, "ood_logit_scale": 100.0,
          "confidence_threshold": 0.995}
# the variants of the driver, as shiftlab configs (their argv: tests/fixtures/golden/sotta/sotta.json)
VARIANTS = {"sotta": {**COMMON, "sam": True, "memory_loss": "first"}, "sotta_all": COMMON}


def test_memory_refuses_the_unconfident_and_evicts_from_the_largest_class():
    memory = BalancedMemory(num_classes=3, capacity=3, threshold=0.5, seed=0)
    image = [torch.full((1,), float(i)) for i in range(6)]
    assert not memory.add(image[0], 0, 0.4)
    assert [memory.add(image[i], c, 0.9) for i, c in ((1, 0), (2, 0), (3, 1))] == [True, True, True]
    memory.add(image[4], 2, 0.9)                  # full: class 0 is the largest, one of its images goes
    assert [len(c) for c in memory.images] == [1, 1, 1]
    memory.add(image[5], 1, 0.9)                  # all tie: its own class 1 gives way
    assert memory.images[1] == [image[5]] and len(memory) == 3
    assert memory.contents().flatten().tolist()[1:] == [5.0, 4.0]


def test_memory_state_round_trips_its_images_and_draws():
    memory = BalancedMemory(num_classes=2, capacity=2, threshold=0.0, seed=3)
    for i in range(5):
        memory.add(torch.full((2,), float(i)), i % 2, 1.0)
    copy = BalancedMemory(num_classes=2, capacity=2, threshold=0.0, seed=99)
    copy.load(memory.state())
    for i in range(5, 12):
        memory.add(torch.full((2,), float(i)), 0, 1.0)
        copy.add(torch.full((2,), float(i)), 0, 1.0)
    assert torch.equal(memory.contents(), copy.contents())


def test_bad_values_are_refused_in_one_line(tiny_model):
    for kw, match in (({"capacity": 0}, "sotta.capacity"), ({"memory_loss": "some"}, "sotta.memory_loss"),
                      ({"confidence_threshold": 1.5}, "sotta.confidence_threshold")):
        with pytest.raises(ValueError, match=match):
            shiftlab.create_method("sotta", tiny_model, ["a", "b"], **kw)


@pytest.mark.golden
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_sotta_matches_cliptta_batch_by_batch(golden_vit, golden_dir, variant):
    model, names, heads = golden_vit
    want = torch.load(golden_dir / "sotta" / f"{variant}.pt", map_location="cpu", weights_only=True)
    info = json.loads((golden_dir / "sotta" / "sotta.json").read_text())["fixtures"][variant]
    assert_close(heads.zeroshot, want["prototypes"], FEATURES, "text head")
    method = shiftlab.create_method("sotta", model, names, heads=heads, **VARIANTS[variant])
    assert method.tower.parameter_names == info["adapted"]
    views = [model.normalize(v) for v in stream_views(golden_dir, 1)]
    pixels = torch.cat([v[:1] for v in views])
    admitted = []
    for b in range(info["n_batches"]):
        outs = method.adapt_batch([SampleContext(model, heads, v) for v in views[8 * b:8 * b + 8]])
        admitted += [o.extras["admitted"] for o in outs]
        stored = [int((pixels == im).flatten(1).all(1).nonzero()[0]) for im in method.memory.contents()]
        assert stored == want[f"{b}/memory"].tolist(), f"batch {b} memory"
        logits = torch.stack([o.logits for o in outs])
        assert_close(logits, want[f"{b}/logits"], TUNED_LOGITS, f"batch {b} logits")
        assert_close(torch.tensor([o.ood_score for o in outs]), want[f"{b}/scores"], FEATURES, f"batch {b} scores")
        for name, value in method.tower.norm_state().items():
            assert_close(value, want[f"{b}/norm/{name}"], NORM_PARAMS, f"batch {b} {name}")
        assert_top1_margin(want[f"{b}/logits"], TUNED_LOGITS, f"batch {b}")
        assert torch.equal(logits.argmax(1), want[f"{b}/logits"].argmax(1))
    # the memory's three paths: images refused, admitted, and admitted in place of an evicted one
    assert 0 < sum(admitted) < len(admitted) and sum(admitted) > VARIANTS[variant]["capacity"]


def test_with_their_defaults_nothing_enters_the_memory_and_nothing_adapts(tiny_model):
    # max_prob at ood_logit_scale 1 of 200 classes' cosines stays near 1 / 200, below their threshold 0.5
    names = [f"class {i}" for i in range(200)]
    method = shiftlab.create_method("sotta", tiny_model, names)
    before = method.tower.norm_state()
    views = torch.rand(4, 1, 3, tiny_model.image_size, tiny_model.image_size)
    outs = method.adapt_batch([SampleContext(tiny_model, method.heads, tiny_model.normalize(v)) for v in views])
    assert [o.extras["admitted"] for o in outs] == [False] * 4 and len(method.memory) == 0
    assert outs[0].extras["loss"] is None
    assert all(torch.equal(v, before[k]) for k, v in method.tower.norm_state().items())
