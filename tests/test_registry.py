"""Properties every registered method must have; a new method is tested the moment it registers."""
from __future__ import annotations

import pytest
import torch

import shiftlab
from shiftlab.context import ClassHeads, SampleContext
from shiftlab.datasets.classes import classnames_for_wnids, imagenet_r_wnids
from shiftlab.methods import get_method_class

CLASSNAMES = classnames_for_wnids(imagenet_r_wnids()[:20])


def _views(model, seed: int, n: int = 8) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return model.normalize(torch.rand(n, 3, model.image_size, model.image_size, generator=gen))


@pytest.fixture(scope="module")
def heads(tiny_model):
    return ClassHeads(tiny_model, CLASSNAMES)


@pytest.mark.parametrize("name", shiftlab.list_methods())
def test_method_predicts_finite_scores(name, tiny_model, heads):
    method = shiftlab.create_method(name, tiny_model, CLASSNAMES, heads=heads)
    method.prepare()
    logits = method.predict(_views(tiny_model, 0))
    assert logits.shape == (len(CLASSNAMES),) and torch.isfinite(logits).all()
    out = method.predict_context(SampleContext(tiny_model, heads, _views(tiny_model, 1)))
    probs = out.probabilities()
    assert torch.isfinite(probs).all() and float(probs.sum()) == pytest.approx(1.0, abs=1e-4)
    assert int(out.logits.argmax()) in probs.topk(1).indices.tolist()


@pytest.mark.parametrize("name", [n for n in shiftlab.list_methods() if get_method_class(n).episodic])
def test_episodic_methods_do_not_leak_between_images(name, tiny_model, heads):
    method = shiftlab.create_method(name, tiny_model, CLASSNAMES, heads=heads)
    a, b = _views(tiny_model, 2), _views(tiny_model, 3)
    first = method.predict(a)
    method.predict(b)
    torch.testing.assert_close(method.predict(a), first, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", [n for n in shiftlab.list_methods() if get_method_class(n).episodic])
def test_batch_prediction_equals_one_at_a_time(name, tiny_model, heads):
    method = shiftlab.create_method(name, tiny_model, CLASSNAMES, heads=heads)
    ctxs = [SampleContext(tiny_model, heads, _views(tiny_model, s)) for s in (4, 5, 6)]
    singles = [method.predict_context(c).logits for c in ctxs]
    batched = [o.logits for o in method.predict_batch(ctxs)]
    for s, b in zip(singles, batched):
        torch.testing.assert_close(b, s, rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", shiftlab.list_methods())
def test_unknown_config_field_is_rejected(name, tiny_model):
    with pytest.raises(TypeError, match="unknown config field"):
        shiftlab.create_method(name, tiny_model, CLASSNAMES, no_such_field=1)


def test_unknown_method_names_the_registered_ones(tiny_model):
    with pytest.raises(KeyError, match="tpt"):
        shiftlab.create_method("nope", tiny_model, CLASSNAMES)


def test_methods_command_lists_every_method(capsys):
    from shiftlab.cli import main
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    for name in shiftlab.list_methods():
        assert name in out
