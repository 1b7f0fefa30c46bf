"""OnZeta's pieces against straightforward computations, its config checks, and runs through the
engine (resume after a crash, robust accuracy). The authors' code itself: test_golden_onzeta.py."""
from __future__ import annotations

import math

import pytest
import torch

import shiftlab
from shiftlab.methods.base import describe
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
    assert oz.needs_views is False and oz.view_recipe.n_views == 1


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
