"""DOTA's pieces against straightforward computations (one class, one sample at a time, float64).

Golden checks (marked `golden`): DOTA against its authors' own code on the 24-sample stream
(tests/fixtures/golden/online).

The fixtures (tools/golden/make_golden.py with tests/fixtures/golden/dota/driver.py, from
github.com/skylineeeeen/DOTA, float32 on the CPU) hold, per sample, what their
`get_clip_logits_aug` kept (features, soft labels), their Gaussian scores (`DOTA.predict`,
before the sample's update), the final logits, and after the update the means, counts,
shared covariance and its regularised inverse; `dota` also the per-class covariances after
the last sample. `dota_strong` is the same code with rho 3 and eta 5, so that the Gaussian
part changes predictions.

Tolerances (float32; measured here: logits 4e-5, means 3e-7, shared covariance 7e-9, per-class
covariances 1.2e-7, precision matrix and Gaussian scores 2.5e-6 of their largest entry): as
test_tda.py for logits (2e-4), features (1e-5) and probabilities (1e-5); means 1e-5,
counts 1e-5, covariances 1e-6 (entries ~2e-3); the precision matrix (entries up to ~500: the
inverse of a shrunk covariance built from features that differ by ~1e-6) and the scores built
from it 2e-5 relative to their largest entry; predictions exactly."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _golden import online_fixture, stream_views
from shiftlab.methods.context import ClassHeads, SampleContext
from shiftlab.methods.dota.method import (
    DOTA,
    discriminant,
    gaussian_scores,
    shared_covariance,
    shrunk,
    update_estimates,
)

CLASSNAMES = ["cat", "dog", "car", "tree", "boat"]


@pytest.fixture(scope="module")
def heads(tiny_model):
    return ClassHeads(tiny_model, CLASSNAMES)


def _loop_update(means, counts, covs, x, y):
    """The authors' DOTA.fit written out per class: means, counts, covariances (not scatter)."""
    new_means, new_counts, new_covs = means.clone(), counts.clone(), covs.clone()
    for c in range(means.shape[0]):
        s = y[:, c].sum()
        new_means[c] = (sum(y[b, c] * x[b] for b in range(len(x))) + counts[c] * means[c]) / (s + counts[c])
        delta = sum(y[b, c] * torch.outer(x[b] - means[c], x[b] - means[c]) for b in range(len(x)))
        new_covs[c] = (counts[c] * covs[c] + delta) / (counts[c] + s)
        new_counts[c] = counts[c] + s
    return new_means, new_counts, new_covs


def test_update_matches_the_per_class_formulas():
    g = torch.Generator().manual_seed(0)
    n, d, k = 4, 6, 3
    means = torch.randn(n, d, generator=g, dtype=torch.float64)
    counts = 1 + torch.rand(n, generator=g, dtype=torch.float64)
    a = torch.randn(n, d, d, generator=g, dtype=torch.float64)
    covs = a @ a.transpose(1, 2) / d
    x = F.normalize(torch.randn(k, d, generator=g, dtype=torch.float64), dim=-1)
    y = torch.randn(k, n, generator=g, dtype=torch.float64).softmax(-1)
    scatter = covs * counts[:, None, None]
    got_means, got_counts = update_estimates(means, counts, scatter, x, y)
    want_means, want_counts, want_covs = _loop_update(means, counts, covs, x, y)
    torch.testing.assert_close(got_means, want_means)
    torch.testing.assert_close(got_counts, want_counts)
    torch.testing.assert_close(scatter / got_counts[:, None, None], want_covs)
    torch.testing.assert_close(shared_covariance(scatter, got_counts), want_covs.mean(0))


def test_gaussian_scores_and_their_cholesky_form():
    g = torch.Generator().manual_seed(1)
    n, d = 5, 4
    a = torch.randn(d, d, generator=g, dtype=torch.float64)
    cov = a @ a.T / d
    system = shrunk(cov, 0.1)
    torch.testing.assert_close(system, 0.9 * cov + 0.1 * torch.eye(d, dtype=torch.float64))
    p = torch.linalg.inv(system)
    means, x = torch.randn(n, d, generator=g, dtype=torch.float64), torch.randn(d, generator=g, dtype=torch.float64)
    want = torch.stack([x @ p @ means[c] - 0.5 * means[c] @ p @ means[c] for c in range(n)])
    torch.testing.assert_close(gaussian_scores(x, means, p), want)
    w, b = discriminant(means, system)
    torch.testing.assert_close(x @ w - b, want)


