"""BayesTTA: its Gaussian discriminant and Box's M test against a straightforward computation, its state, and its
authors' code (github.com/cuishuang99/BayesTTA `dis_cttta_runner_cd.py`'s functions) on the golden tiny ViT and
ResNet (tests/fixtures/golden/bayestta, made by the driver beside the fixtures, float32 on the CPU).

Golden: 24 images in batches of 10, 10, 4, continual: the tiny ViT with 200 classes (the covariance test lacks
degrees of freedom: one shared covariance), with 3 classes (the test runs and keeps it shared; and its verdict forced
to one covariance per class), the tiny ResNet (its BatchNorms named `bn`, running statistics). The discriminant
inverts covariances whose smallest kept eigenvalues sit just above pinv's cut-off, so the logits amplify their
inputs' last bits ~1e5-fold: the first batch of the 200-class ViT run, whose inputs are theirs bit for bit (their
text head fed in), agrees exactly; later batches, after an Adam step that differs in the 7th digit, to LOGITS_REL of
the largest logit (measured 0.5%). The class means, soft counts and covariance sums (STATE: measured 1.7e-6) and the
adapted parameters (NORM_PARAMS: measured 5.4e-6) are held tightly, the predictions exactly on the rows whose top-2
gap is over twice that tolerance.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

import shiftlab
from _golden import FEATURES, NORM_PARAMS, assert_close, stream_views
from shiftlab.methods.bayestta import discriminant as gda
from shiftlab.methods.bayestta.method import bayes_state_logits
from shiftlab.methods.context import ClassHeads, SampleContext

pytestmark = pytest.mark.usefixtures("one_thread")

LOGITS_REL = 1e-2     # of the batch's largest |logit| (see the docstring; measured 5e-3)
STATE = 1e-5
# the driver's variants (tests/fixtures/golden/bayestta/bayestta.json): model, classes kept, shiftlab config
VARIANTS = {"bayestta_vit": ("vit", None, {"lr": 0.01}),
            "bayestta_vit_box": ("vit", 3, {"lr": 0.01, "alpha": 0.1}),
            "bayestta_vit_qda": ("vit", 3, {"lr": 0.01, "alpha": 0.1, "covariance": "class"}),
            "bayestta_rn": ("rn", None, {"lr": 0.003, "model_ema_beta": 0.9})}


def test_the_discriminant_is_the_gaussian_log_density_with_pinv():
    g = torch.Generator().manual_seed(0)
    x, mu = torch.randn(4, 3, generator=g), torch.randn(2, 3, generator=g)
    a = torch.randn(3, 3, generator=g)
    shared = a @ a.T + 0.5 * torch.eye(3)
    per_class = torch.stack([shared, 2 * shared])
    for cov in (shared, per_class):
        got = gda.discriminant(x, mu, cov)
        for b in range(4):
            for k in range(2):
                s = cov if cov.dim() == 2 else cov[k]
                d = x[b] - mu[k]
                want = -0.5 * float(d @ torch.linalg.inv(s) @ d) - 0.5 * math.log(float(torch.det(s))) + math.log(0.5)
                assert float(got[b, k]) == pytest.approx(want, abs=1e-4)


def test_the_scatter_sums_each_probability_weighted_outer_product():
    g = torch.Generator().manual_seed(1)
    x, mu, p = torch.randn(3, 2, generator=g), torch.randn(2, 2, generator=g), torch.rand(3, 2, generator=g)
    outer = [[p[b, k] * torch.outer(x[b] - mu[k], x[b] - mu[k]) for k in range(2)] for b in range(3)]
    torch.testing.assert_close(gda.weighted_scatter(x, p, mu, per_class=False), sum(sum(o) for o in outer))
    torch.testing.assert_close(gda.weighted_scatter(x, p, mu, per_class=True),
                               torch.stack([sum(outer[b][k] for b in range(3)) for k in range(2)]))


def test_box_m_stops_without_degrees_of_freedom_and_its_statistic_grows_with_the_images():
    g = torch.Generator().manual_seed(2)
    assert gda.covariance_test(torch.randn(6, 12, generator=g), torch.full((6, 4), 0.25)) == gda.BoxM(False)
    pytest.importorskip("scipy")
    # their F statistic, M a1 / (d1 (1 - a1 + M a1 / d2)), is ~d2 / d1 x (M / (M + d2 (1 - a1) / a1)): with few
    # images per class d2 is small and it cannot pass the critical value; with many (d2 large, a1 near 1) it
    # passes it for equal covariances too (README.md: kept as theirs)
    hard = torch.cat([torch.tensor([[1.0, 0.0]]).repeat(400, 1), torch.tensor([[0.0, 1.0]]).repeat(400, 1)])
    x = torch.randn(800, 12, generator=g)
    many = gda.covariance_test(x, hard)
    assert many.reject and many.d1 == 55 and many.f_stat < many.d2 / many.d1
    few = gda.covariance_test(x[380:420], hard[380:420])
    assert not few.reject and few.f_stat < few.d2 / few.d1 < few.f_critical


def test_a_first_batch_of_fewer_than_ten_images_with_the_test_is_refused_in_one_line():
    x = torch.nn.functional.normalize(torch.randn(6, 32), dim=-1)
    with pytest.raises(ValueError, match="needs 10 or more images, got 6"):
        gda.covariance_test(x, torch.tensor([[0.9, 0.1]]).repeat(6, 1))


def test_state_round_trips_and_the_adaptive_target_writes_nothing(tiny_vit_model):
    model = tiny_vit_model
    method = shiftlab.create_method("bayestta", model, ["cat", "dog", "car"], covariance="shared", lr=0.01)
    batch = model.normalize(torch.rand(4, 3, 64, 64, generator=torch.Generator().manual_seed(3)))
    method.adapt_batch([SampleContext(model, method.heads, batch[i:i + 1]) for i in range(4)])
    state = method.state_dict()
    assert state["extra"]["shared"] is True and state["extra"]["scatter"].shape == (32, 32)
    views01 = torch.rand(2, 1, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    before = {k: v.clone() for k, v in (("mu", method.mu), ("ct", method.ct), ("scatter", method.scatter))}
    logits = bayes_state_logits(method, views01.requires_grad_(True))
    logits.sum().backward()
    assert views01.grad is not None and views01.grad.abs().sum() > 0
    assert all(torch.equal(before[k], getattr(method, k)) for k in before)
    other = shiftlab.create_method("bayestta", model, ["cat", "dog", "car"], covariance="shared", lr=0.01)
    other.load_state_dict(state)
    nxt = model.normalize(torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(5)))
    a = method.adapt_batch([SampleContext(model, method.heads, nxt[i:i + 1]) for i in range(2)])
    b = other.adapt_batch([SampleContext(model, other.heads, nxt[i:i + 1]) for i in range(2)])
    assert all(torch.equal(x.logits, y.logits) for x, y in zip(a, b))


# -- their code (tests/fixtures/golden/bayestta) -------------------------------------------------------------


def test_the_fixture_ran_their_code_and_their_test(golden_dir):
    info = json.loads((golden_dir / "bayestta" / "bayestta.json").read_text())
    assert info["reference"]["commit"] == "9c981767faadc95fddc49968e513c31012e7bb57"
    fixtures = info["fixtures"]
    assert fixtures["bayestta_vit"]["use_lda"] and not fixtures["bayestta_vit_qda"]["use_lda"]
    assert "Insufficient degrees of freedom" in fixtures["bayestta_vit"]["their_test_printed"][0]
    assert "F_stat: 0.0279, F_critical (110, 3.05): 8.3041" in fixtures["bayestta_vit_box"]["their_test_printed"][0]


def test_box_m_on_the_golden_first_batch_prints_their_numbers(golden_dir):
    pytest.importorskip("scipy")
    model = shiftlab.load_model("shiftlab-tiny-vit", str(golden_dir / "tiny_vit_openai.pt"))
    want = torch.load(golden_dir / "bayestta" / "bayestta_vit_box.pt", map_location="cpu", weights_only=True)
    method = shiftlab.create_method("bayestta", model, ["a", "b", "c"])
    x = method.encode(torch.cat([model.normalize(v) for v in stream_views(golden_dir, 1)[:10]])).detach()
    verdict = gda.covariance_test(x, (100 * x @ want["clip_weights"]).softmax(1))
    assert not verdict.reject and verdict.d1 == 110
    assert f"F_stat: {verdict.f_stat:.4f}, F_critical ({verdict.d1}, {verdict.d2:.2f}): {verdict.f_critical:.4f}" \
        == "F_stat: 0.0279, F_critical (110, 3.05): 8.3041"


@pytest.mark.golden
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_bayestta_matches_their_code_batch_by_batch(golden_dir, golden_vit, golden_model, variant):
    which, n_classes, config = VARIANTS[variant]
    model, names = (golden_vit[0], golden_vit[1]) if which == "vit" else golden_model
    names = names[:n_classes] if n_classes else names
    want = torch.load(golden_dir / "bayestta" / f"{variant}.pt", map_location="cpu", weights_only=True)
    info = json.loads((golden_dir / "bayestta" / "bayestta.json").read_text())["fixtures"][variant]
    heads = ClassHeads(model, names)
    assert_close(heads.zeroshot, want["clip_weights"].T, FEATURES, "text head")
    heads._cache["zeroshot"] = want["clip_weights"].T.contiguous()    # theirs, bit for bit (see the docstring)
    method = shiftlab.create_method("bayestta", model, names, heads=heads, **config)
    assert ["visual." + n for n in method.tower.parameter_names] == [n for n in info["adapted"]
                                                                     if n.startswith("visual.")]
    views = [model.normalize(v) for v in stream_views(golden_dir, 1)]
    for b in range(info["n_batches"]):
        outs = method.adapt_batch([SampleContext(model, heads, v) for v in views[10 * b:10 * b + 10]])
        logits, their = torch.stack([o.logits for o in outs]), want[f"{b}/logits"]
        tol = LOGITS_REL * float(their.abs().max())
        if b == 0 and variant == "bayestta_vit":
            assert torch.equal(logits, their)
        assert_close(logits, their, tol, f"batch {b} logits")
        assert outs[0].extras["loss"] == pytest.approx(float(want[f"{b}/loss"]), rel=LOGITS_REL)
        assert_close(method.mu, want[f"{b}/mu"], STATE, f"batch {b} means")
        assert_close(method.ct, want[f"{b}/ct"], STATE, f"batch {b} counts")
        key = "sigma_sum" if info["use_lda"] else "sigma_sums"
        assert_close(method.scatter, want[f"{b}/{key}"], STATE, f"batch {b} covariance sums")
        for name, value in method.tower.norm_state().items():
            assert_close(value, want[f"{b}/param/visual.{name}"], NORM_PARAMS, f"batch {b} {name}")
        top2 = their.topk(2, dim=1).values
        decided = top2[:, 0] - top2[:, 1] > 2 * tol         # rows no machine within the tolerance could flip
        assert torch.equal(logits.argmax(1)[decided], their.argmax(1)[decided])
    assert method.shared == info["use_lda"]
