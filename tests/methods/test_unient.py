"""UniEnt: its pieces against straightforward computations, and CLIPTTA's UniEnt (github.com/MarcLafon/cliptta
`ttavlm/methods/unient.py`, scikit-learn's GaussianMixture unmodified) on the golden tiny ViT
(tests/fixtures/golden/unient, made by the driver beside the fixtures, float32 on the CPU).

Golden: 24 images in 3 batches of 8, the open-set script's loss (10 Adam steps per batch, continual, lr 1e-3) and
an episodic SGD variant with the OOD term; at every step the mixture's input (FEATURES) and ID posteriors
(GMM_POSTERIOR), after every batch the logits (TUNED_LOGITS), the recorded OOD scores (FEATURES), every adapted
normalisation parameter (NORM_PARAMS), the predictions exactly after a top-1 margin check.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import shiftlab
import shiftlab.methods.unient.method as unient_method
from _golden import FEATURES, NORM_PARAMS, TUNED_LOGITS, assert_close, assert_top1_margin, stream_views
from shiftlab.methods.context import SampleContext
from shiftlab.methods.unient.method import mixture_id_weights, normalised_ood_scores, unient_loss

pytestmark = pytest.mark.usefixtures("one_thread")

# the mixture's posteriors (float32: scikit-learn fits float32 scores in float32): a MIXTURE_INPUT-sized move of
# a score moves a posterior by (score gap / variance) x that; measured 7.4e-5 (logits 3.2e-5, norms 1.1e-6,
# scores 1.4e-9)
GMM_POSTERIOR = 1e-3
# the mixture's input: max probabilities (~1/C) min-max normalised over the batch, the division by their range
# (~1e-2 of 1/C on the tiny ViT) magnifying their FEATURES-sized noise; measured 3.2e-5
MIXTURE_INPUT = 1e-4
# the variants of the driver, as shiftlab configs (their argv: tests/fixtures/golden/unient/unient.json)
VARIANTS = {"unient": {"lr": 1e-3},
            "unient_ood": {"steps": 3, "ood_loss": True, "episodic": True, "optimizer": "sgd", "lr": 0.01,
                           "mean_entropy_weight": 0.1, "ood_weight": 0.1}}


def test_ood_scores_are_one_minus_the_normalised_confidence():
    logits = torch.tensor([[2.0, 0.0], [0.0, 0.0], [1.0, 0.0]])
    conf = logits.softmax(-1).max(-1).values
    want = 1 - (conf - conf.min()) / (conf.max() - conf.min())
    torch.testing.assert_close(normalised_ood_scores(logits), want)
    assert normalised_ood_scores(logits).tolist()[:2] == [0.0, 1.0]


def test_mixture_weights_the_low_cluster_as_in_distribution_and_degenerate_batches_as_all_id():
    ood = torch.tensor([0.0, 0.05, 0.1, 0.02, 0.9, 1.0, 0.95])
    w = mixture_id_weights(ood, np.random.RandomState(0))
    assert (w[:4] > 0.99).all() and (w[4:] < 0.01).all()
    assert mixture_id_weights(torch.tensor([float("nan")] * 3), np.random.RandomState(0)).tolist() == [1.0] * 3
    assert mixture_id_weights(torch.tensor([0.3]), np.random.RandomState(0)).tolist() == [1.0]


def test_without_scikit_learn_the_mixture_stops_with_one_line(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "sklearn.mixture", None)
    want = r"^unient's Gaussian mixture needs scikit-learn \(pip install 'shiftlab\[ood\]'\)$"
    with pytest.raises(ImportError, match=want):
        mixture_id_weights(torch.tensor([0.0, 0.5, 1.0]), np.random.RandomState(0))


def test_loss_is_the_weighted_entropies_minus_the_mean_entropy_term():
    logits = torch.tensor([[3.0, 1.0, 0.0], [0.0, 2.0, 0.5], [1.0, 1.0, 1.0]])
    w = torch.tensor([1.0, 0.25, 0.0])
    p = logits.softmax(-1)
    h = -(p * p.log()).sum(-1)
    pm = p.mean(0)
    hm = float(-(pm * (pm + 1e-6).log()).sum())
    assert float(unient_loss(logits, w, 1.0, 0.0, 0.0)) == pytest.approx(float((h * w).mean()), abs=1e-6)
    assert float(unient_loss(logits, w, 2.0, 0.5, 0.3)) == pytest.approx(
        float(2 * (h * w).mean() - 0.5 * hm - 0.3 * (h * (1 - w)).mean()), abs=1e-6)


def test_records_its_own_ood_score_and_resumes_exactly(tiny_model):
    classes = ["cat", "dog", "car"]
    batch = tiny_model.normalize(torch.rand(6, 3, 64, 64, generator=torch.Generator().manual_seed(3)))
    ctxs = lambda m, lo, hi: [SampleContext(tiny_model, m.heads, batch[i:i + 1]) for i in range(lo, hi)]  # noqa: E731
    a = shiftlab.create_method("unient", tiny_model, classes, steps=2, lr=0.1)
    a.adapt_batch(ctxs(a, 0, 3))
    state = a.state_dict()
    first = a.adapt_batch(ctxs(a, 3, 6))
    b = shiftlab.create_method("unient", tiny_model, classes, steps=2, lr=0.1)
    b.load_state_dict(state)
    second = b.adapt_batch(ctxs(b, 3, 6))
    for x, y in zip(first, second):
        assert torch.equal(x.logits, y.logits) and x.ood_score == y.ood_score
    cos = torch.stack([o.logits for o in first]) / a.scale
    want = cos.softmax(-1).max(-1).values
    assert [o.ood_score for o in first] == pytest.approx(want.tolist(), abs=1e-6)


def test_bad_values_are_refused_in_one_line(tiny_model):
    for kw, match in (({"steps": 0}, "unient.steps"), ({"score": "nope"}, "unient.score"),
                      ({"ood_weight": -1.0}, "unient.ood_weight"), ({"mixture_seed": -1}, "unient.mixture_seed")):
        with pytest.raises(ValueError, match=match):
            shiftlab.create_method("unient", tiny_model, ["a", "b"], **kw)


@pytest.mark.golden
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_unient_matches_cliptta_batch_by_batch(golden_vit, golden_dir, variant, monkeypatch):
    model, names, heads = golden_vit
    want = torch.load(golden_dir / "unient" / f"{variant}.pt", map_location="cpu", weights_only=True)
    info = json.loads((golden_dir / "unient" / "unient.json").read_text())["fixtures"][variant]
    assert_close(heads.zeroshot, want["prototypes"], FEATURES, "text head")
    calls = []
    fit = unient_method.mixture_id_weights

    def recording(ood, rng):
        calls.append((ood.clone(), fit(ood, rng)))
        return calls[-1][1]
    monkeypatch.setattr(unient_method, "mixture_id_weights", recording)
    method = shiftlab.create_method("unient", model, names, heads=heads, logit_scale=100.0, **VARIANTS[variant])
    assert method.tower.parameter_names == info["adapted"]
    views = [model.normalize(v) for v in stream_views(golden_dir, 1)]
    for b in range(info["n_batches"]):
        calls.clear()
        outs = method.adapt_batch([SampleContext(model, heads, v) for v in views[8 * b:8 * b + 8]])
        for s, (ood, w) in enumerate(calls):
            assert_close(ood, want[f"{b}/gmm_in/{s}"][:, 0], MIXTURE_INPUT, f"batch {b} step {s} mixture input")
            low = int(want[f"{b}/gmm_means/{s}"].argmin())
            assert_close(w, want[f"{b}/gmm_proba/{s}"][:, low], GMM_POSTERIOR, f"batch {b} step {s} ID weights")
        logits = torch.stack([o.logits for o in outs])
        assert_close(logits, want[f"{b}/logits"], TUNED_LOGITS, f"batch {b} logits")
        assert_close(torch.tensor([o.ood_score for o in outs]), want[f"{b}/scores"], FEATURES, f"batch {b} scores")
        for name, value in method.tower.norm_state().items():
            assert_close(value, want[f"{b}/norm/{name}"], NORM_PARAMS, f"batch {b} {name}")
        assert_top1_margin(want[f"{b}/logits"], TUNED_LOGITS, f"batch {b}")
        assert torch.equal(logits.argmax(1), want[f"{b}/logits"].argmax(1))