def _ctxs(model, heads, n, views=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    dim = heads.zeroshot.shape[1]
    out = []
    for _ in range(n):
        centre = heads.zeroshot[int(torch.randint(0, len(CLASSNAMES), (1,), generator=g))]
        feats = F.normalize(centre + 0.5 * torch.randn(views, dim, generator=g), dim=-1)
        out.append(SampleContext(model, heads, torch.zeros(views, 3, 1, 1), image_features=feats))
    return out


def _reference(ctxs, head, cfg, scale):
    """DOTA's per-sample loop (run_test_dota) in float64: predict with the current estimates, then fit."""
    n, d = head.shape
    means = torch.full((n, d), cfg.mu_init, dtype=torch.float64)
    counts = torch.full((n,), cfg.count_init, dtype=torch.float64)
    covs = (cfg.sigma * torch.eye(d, dtype=torch.float64)).repeat(n, 1, 1)
    prec = torch.linalg.pinv(covs.mean(0))
    outs = []
    for ctx in ctxs:
        f = ctx.image_features.double()
        logits = scale * f @ head.double().T
        ent = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
        kept = torch.argsort(ent, stable=True)[:max(1, int(len(f) * cfg.view_ratio))]
        x, y = f[kept], logits[kept].softmax(-1)
        scores = torch.stack([x.mean(0) @ prec @ means[c] - 0.5 * means[c] @ prec @ means[c] for c in range(n)])
        w = min(cfg.rho * float(counts.mean()) / len(kept), cfg.eta)
        outs.append(logits[kept].mean(0) + w * scores)
        means, counts, covs = _loop_update(means, counts, covs, x, y)
        eye = torch.eye(d, dtype=torch.float64)
        prec = torch.linalg.inv((1 - cfg.epsilon) * covs.mean(0) + cfg.epsilon * eye)
    return outs


@pytest.mark.parametrize("rho", [0.0025, 1.0])
def test_method_equals_the_authors_loop(tiny_model, heads, rho):
    ctxs = _ctxs(tiny_model, heads, 12)
    dota = shiftlab.create_method("dota", tiny_model, CLASSNAMES, heads=heads, text_head="zeroshot", rho=rho,
                                  epsilon=0.05)
    want = _reference(ctxs, heads.zeroshot, dota.config, tiny_model.logit_scale)
    got = [dota.predict_context(c).logits for c in ctxs]
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g.double(), w, rtol=0, atol=1e-5,   # measured 8e-7 (float32 vs float64)
                                   msg=lambda m, i=i: f"sample {i}: {m}")
    assert dota.seen == 12
    # the first sample is predicted before any update: equal means give equal scores, so it is zero-shot's argmax
    first = ctxs[0]
    fresh = shiftlab.create_method("dota", tiny_model, CLASSNAMES, heads=heads, text_head="zeroshot", rho=rho)
    s = fresh.summarize_sample(first.image_features)
    _, scores, w = fresh.readout(s)
    assert torch.allclose(scores, scores[0].expand_as(scores)) and w == pytest.approx(min(rho * 1.0 / 2, 0.3))


def test_without_covariance_updates_the_precision_is_fixed(tiny_model, heads):
    dota = shiftlab.create_method("dota", tiny_model, CLASSNAMES, heads=heads, text_head="zeroshot",
                                  update_covariance=False)
    for c in _ctxs(tiny_model, heads, 3):
        dota.predict_context(c)
    cfg = dota.config
    d = dota.means.shape[1]
    assert dota.scatter is None and dota.state_dict()["scatter"].numel() == 0
    want = torch.eye(d) / ((1 - cfg.epsilon) * cfg.sigma + cfg.epsilon)
    torch.testing.assert_close(dota.precision_matrix(), want)


@pytest.mark.parametrize("field,value", [("view_ratio", 0.0), ("epsilon", 1.5), ("sigma", 0.0), ("rho", -1.0)])
def test_bad_config_is_refused_in_one_line(tiny_model, heads, field, value):
    with pytest.raises(ValueError, match=f"^dota\\.{field}: ") as err:
        shiftlab.create_method("dota", tiny_model, CLASSNAMES, heads=heads, **{field: value})
    assert "\n" not in str(err.value)


def test_paper_protocol_reads_the_dataset_configs():
    from shiftlab.methods.catalogue.protocols import method_overrides
    r = method_overrides("paper", DOTA, dataset="imagenet-r")
    assert (r["rho"], r["eta"], r["epsilon"], r["sigma"]) == (0.0025, 0.3, 0.0001, 0.002)
    assert r["views"] == {"n_views": 64, "augmix": True} and r["precision"] == "fp16-pure"
    i = method_overrides("paper", DOTA, dataset="imagenet")
    assert i["views"]["n_views"] == 1 and (i["rho"], i["eta"]) == (0.005, 0.2) and len(i["templates"]) == 7
    assert method_overrides("paper", DOTA, dataset="dtd")["templates"] == ("{} texture.",)
    assert method_overrides("leaderboard", DOTA, dataset="imagenet-r") == {}


