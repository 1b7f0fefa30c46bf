"""EATA: its filters and Fisher against straightforward computations, and CLIPTTA's ETA (github.com/MarcLafon/cliptta
`ttavlm/methods/eata.py`, the CLIP version issue #32 follows) on the golden tiny ViT (tests/fixtures/golden/eata, made
by the driver beside the fixtures, float32 on the CPU).

Golden: 24 images in 3 batches of 8, continual, with their argparse defaults (1 Adam step; the redundancy filter
on the unscaled cosines' probabilities then rejects every later image) and a stronger variant (3 steps, lr 0.01,
margin 0.9999, where the filter keeps some and rejects some); after every batch the logits (TUNED_LOGITS: measured
3.7e-4), the norm parameters (NORM_PARAMS: 4.1e-5), the moving average (FEATURES: 1.4e-9) and the counters of
reliable and selected images exactly (the logits would move far beyond their tolerance had one image gone the
other way).
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _golden import FEATURES, NORM_PARAMS, TUNED_LOGITS, assert_close, stream_views
from shiftlab.methods.context import SampleContext
from shiftlab.methods.eata.method import select_samples, updated_average
from shiftlab.synthetic import tiny_vit

pytestmark = pytest.mark.usefixtures("one_thread")

VARIANTS = {"eata": {}, "eata_strong": {"steps": 3, "lr": 0.01, "redundancy_margin": 0.9999}}


def test_filters_keep_the_reliable_images_unlike_the_moving_average():
    entropies = torch.tensor([0.1, 2.0, 0.3, 0.2])
    probs = torch.tensor([[0.9, 0.1], [0.5, 0.5], [0.1, 0.9], [0.8, 0.2]])
    assert select_samples(entropies, probs, None, 1.0, 0.05).tolist() == [True, False, True, True]
    average = torch.tensor([1.0, 0.0])
    cos = F.cosine_similarity(average[None], probs, dim=1)
    want = [bool(e < 1.0 and abs(c) < 0.5) for e, c in zip(entropies.tolist(), cos.tolist())]
    assert select_samples(entropies, probs, average, 1.0, 0.5).tolist() == want == [False, False, True, False]
    torch.testing.assert_close(updated_average(None, probs[:2], 0.9), probs[:2].mean(0))
    torch.testing.assert_close(updated_average(average, probs[2:], 0.9), 0.9 * average + 0.1 * probs[2:].mean(0))
    assert updated_average(average, probs[:0], 0.9) is average


def test_fisher_is_the_mean_squared_gradient_of_the_pseudo_label_loss_and_penalises_drift():
    model = tiny_vit(0)
    classes = ["cat", "dog", "car"]
    method = shiftlab.create_method("eata", model, classes, fisher_alpha=2.0, steps=1)
    gen = torch.Generator().manual_seed(5)
    batches = [model.normalize(torch.rand(2, 3, 64, 64, generator=gen)) for _ in range(2)]
    method.compute_fisher(batches)
    name = "ln_post.weight"
    p = method.tower.visual.get_parameter(name)
    want = torch.zeros_like(p)
    for batch in batches:
        logits = method.logits(batch)
        (g,) = torch.autograd.grad(F.cross_entropy(logits, logits.argmax(1)), [p])
        want += g ** 2
    torch.testing.assert_close(method.fishers[name][0], want / 2, rtol=1e-5, atol=1e-12)
    assert float(method.fisher_penalty().detach()) == 0.0       # no drift yet
    with torch.no_grad():
        p.add_(0.1)
    want_penalty = float((method.fishers[name][0] * 0.01).sum())
    assert float(method.fisher_penalty().detach()) == pytest.approx(want_penalty, rel=1e-4)


def test_fisher_alpha_without_a_fisher_is_refused_in_one_line():
    model = tiny_vit(0)
    method = shiftlab.create_method("eata", model, ["a", "b"], fisher_alpha=1.0)
    ctx = SampleContext(model, method.heads, model.normalize(torch.rand(1, 3, 64, 64)))
    with pytest.raises(ValueError, match=r"^eata.fisher_alpha > 0 needs the Fisher information"):
        method.adapt_batch([ctx])


def test_paper_protocol_is_eatas_own_recipe():
    from shiftlab.methods.base import describe
    paper = describe("paper", "eata")["config"]
    assert (paper["optimizer"], paper["lr"], paper["momentum"], paper["skip_empty_step"],
            paper["redundancy_on_scaled_logits"], paper["mean_entropy_weight"]) \
        == ("sgd", 0.00025, 0.9, True, True, 0.0)


# -- CLIPTTA's code (tests/fixtures/golden/eata) -------------------------------------------------------------


@pytest.mark.golden
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_eata_matches_cliptta_batch_by_batch(golden_vit, golden_dir, variant):
    model, names, heads = golden_vit
    want = torch.load(golden_dir / "eata" / f"{variant}.pt", map_location="cpu", weights_only=True)
    info = json.loads((golden_dir / "eata" / "eata.json").read_text())["fixtures"][variant]
    assert info["argv"][info["argv"].index("--adaptation") + 1] == "eta" and info["n_batches"] == 3
    method = shiftlab.create_method("eata", model, names, heads=heads, logit_scale=100.0, **VARIANTS[variant])
    assert method.tower.parameter_names == info["adapted"]
    views = [model.normalize(v) for v in stream_views(golden_dir, 1)]
    kept = []
    for b in range(info["n_batches"]):
        outs = method.adapt_batch([SampleContext(model, heads, v) for v in views[8 * b:8 * b + 8]])
        assert_close(torch.stack([o.logits for o in outs]), want[f"{b}/logits"], TUNED_LOGITS, f"batch {b} logits")
        for name, value in method.tower.norm_state().items():
            assert_close(value, want[f"{b}/norm/{name}"], NORM_PARAMS, f"batch {b} {name}")
        assert_close(method.average, want[f"{b}/average"], FEATURES, f"batch {b} moving average")
        assert (method.selected_total, method.reliable_total) == (int(want[f"{b}/selected"]),
                                                                  int(want[f"{b}/reliable"]))
        kept.append(sum(o.extras["selected"] for o in outs))
    if variant == "eata_strong":      # the redundancy filter did decide: some images kept, some rejected
        assert 0 < sum(kept) < 24
