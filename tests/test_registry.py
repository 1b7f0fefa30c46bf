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


# -- the registry type itself (methods, attacks and datasets all use it) ----------------------------

def test_list_methods_by_kind():
    online, episodic = shiftlab.list_methods(kind="online"), shiftlab.list_methods(kind="episodic")
    assert online and episodic and sorted(online + episodic) == shiftlab.list_methods()
    assert all(not get_method_class(n).episodic for n in online)
    assert all(get_method_class(n).episodic for n in episodic)
    assert {"tda", "dmn_zs"} <= set(online) and "tpt" in episodic
    with pytest.raises(ValueError, match="unknown method kind 'batch'; known: episodic, online"):
        shiftlab.list_methods(kind="batch")


def test_unknown_names_read_as_one_plain_line():
    from shiftlab.attacks import build_attack
    from shiftlab.datasets import DatasetError, build_dataset
    with pytest.raises(KeyError) as info:
        get_method_class("nope")
    assert str(info.value) == f"unknown method 'nope'; known: {', '.join(shiftlab.list_methods())}"
    with pytest.raises(ValueError) as info:
        build_attack({"name": "fgsm"}, evaluator=None)
    assert str(info.value) == "unknown attack 'fgsm'; known: none, pgd"
    with pytest.raises(DatasetError) as info:
        build_dataset("nope", ".")
    from shiftlab.datasets import list_datasets
    assert str(info.value) == f"unknown dataset 'nope'; known: {', '.join(list_datasets())}"
    assert "imagenet-r" in list_datasets() and "flowers102" in list_datasets()


def test_registry_aliases_filters_and_duplicates():
    from shiftlab.registry import Registry, UnknownNameError

    class Entry:
        def __init__(self, online):
            self.online = online

    reg = Registry("widget", normalize=str.lower)
    a, b = reg.register("a", Entry(True), aliases=("Alpha",)), reg.register("b", Entry(False))
    assert reg.get("ALPHA") is a and reg.canonical("alpha") == "a" and reg["B"] is b
    assert reg.names() == ["a", "b"] and reg.names(online=True) == ["a"] and reg.names(where=lambda e: e is b) == ["b"]
    assert "alpha" in reg and "c" not in reg and list(reg) == ["a", "b"] and len(reg) == 2
    assert reg.register("a", a) is a  # the same entry again (a module imported twice) is fine
    with pytest.raises(ValueError, match="widget 'alpha' is already registered"):
        reg.register("c", Entry(True), aliases=("alpha",))
    with pytest.raises(UnknownNameError, match="^unknown widget 'c'; known: a, b$"):
        reg.get("c")
    assert reg.pop("alpha") is a and "a" not in reg and "alpha" not in reg and reg.names() == ["b"]

    @reg.register("k")
    class K:
        pass
    assert reg.get("k") is K and K.name == "k"


def test_unknown_names_suggest_the_closest_registered_name():
    from shiftlab.datasets import DatasetError, build_dataset
    with pytest.raises(DatasetError, match=r"^unknown dataset 'imagenet-rr' \(did you mean 'imagenet-r'\?\); known: "):
        build_dataset("imagenet-rr", ".")
    with pytest.raises(KeyError, match=r"unknown method 'TDAA' \(did you mean 'tda'\?\)"):
        get_method_class("TDAA")
    with pytest.raises(KeyError, match=r"^unknown method 'xyz'; known: "):   # nothing close: no guess
        get_method_class("xyz")
