"""BCA: one sample's posterior and updates against a plain computation, and TTABC's own bca.py on the golden tiny CLIP
along the 24-sample stream (tests/fixtures/golden/bca, made by the driver beside it: TTABC's
`BCA.test_time_adapt_eval`, float32 on the CPU, 16 views, 4 selected; its defaults, and a light centre weight that
moves the centres).

Golden tolerances: tests/_golden.py's FEATURES for the centres and probabilities (the stream carries the state, so
each sample's output reads every update before it; measured largest differences are printed).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _golden import FEATURES, FIXTURES, stream_views
from shiftlab import ClassHeads, SampleContext

NAMES = ["goldfish", "great white shark", "hammerhead shark", "stingray", "cock", "hen", "ostrich", "brambling"]

pytestmark = pytest.mark.usefixtures("one_thread")


def test_two_samples_match_a_plain_computation(tiny_model):
    model = tiny_model
    heads = ClassHeads(model, NAMES)
    gen = torch.Generator().manual_seed(0)
    dim = heads.zeroshot.shape[1]
    feats = [F.normalize(torch.randn(10, dim, generator=gen) + 3 * heads.zeroshot[k], dim=-1) for k in (3, 3)]
    method = shiftlab.create_method("bca", model, NAMES, heads=heads, center_count=3, prior_count=2,
                                    center_threshold=0.05, prior_threshold=0.1, selection_ratio=0.3)
    outs = [method.predict_context(SampleContext(model, heads, torch.zeros(10, 3, 64, 64), image_features=f))
            for f in feats]
    mu, prior = heads.zeroshot.clone(), torch.eye(len(NAMES))
    n1, n2 = [3] * len(NAMES), [2] * len(NAMES)
    for f, out in zip(feats, outs):
        logits = model.logit_scale * f @ mu.T
        ent = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
        sel = ent.argsort()[:3]
        z = logits[sel].mean(0).softmax(-1) @ prior
        torch.testing.assert_close(out.logits, torch.log(z + 1e-12), rtol=0, atol=1e-5)
        top, k = float(z.max()), int(z.argmax())
        assert top > 0.1     # both updates run: the test sees them
        centre = (n1[k] * mu[k] + f[sel].mean(0)) / (n1[k] + 1)
        mu[k], n1[k] = centre / centre.norm(), n1[k] + 1
        prior[k], n2[k] = (n2[k] * prior[k] + z) / (n2[k] + 1), n2[k] + 1
    torch.testing.assert_close(method.centers, mu, rtol=0, atol=1e-6)
    torch.testing.assert_close(method.prior, prior, rtol=0, atol=1e-6)
    assert method.center_counts.tolist() == n1 and method.prior_counts.tolist() == n2
    assert not torch.allclose(method.prior, torch.eye(len(NAMES)))


def test_thresholds_gate_the_updates(tiny_model):
    heads = ClassHeads(tiny_model, NAMES)
    feats = F.normalize(torch.randn(4, heads.zeroshot.shape[1], generator=torch.Generator().manual_seed(1)), dim=-1)
    method = shiftlab.create_method("bca", tiny_model, NAMES, heads=heads, center_threshold=1.0, prior_threshold=1.0)
    method.predict_context(SampleContext(tiny_model, heads, torch.zeros(4, 3, 64, 64), image_features=feats))
    assert torch.equal(method.centers, heads.zeroshot) and torch.equal(method.prior, torch.eye(len(NAMES)))
    assert method.center_counts.tolist() == [20000] * len(NAMES)
    with pytest.raises(ValueError, match="center_threshold"):
        shiftlab.create_method("bca", tiny_model, NAMES, center_threshold=1.5)


# -- golden checks: the authors' code along the stream --------------------------------------------------------

VARIANTS = {"bca": {"selection_ratio": 0.25},
            "bca_light": {"selection_ratio": 0.25, "center_count": 2, "prior_threshold": 0.3}}
N_VIEWS = 16


@pytest.fixture(scope="module")
def golden(golden_dir, golden_model, one_thread_module):
    model, classnames = golden_model
    expected = torch.load(FIXTURES / "bca" / "bca.pt", weights_only=True)
    heads = ClassHeads(model, classnames)
    got = {}
    for variant, config in VARIANTS.items():
        method = shiftlab.create_method("bca", model, classnames, heads=heads, **config)
        rows = []
        for views in stream_views(golden_dir, N_VIEWS):
            out = method.predict_context(SampleContext(model, heads, model.normalize(views)))
            rows.append((out.logits, method.last["selected"]))
        got[variant] = (rows, method)
    return expected, got


@pytest.mark.golden
@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_stream_follows_the_authors_code(golden, variant):
    expected, got = golden
    rows, method = got[variant]
    worst = {"probs": 0.0}
    for i, (logits, selected) in enumerate(rows):
        p = f"{variant}/{i}/"
        assert sorted(selected.tolist()) == sorted(expected[p + "selected"].tolist()), p + "selected"
        err = float((logits.exp() - expected[p + "output"].exp()).abs().max())
        worst["probs"] = max(worst["probs"], err)
        assert err <= FEATURES, f"{p}output: {err:.3g}"
        assert int(logits.argmax()) == int(expected[p + "output"].argmax()), p
    end = f"{variant}/end/"
    assert method.center_counts.tolist() == expected[end + "c1"].tolist()
    assert method.prior_counts.tolist() == expected[end + "c2"].tolist()
    worst["mu"] = float((method.centers - expected[end + "mu"]).abs().max())
    assert worst["mu"] <= FEATURES
    rows_moved = expected[end + "prior_rows"]
    worst["prior"] = float((method.prior[rows_moved] - expected[end + "prior"]).abs().max())
    assert worst["prior"] <= FEATURES
    rest = torch.ones(method.prior.shape[0], dtype=torch.bool)
    rest[rows_moved] = False
    assert torch.equal(method.prior[rest], torch.eye(method.prior.shape[0])[rest])
    assert len(rows_moved) > 0
    print(variant, "largest differences:", {k: f"{v:.2g}" for k, v in worst.items()})