# -- golden checks: the authors' code --------------------------------------------------------------------------

LOGITS, FEATURES, FINE, COV, REL_INVERSE = 2e-4, 1e-5, 1e-5, 1e-6, 2e-5


def _close(got: torch.Tensor, want: torch.Tensor, atol: float, what: str) -> float:
    got, want = got.detach().float().cpu(), want.detach().float().cpu()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    torch.testing.assert_close(got, want, rtol=0, atol=atol, msg=lambda m: f"{what}: {m}")
    return float((got - want).abs().max())


def _close_rel(got: torch.Tensor, want: torch.Tensor, rel: float, what: str) -> float:
    """Max abs difference / max |want| must stay under `rel`; returns that ratio."""
    scale = float(want.abs().max())
    _close(got, want, rel * scale, what)
    return float((got.float() - want.float()).abs().max()) / scale


@pytest.mark.golden
@pytest.mark.usefixtures("one_thread")
@pytest.mark.slow
@pytest.mark.parametrize("name", ["dota", "dota_strong"])
def test_dota_matches_the_authors_code_sample_by_sample(golden_model, golden_dir, name):
    model, classnames = golden_model
    want, info = online_fixture(golden_dir, name)
    cfg = info["config"]
    heads = ClassHeads(model, classnames, templates=info["templates"])
    _close(heads.ensemble, want["text_features"], FEATURES, "text features")
    overrides = {"logit_scale": 100.0}           # the authors' literal 100 (utils.py)
    if name == "dota_strong":
        overrides.update(rho=cfg["rho"], eta=cfg["eta"])
    dota = shiftlab.create_method("dota", model, classnames, heads=heads, **overrides)
    c = dota.config
    assert (c.epsilon, c.sigma, c.eta, c.rho, c.mu_init) == (cfg["epsilon"], cfg["sigma"], cfg["eta"], cfg["rho"],
                                                            info["mu_init"])
    assert c.views.n_views == info["n_views"]
    if name == "dota":
        _close(dota.precision_matrix(), want["init/precision"], FINE, "initial precision")
    worst: dict[str, float] = {}
    changed = 0
    for i, views in enumerate(stream_views(golden_dir, info["n_views"])):
        ctx = SampleContext(model, heads, model.normalize(views))
        s = dota.summarize_sample(ctx.image_features)
        _, scores, _ = dota.readout(s)                 # pure: what predict_context uses before updating
        worst["scores"] = max(worst.get("scores", 0), _close_rel(scores, want[f"{i}/dota_logits"], REL_INVERSE,
                                                                 f"{i} Gaussian scores"))
        _close(s.logits, want[f"{i}/clip_logits"], LOGITS, f"{i} clip logits")
        out = dota.predict_context(ctx)
        worst["logits"] = max(worst.get("logits", 0), _close(out.logits, want[f"{i}/logits"], LOGITS, f"{i} logits"))
        assert int(out.logits.argmax()) == int(want[f"{i}/logits"].argmax()), f"sample {i}: prediction"
        changed += int(out.logits.argmax()) != int(want[f"{i}/pred"])
        if name != "dota":
            continue
        _close(s.features, want[f"{i}/features"], FEATURES, f"{i} kept features")
        _close(s.probs, want[f"{i}/prob_map"], FINE, f"{i} soft labels")
        state = dota.state_dict()
        worst["means"] = max(worst.get("means", 0), _close(state["means"], want[f"{i}/means"], FEATURES,
                                                           f"{i} means"))
        _close(state["counts"], want[f"{i}/counts"], FINE, f"{i} counts")
        worst["covariance"] = max(worst.get("covariance", 0), _close(state["covariance"], want[f"{i}/covariance"],
                                                                     COV, f"{i} shared covariance"))
        worst["precision"] = max(worst.get("precision", 0), _close_rel(
            dota.precision_matrix(), want[f"{i}/precision"], REL_INVERSE, f"{i} precision matrix"))
    if name == "dota":
        last = len(stream_views(golden_dir, 1)) - 1
        _close(dota.class_covariances(), want[f"{last}/class_covariances"], COV, "per-class covariances")
    else:
        assert changed > 0            # the Gaussian part decides some predictions
    print(name, "largest differences:", worst, "predictions changed by the Gaussian part:", changed)
