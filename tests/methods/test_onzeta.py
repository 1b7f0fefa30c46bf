"""OnZeta's pieces against straightforward computations, its config checks, and runs through the
engine (resume after a crash, robust accuracy). The authors' code itself: the golden checks below.

Golden checks (marked `golden`): OnZeta against its authors' own code on the 24-sample stream
(tests/fixtures/golden/online/onzeta.pt).

tools/golden/make_golden.py ran idstcv/OnZeta's `main_online.main()` (float32, CPU; patches in
online.json) and recorded, after every sample, the feature it read, the text label, the proxy
prediction, the mix and the state (rho, the vision proxies).

Two checks. Fed the authors' own features and head, shiftlab's update must agree to float32
rounding. It is bit-identical on the machine that made the fixture; on another x86-64 CPU the
state's float32 rounding drifts along the stream (the 0.01 / 0.04 temperatures amplify it: proxy
predictions 1.4e-5, mix 9.7e-6, proxies 6.7e-6, rho 1.1e-6 apart by the 24th sample), so REPLAY is
the probability tolerance of the encoder check below, 5e-5. Through
shiftlab's own encoders (features within 1e-6 of theirs: open_clip's attention pool, see
test_tda.py), the temperatures 0.01 / 0.04 and the proxy step cw / tau_i = 12.5 amplify
those differences: probabilities 5e-5, rho 1e-4, proxies 2e-4; predictions exactly."""
from __future__ import annotations

import math

import pytest
import torch

import shiftlab
from _golden import FEATURES, online_fixture, stream_views
from _golden import assert_close as _close
from shiftlab.methods.base import describe
from shiftlab.methods.context import ClassHeads, SampleContext
from shiftlab.methods.onzeta.method import dual_step, proxy_step, text_label
from shiftlab.methods.onzeta.spec import ONZETA_TEMPLATES
from shiftlab.models.text import TIP_TEMPLATES

CLASSNAMES = ["cat", "dog", "car", "tree", "boat", "house"]


pytestmark = pytest.mark.usefixtures("one_thread")


def _unit(*shape: int, seed: int) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


def test_text_label_is_the_reweighted_softmax():
    x, text, rho = _unit(8, seed=0), _unit(5, 8, seed=1), torch.tensor([0.0, 0.5, 0.0, 2.0, 0.1])
    sims = [sum(float(text[c, d]) * float(x[d]) for d in range(8)) for c in range(5)]
    raw = [math.exp(s / 0.01 - max(sims) / 0.01) * math.exp(float(r)) for s, r in zip(sims, rho)]
    want = torch.tensor([v / sum(raw) for v in raw])
    torch.testing.assert_close(text_label(x, text, rho, 0.01), want, rtol=0, atol=1e-5)


def test_dual_step_projects_onto_nonnegative_values():
    rho, t = torch.tensor([0.0, 0.3, 1.0, 0.0]), torch.tensor([0.7, 0.1, 0.1, 0.1])
    want = torch.tensor([max(0.0, float(r) - 2.0 * (float(p) - 1.0 / 4)) for r, p in zip(rho, t)])
    torch.testing.assert_close(dual_step(rho, t, 2.0, 1.0), want)
    assert dual_step(rho, t, 2.0, 1.0)[0] == 0          # an over-predicted class is pushed down to 0, not below


def test_proxy_step_is_a_cross_entropy_gradient_step_then_renormalised():
    w, x = _unit(4, 6, seed=2), _unit(6, seed=3)
    t = torch.tensor([0.1, 0.6, 0.2, 0.1])
    tau = 0.04
    w_req = w.clone().requires_grad_(True)
    loss = -(t * torch.log_softmax(w_req @ x / tau, dim=0)).sum()   # d loss / d w = outer(v - t, x) / tau
    loss.backward()
    v = torch.softmax(w @ x / tau, dim=0)
    moved = w - 0.3 * w_req.grad
    want = torch.stack([row / row.norm() for row in moved])
    torch.testing.assert_close(proxy_step(w, x, v, t, 0.3, tau), want, rtol=0, atol=1e-6)


