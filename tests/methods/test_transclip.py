"""TransCLIP (zero-shot): its solver against the authors' `TransCLIP_solver` run on features of the golden tiny
CLIP (tests/fixtures/golden/transclip, made by the driver beside it: 128 images, 10 classes, float32 on the CPU),
the method's test-set pass reading the same rows, and an image outside the fitted set against a plain computation.

Tolerances: tests/_golden.py's FEATURES for unit-norm features, means, cosines and the assignments z (probabilities,
1.2e-7 measured), LOGITS for the zero-shot logits, relative 1e-5 for the variance (values ~1e-3, 1.1e-6 measured).
"""
from __future__ import annotations

import math

import pytest
import torch

import shiftlab
from _golden import FEATURES, FIXTURES, LOGITS, assert_close
from shiftlab import ClassHeads, SampleContext
from shiftlab.methods.transclip.method import fit_transclip, gmm_log_likelihood, init_mu, knn_graph

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def expected():
    return torch.load(FIXTURES / "transclip" / "transclip.pt", weights_only=True)


def contexts(model, heads, features):
    return [SampleContext(model, heads, torch.zeros(1, 3, 64, 64), image_features=f[None]) for f in features]


@pytest.mark.golden
def test_solver_matches_the_authors(tiny_model, expected):
    feats, protos = expected["features"], expected["prototypes"]
    cfg = shiftlab.create_method("transclip", tiny_model, [str(i) for i in range(10)]).config
    assert_close(cfg.logit_scale * feats @ protos, expected["y_hat"], LOGITS, "y_hat")
    assert_close(knn_graph(feats, cfg.n_neighbors), expected["W"], FEATURES, "W")
    assert_close(init_mu((cfg.logit_scale * feats @ protos).softmax(-1), feats, cfg.n_confident), expected["mu0"],
                 FEATURES, "mu0")
    fit = fit_transclip(feats, protos.T, cfg)
    assert_close(fit.mu, expected["mu"], FEATURES, "mu")
    rel = float(((fit.std - expected["std"]).abs() / expected["std"]).max())
    assert rel <= 1e-5, f"std: relative error {rel:.3g}"
    assert_close(fit.z, expected["z"], FEATURES, "z")
    # the transduction changed something: z is not the zero-shot softmax
    assert (expected["z"] - expected["y_hat"].softmax(-1)).abs().max() > 0.1


@pytest.mark.golden
def test_the_test_set_pass_predicts_each_images_row(golden_model, golden_dir, expected):
    model, names = golden_model
    heads = ClassHeads(model, names[:10])
    # shiftlab's own encoding of the views gives the fixture's features
    views = torch.load(golden_dir / "inputs.pt", weights_only=True)["views_unit"].flatten(0, 1)
    with torch.no_grad():
        assert_close(model.encode_views(model.normalize(views)).float(), expected["features"], FEATURES, "features")
    method = shiftlab.create_method("transclip", model, names[:10], heads=heads)
    ctxs = contexts(model, heads, expected["features"])
    for start in range(0, len(ctxs), 32):          # the engine's groups of --batch-size
        method.observe_test_set(ctxs[start:start + 32])
    method.finish_test_set()
    out = [method.predict_context(c) for c in ctxs[::9]]
    assert all(o.extras["in_fitted_set"] for o in out)
    assert_close(torch.stack([o.probs for o in out]), expected["z"][::9], FEATURES, "z rows")
    assert_close(torch.stack([o.logits.softmax(-1) for o in out]), expected["z"][::9], FEATURES, "softmax(logits)")


def test_an_image_outside_the_fitted_set_gets_one_update(tiny_model):
    names = ["goldfish", "stingray", "hen", "ostrich"]
    heads = ClassHeads(tiny_model, names)
    gen = torch.Generator().manual_seed(0)
    feats = torch.nn.functional.normalize(torch.randn(6, heads.zeroshot.shape[1], generator=gen), dim=-1)
    method = shiftlab.create_method("transclip", tiny_model, names, heads=heads, iterations=3)
    with pytest.raises(ValueError, match="no test set fitted yet"):
        method.predict_context(contexts(tiny_model, heads, feats[:1])[0])
    method.observe_test_set(contexts(tiny_model, heads, feats))        # 6 images < 8 per class: all of them
    method.finish_test_set()
    x = torch.nn.functional.normalize(torch.randn(heads.zeroshot.shape[1], generator=gen), dim=-1)
    out = method.predict_context(contexts(tiny_model, heads, x[None])[0])
    fit = method.fit
    # written out: its 3 nearest test images pull with their z, weighted by the cosine; the Gaussians and y_hat
    sims = [(float(fit.features[i] @ x), i) for i in range(6)]
    near = sorted(sims, reverse=True)[:3]
    pull = sum(s * fit.z[i] for s, i in near)
    y_hat = (100.0 * x @ heads.zeroshot.T).softmax(-1)
    loglik = torch.tensor([-0.5 * float(((x - fit.mu[c]) ** 2 / fit.std).sum()) for c in range(4)])
    inter = loglik + 50 / 6 * pull
    z = y_hat * torch.exp((inter - inter.max()) / 50)
    z = z / z.sum()
    assert out.extras["in_fitted_set"] is False
    torch.testing.assert_close(out.probs, z, rtol=0, atol=1e-6)
    assert math.isclose(float(out.probs.sum()), 1.0, abs_tol=1e-6)
    torch.testing.assert_close(gmm_log_likelihood(x[None], fit.mu, fit.std)[0], loglik, rtol=0, atol=1e-4)


def test_an_image_is_its_fitted_row_by_sample_id_up_to_encoding_rounding(tiny_model):
    names = ["goldfish", "stingray", "hen"]
    heads = ClassHeads(tiny_model, names)
    gen = torch.Generator().manual_seed(1)
    feats = torch.nn.functional.normalize(torch.randn(5, heads.zeroshot.shape[1], generator=gen), dim=-1)

    def ctx(feature, sid):
        return SampleContext(tiny_model, heads, torch.zeros(1, 3, 64, 64), image_features=feature[None], sample_id=sid)
    method = shiftlab.create_method("transclip", tiny_model, names, heads=heads, iterations=2)
    method.observe_test_set([ctx(f, 10 + i) for i, f in enumerate(feats)])
    method.finish_test_set()
    same = method.predict_context(ctx(feats[2] + 1e-3, 12))            # fp16 rounding of another batch
    assert same.extras["in_fitted_set"] is True
    torch.testing.assert_close(same.probs, method.fit.z[2])
    moved = method.predict_context(ctx(feats[2] + 0.05, 12))           # an attacked copy: not the fitted image
    assert moved.extras["in_fitted_set"] is False
    assert method.predict_context(ctx(feats[3], 12)).extras["in_fitted_set"] is False   # another image's feature


def test_an_empty_test_set_is_refused(tiny_model):
    method = shiftlab.create_method("transclip", tiny_model, ["a", "b"])
    with pytest.raises(ValueError, match="the test set is empty"):
        method.finish_test_set()
