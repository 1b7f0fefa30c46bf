"""WATT: the weight average against a straightforward computation, WATT-S vs WATT-P's starting points, the
episodic reset per batch, and the authors' own code on the golden stream (tests/fixtures/golden/watt, made by the
driver beside the fixtures from github.com/Mehrdad-Noori/WATT's `WATT` class, float32 on the CPU).

Golden, through shiftlab's own tiny ViT encoder (the same weights): WATT-S every step's loss (CLIPTTA_LOSS), every
batch's probabilities (FEATURES) and LayerNorm parameters (NORM_PARAMS), its predictions exactly. WATT-P restarts
each template from a fresh Adam state, whose first step moves an entry by lr x g / (|g| + 1e-8): an entry whose
gradient nearly cancels (|g| ~ 1e-8, float32 noise) moves by anything up to lr in either code (measured: one entry
of batch 0 differs by 4.0e-4 after template 3's first step, then 2.6e-4 after the average). The next round starts from
their average, so every entry then moves a little: WATT-P's parameters are held to 2 lr (measured 3.9e-4) and
their median difference to NORM_PARAMS, its probabilities to 2 x 1e-3
(measured 8.1e-4) and its predictions exactly.
"""
from __future__ import annotations

import json

import pytest
import torch

import shiftlab
from _golden import FEATURES, NORM_PARAMS, assert_close, fixture_tolerances, stream_views
from shiftlab.methods.context import ClassHeads, SampleContext
from shiftlab.methods.watt.method import average

CLIPTTA_LOSS = fixture_tolerances("watt")["loss"]  # tests/fixtures/golden/watt/tolerances.json

CLASSNAMES = ["cat", "dog", "car", "tree", "boat", "house"]
BATCH = 8
TEMPLATES = ("a photo of a {}", "a {}.", "photo of a {}")

pytestmark = pytest.mark.usefixtures("one_thread")


def test_average_is_the_mean_of_the_weight_sets():
    sets = [{"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([3.0, 6.0])}, {"w": torch.tensor([5.0, 1.0])}]
    assert average(sets)["w"].tolist() == [3.0, 3.0]


def _ctxs(model, heads, n: int) -> list[SampleContext]:
    g = torch.Generator().manual_seed(0)
    pixels = model.normalize(torch.rand(n, 3, model.image_size, model.image_size, generator=g))
    return [SampleContext(model, heads, pixels[i:i + 1]) for i in range(n)]


@pytest.mark.parametrize("averaging", ["sequential", "parallel"])
def test_one_template_one_round_is_plain_steps_and_batches_are_episodic(averaging, tiny_model):
    heads = ClassHeads(tiny_model, CLASSNAMES)
    before = {k: v.clone() for k, v in tiny_model.clip.state_dict().items()}
    ctxs = _ctxs(tiny_model, heads, 8)
    config = dict(templates=("a photo of a {}",), repetitions=1, steps_per_template=2, lr=1e-2, averaging=averaging)
    watt = shiftlab.create_method("watt", tiny_model, CLASSNAMES, heads=heads, **config)
    clipartt = shiftlab.create_method("clipartt", tiny_model, CLASSNAMES, heads=heads, steps=2, lr=1e-2, top_k=1,
                                      template="a photo of a {}")
    first = [o.logits for o in watt.adapt_batch(ctxs[:4])]
    # one template, one round: the average of one weight set is CLIPArTT's K = 1 steps with the same head
    assert all(torch.allclose(a, o.logits, atol=1e-5) for a, o in zip(first, clipartt.adapt_batch(ctxs[:4])))
    watt.adapt_batch(ctxs[4:])
    assert all(torch.equal(a, o.logits) for a, o in zip(first, watt.adapt_batch(ctxs[:4])))   # reset per batch
    assert all(torch.equal(v, before[k]) for k, v in tiny_model.clip.state_dict().items())



@pytest.mark.golden
@pytest.mark.slow
@pytest.mark.parametrize("variant, averaging", [("watt_s", "sequential"), ("watt_p", "parallel")])
def test_every_batch_as_their_code(variant, averaging, golden_vit, golden_dir):
    from _golden import FIXTURES
    info = json.loads((FIXTURES / "watt" / "watt.json").read_text())
    assert info["reference"]["commit"] == "40e3faebeaafe422a6b922ed5565500af2272982"
    args = info["fixtures"][variant]["arguments"]
    assert (args["type"], args["l"], args["m"], args["lr"], tuple(args["templates"])) == (averaging, 2, 2, 1e-3,
                                                                                           TEMPLATES)
    model, names, heads = golden_vit
    want = torch.load(FIXTURES / "watt" / f"{variant}.pt", weights_only=True)
    method = shiftlab.create_method("watt", model, names, heads=heads, precision="fp32", logit_scale=100.0,
                                    averaging=averaging, repetitions=2, steps_per_template=2, templates=TEMPLATES)
    views = [model.normalize(v) for v in stream_views(golden_dir, 1)]
    for b in range(len(views) // BATCH):
        outs = method.adapt_batch([SampleContext(model, heads, v) for v in views[b * BATCH:(b + 1) * BATCH]])
        probs = torch.stack([o.probabilities() for o in outs])
        params = torch.cat([p.detach().reshape(-1) for p in method.tower.adapted_parameters()])
        assert probs.argmax(-1).tolist() == want[f"{b}/pred"].tolist()
        if variant == "watt_s":
            assert_close(torch.tensor(method.losses), want[f"{b}/losses"], CLIPTTA_LOSS, f"{b} losses")
            assert_close(probs, want[f"{b}/probs"], FEATURES, f"{b} probs")
            assert_close(params, want[f"{b}/params"], NORM_PARAMS, f"{b} LayerNorm parameters")
        else:
            off = (params - want[f"{b}/params"]).abs()
            assert float(off.max()) <= 2 * 1e-3 and float(off.median()) <= NORM_PARAMS, (b, off.max(), off.median())
            assert_close(probs, want[f"{b}/probs"], 2e-3, f"{b} probs")