def test_weight_ramp_and_predictions_follow_the_schedule(tiny_model):
    heads = shiftlab.ClassHeads(tiny_model, CLASSNAMES)
    ramp = shiftlab.create_method("onzeta", tiny_model, CLASSNAMES, heads=heads, stream_length=16)
    assert [ramp.weight(t) for t in (1, 4, 16, 20)] == pytest.approx([0.8 * math.sqrt(1 / 16), 0.4, 0.8, 0.8])
    flat = shiftlab.create_method("onzeta", tiny_model, CLASSNAMES, heads=heads)
    assert flat.weight(1) == flat.weight(1000) == 0.8
    # the first sample: proxies = text head, rho = 0, so the mix is of two plain softmaxes
    text = flat.text()
    x = _unit(text.shape[1], seed=4)
    out = flat.predict_context(_Ctx(x))
    want = 0.8 * torch.softmax(text @ x / 0.04, 0) + 0.2 * torch.softmax(text @ x / 0.01, 0)
    torch.testing.assert_close(out.probs, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(out.logits.softmax(-1), want, rtol=0, atol=1e-6)
    assert flat.seen == 1 and flat.proxy.shape == text.shape


class _Ctx:
    def __init__(self, feature: torch.Tensor):
        self.base_feature = feature


def test_default_head_is_onzetas_seven_templates(tiny_model):
    oz = shiftlab.create_method("onzeta", tiny_model, CLASSNAMES)
    assert oz.config.head_templates == ONZETA_TEMPLATES and len(set(ONZETA_TEMPLATES)) == 7
    assert sorted(ONZETA_TEMPLATES) == sorted(TIP_TEMPLATES)
    torch.testing.assert_close(oz.text(), oz.heads.templated(list(ONZETA_TEMPLATES)))
    assert oz.spec.needs_views is False and oz.view_recipe.n_views == 1


@pytest.mark.parametrize("bad,match", [({"output": "mix"}, "output"), ({"text_head": "cupl"}, "text_head"),
                                       ({"tau_t": 0.0}, "tau_t"), ({"stream_length": 0}, "stream_length")])
def test_bad_settings_are_refused_in_one_line(tiny_model, bad, match):
    with pytest.raises(ValueError, match=match) as err:
        shiftlab.create_method("onzeta", tiny_model, CLASSNAMES, **bad)
    assert "\n" not in str(err.value)


def test_paper_protocol_is_the_authors_half_model_on_one_view():
    paper = describe("paper", "onzeta")
    assert paper["precision"] == "fp16-pure" and paper["views"] == {"n_views": 1}
    assert paper["config"]["head_templates"] == ONZETA_TEMPLATES


# -- through the engine ------------------------------------------------------------------------------


# -- golden checks: the authors' code --------------------------------------------------------------------------

PROBS, RHO, PROXY = 5e-5, 1e-4, 2e-4
REPLAY = PROBS


def _onzeta(model, classnames, heads, info, **overrides):
    oz = shiftlab.create_method("onzeta", model, classnames, heads=heads, stream_length=info["stream_length"],
                                **overrides)
    d = info["defaults"]
    assert (oz.config.tau_t, oz.config.tau_i, oz.config.cw, oz.config.cr, oz.config.alpha, oz.config.beta) == (
        d["tau_t"], d["tau_i"], d["cw"], d["cr"], d["alpha"], d["beta"])
    return oz


@pytest.mark.golden
@pytest.mark.usefixtures("one_thread")
@pytest.mark.slow
def test_onzeta_update_replays_the_authors_state_exactly(golden_model, golden_dir):
    model, classnames = golden_model
    want, info = online_fixture(golden_dir, "onzeta")
    oz = _onzeta(model, classnames, ClassHeads(model, classnames), info)
    oz.text = lambda: want["text_features"]            # their head and their features as inputs
    for i in range(len(want["predictions"])):
        beta = oz.weight(oz.seen + 1)
        assert beta == pytest.approx(float(want[f"{i}/beta"]), abs=1e-7)
        v, t = oz.step(want[f"{i}/feature"])
        _close(v, want[f"{i}/vision_label"], REPLAY, f"{i} proxy prediction")
        _close(t, want[f"{i}/text_label"], REPLAY, f"{i} text label")
        _close(beta * v + (1 - beta) * t, want[f"{i}/combo"], REPLAY, f"{i} mix")
        _close(oz.rho, want[f"{i}/rho"], REPLAY, f"{i} rho")
        _close(oz.proxy, want[f"{i}/proxy"], REPLAY, f"{i} proxies")


@pytest.mark.golden
@pytest.mark.usefixtures("one_thread")
@pytest.mark.slow
def test_onzeta_matches_the_authors_code_sample_by_sample(golden_model, golden_dir):
    model, classnames = golden_model
    want, info = online_fixture(golden_dir, "onzeta")
    heads = ClassHeads(model, classnames)
    oz = _onzeta(model, classnames, heads, info)
    lab = _onzeta(model, classnames, heads, info, output="onlab")
    _close(oz.text(), want["text_features"], FEATURES, "text head")
    preds, dual_active = [], 0
    for i, views in enumerate(stream_views(golden_dir, info["n_views"])):
        ctx = SampleContext(model, heads, model.normalize(views))
        _close(ctx.base_feature, want[f"{i}/feature"], FEATURES, f"{i} feature")
        out = oz.predict_context(ctx)
        _close(out.probs, want[f"{i}/combo"], PROBS, f"{i} OnZeta probabilities")
        _close(lab.predict_context(ctx).probs, want[f"{i}/text_label"], PROBS, f"{i} OnLab probabilities")
        state = oz.state_dict()
        _close(state["rho"], want[f"{i}/rho"], RHO, f"{i} rho")
        _close(state["proxy"], want[f"{i}/proxy"], PROXY, f"{i} proxies")
        preds.append(int(out.logits.argmax()))
        dual_active += int(want[f"{i}/rho"].max() > 0)
    assert preds == want["predictions"].tolist()
    assert dual_active > 0                              # the stream exercises the dual variable
