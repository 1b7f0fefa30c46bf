"""Properties every registered method must have; a new method is tested the moment it registers."""
from __future__ import annotations

import argparse
import dataclasses
import math
import re
import typing

import pytest
import torch

import shiftlab
from _records import small_config
from _transductive import shown_test_set
from conftest import model_for_method
from shiftlab import params
from shiftlab.commands.checks import method_override
from shiftlab.datasets import DATASETS
from shiftlab.datasets.classes import classnames_for_wnids, imagenet_r_wnids
from shiftlab.methods.base import effective_config, get_method_class, make_config
from shiftlab.methods.catalogue.declarations import (
    spec,  # torch-free: choosing the parametrised methods imports no method module
)
from shiftlab.methods.catalogue.protocols import PROTOCOLS
from shiftlab.methods.context import ClassHeads, SampleContext
from shiftlab.params import check_config

CLASSNAMES = classnames_for_wnids(imagenet_r_wnids()[:20])


def _offline(name: str) -> dict:
    """What the method needs to run with nothing downloaded (RLCF: a random-weight reward model)."""
    return dict(get_method_class(name).spec.offline_config)


def _small(name: str) -> dict:
    """`_offline` and the spec's small test config (the fewest steps and buffer slots that exercise the method)."""
    return small_config(name)


def _views(model, seed: int, n: int = 8) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return model.normalize(torch.rand(n, 3, model.image_size, model.image_size, generator=gen))


@pytest.fixture
def tiny_model(request, tiny_model):
    """The tiny ResNet CLIP, or the tiny ViT for a method bound to ViTs (conftest.model_for_method)."""
    return model_for_method(request, tiny_model)


_HEADS: dict[int, ClassHeads] = {}


@pytest.fixture
def heads(tiny_model):
    """The class heads of the test's tiny CLIP, built once per model (as a module fixture did)."""
    if id(tiny_model) not in _HEADS:
        _HEADS[id(tiny_model)] = ClassHeads(tiny_model, CLASSNAMES)
    return _HEADS[id(tiny_model)]


@pytest.mark.parametrize("name", shiftlab.list_methods())
def test_method_predicts_finite_scores(name, tiny_model, heads):
    method = shown_test_set(shiftlab.create_method(name, tiny_model, CLASSNAMES, heads=heads, **_small(name)),
                            tiny_model)
    method.prepare()
    logits = method.predict(_views(tiny_model, 0))
    assert logits.shape == (len(CLASSNAMES),) and torch.isfinite(logits).all()
    out = method.predict_context(SampleContext(tiny_model, heads, _views(tiny_model, 1)))
    probs = out.probabilities()
    assert torch.isfinite(probs).all() and float(probs.sum()) == pytest.approx(1.0, abs=1e-4)
    assert int(out.logits.argmax()) in probs.topk(1).indices.tolist()


@pytest.mark.parametrize("name", [n for n in shiftlab.list_methods() if spec(n).episodic])
def test_episodic_methods_do_not_leak_between_images(name, tiny_model, heads):
    method = shown_test_set(shiftlab.create_method(name, tiny_model, CLASSNAMES, heads=heads, **_small(name)),
                            tiny_model)
    a, b = _views(tiny_model, 2), _views(tiny_model, 3)
    first = method.predict(a)
    method.predict(b)
    torch.testing.assert_close(method.predict(a), first, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", [n for n in shiftlab.list_methods() if spec(n).episodic])
def test_batch_prediction_equals_one_at_a_time(name, tiny_model, heads):
    method = shown_test_set(shiftlab.create_method(name, tiny_model, CLASSNAMES, heads=heads, **_small(name)),
                            tiny_model, heads)
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
    # the first word of each method row, compared whole: "tpt" must be a row, not a part of "ctpt"
    listed = re.findall(r"^(\S+) +(?:episodic|online) ", out, flags=re.MULTILINE)
    # grouped by block (single-image first, then the transductive tracks), sorted within each block
    assert sorted(listed) == shiftlab.list_methods() and len(listed) == len(set(listed))
    blocks = [re.findall(r"^(\S+) +(?:episodic|online) ", part, flags=re.MULTILINE) for part in out.split("\n== ")]
    assert all(block == sorted(block) for block in blocks)


def test_methods_json_says_what_each_field_accepts(capsys):
    import json

    from shiftlab.cli import main
    assert main(["methods", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["tpt"]["accepts"]["lr"] == "a finite float >= 0"
    assert rows["tpt"]["accepts"]["selection_ratio"] == "a finite float in (0, 1]"
    assert rows["tda"]["accepts"]["entropy_norm"] == "one of 'log2', 'ln'"
    assert rows["mta"]["accepts"]["views"] == "a view count or a dict of recipe fields"
    assert rows["mta"]["min_views"] == 5 and rows["rtpt"]["min_views"] == 2 and rows["tpt"]["min_views"] == 1


def test_methods_lists_the_methods_named_alone(capsys):
    """`shiftlab methods tpt` was refused (unrecognized arguments): one method's defaults and recipes were found
    only by reading all 70 entries."""
    import json

    from shiftlab.cli import main
    assert main(["methods", "tpt,tda", "--json"]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["tda", "tpt"]
    assert main(["methods", "tpt"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()
              if line and not line.startswith((" ", "==", "precision"))]
    assert listed == ["tpt"]
    assert main(["methods", "ctpt", "--bibtex"]) == 0
    assert capsys.readouterr().out.count("@") == 1
    with pytest.raises(SystemExit) as info:
        main(["methods", "C-TPT"])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and "unknown method C-TPT (did you mean ctpt?)" in err[0]


def test_methods_lists_a_refused_method_named_alone_with_its_reason(capsys):
    """`shiftlab methods gtta` was refused with GTTA's refusal; `shiftlab methods` lists it with its reason."""
    from shiftlab.cli import main
    from shiftlab.methods.catalogue import listing
    (name, reason), = listing.refused().items()
    assert main(["methods", name]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"^{name} +refused +{re.escape(reason)}$", out, flags=re.MULTILINE), out
    assert not re.findall(r"^(\S+) +(?:episodic|online) ", out, flags=re.MULTILINE)   # no other method
    assert main(["methods", f"tpt,{name}"]) == 0
    out = capsys.readouterr().out
    assert re.findall(r"^(\S+) +(?:episodic|online|refused) ", out, flags=re.MULTILINE) == ["tpt", name]


# -- the registry type itself (methods, attacks and datasets all use it) ----------------------------

def test_list_methods_by_kind():
    online, episodic = shiftlab.list_methods(kind="online"), shiftlab.list_methods(kind="episodic")
    assert online and episodic and sorted(online + episodic) == shiftlab.list_methods()
    assert all(not get_method_class(n).spec.episodic for n in online)
    assert all(get_method_class(n).spec.episodic for n in episodic)
    assert {"tda", "dmn_zs"} <= set(online) and "tpt" in episodic
    with pytest.raises(ValueError, match="unknown method kind 'batch'; known: episodic, online"):
        shiftlab.list_methods(kind="batch")


def test_unknown_names_read_as_one_plain_line():
    from shiftlab.attacks import build_attack
    from shiftlab.datasets import DatasetError, build_dataset
    with pytest.raises(KeyError) as info:
        get_method_class("nope")
    # every registered name, the refused ones (GTTA: registered, not runnable) included
    from shiftlab.methods.catalogue.declarations import refused_methods
    known = sorted([*shiftlab.list_methods(), *refused_methods()])
    assert str(info.value) == f"unknown method 'nope'; known: {', '.join(known)}"
    with pytest.raises(ValueError) as info:
        build_attack({"name": "fgsm"}, model=None, zeroshot_head=None)
    assert str(info.value) == "unknown attack 'fgsm'; known: none, apgd_ce, apgd_t, autoattack, fab_t, pgd, square"
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

# -- config ranges (shiftlab.params): declared for every field, the same check on every path ----------

def _numeric_fields(name: str):
    """(field, annotation arm, range) of every int or float field of the method's config."""
    cls = get_method_class(name).spec.config_class
    types_ = params.hints(cls)
    for f in dataclasses.fields(cls):
        arms = [a for a in typing.get_args(types_[f.name]) or (types_[f.name],) if a in (int, float)]
        if arms:
            yield f, arms[0], params.field_range(f)


@pytest.mark.parametrize("name", shiftlab.list_methods())
def test_every_numeric_config_field_declares_its_range(name):
    fields = list(_numeric_fields(name))
    for f, _, rng in fields:
        assert rng is not None and rng.bounds_text(), (f"{name}.{f.name} has no declared range: "
                                                       "declare it with shiftlab.params.param(default, gt=..., ...)")


@pytest.mark.parametrize("name", shiftlab.list_methods())
def test_defaults_satisfy_their_ranges_and_the_minimum_views(name):
    cls = get_method_class(name).spec
    default = cls.config_class()
    assert check_config(name, default) is default      # nothing to convert: the defaults are stored as checked
    assert make_config(cls) == default
    if cls.needs_views:
        assert cls.needed_views(default) <= default.views.n_views


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("name", shiftlab.list_methods())
def test_every_protocols_overrides_satisfy_the_ranges_on_every_dataset(protocol, name):
    for dataset in [None, *DATASETS.names()]:
        config = effective_config(name, protocol, dataset)     # raises on a value outside its range
        assert check_config(name, config) is config


def _outside(rng: params.Range, kind: type) -> object:
    """A value just outside `rng`, of the field's own type."""
    if rng.gt is not None:
        return kind(rng.gt)
    if rng.ge is not None:
        return kind(rng.ge - 1)
    return kind(rng.le + 1) if rng.le is not None else kind(rng.lt)


def _cli_error(item: str) -> str:
    with pytest.raises(argparse.ArgumentTypeError) as info:
        method_override(item)
    return str(info.value)


@pytest.mark.parametrize("name", shiftlab.list_methods())
def test_set_and_create_method_refuse_a_value_outside_the_range_with_the_same_line(name, tiny_model):
    for f, kind, rng in _numeric_fields(name):
        bad = [_outside(rng, kind), True, "fast"] + ([float("inf"), float("nan")] if kind is float else [1.5])
        for value in bad:
            with pytest.raises(ValueError) as info:
                shiftlab.create_method(name, tiny_model, CLASSNAMES, **{f.name: value})
            message = str(info.value)
            assert message.startswith(f"{name}.{f.name}: ") and "\n" not in message
            assert f"must be {params.describe(params.hints(get_method_class(name).spec.config_class)[f.name], rng)}" \
                in message
            if not (isinstance(value, float) and not math.isfinite(value)):   # no literal for inf and nan
                assert _cli_error(f"{name}.{f.name}={value!r}") == message


@pytest.mark.parametrize("kw, message", [
    # each would otherwise be accepted, or fail seven frames deep with nothing naming the field
    ({"lr": "fast"}, "tpt.lr: 'fast' is not a float; must be a finite float >= 0"),
    ({"lr": float("inf")}, "tpt.lr: inf is not finite; must be a finite float >= 0"),
    ({"lr": -1}, "tpt.lr: -1 is out of range; must be a finite float >= 0"),
    ({"steps": 1.5}, "tpt.steps: 1.5 is not an integer; must be an integer >= 0"),
    ({"steps": True}, "tpt.steps: True is not an integer; must be an integer >= 0"),
    ({"steps": -3}, "tpt.steps: -3 is out of range; must be an integer >= 0"),
    ({"selection_ratio": 5}, "tpt.selection_ratio: 5 is out of range; must be a finite float in (0, 1]"),
    ({"share_prefix": 1}, "tpt.share_prefix: 1 is not True or False; must be True or False"),
    ({"ctx_init": 4}, "tpt.ctx_init: 4 is not a string; must be a string or None"),
    ({"precision": "fp64"}, "tpt.precision: 'fp64' is not a choice; must be one of 'auto', 'fp32', 'fp16', 'bf16', "
                            "'fp16-pure'"),
])
def test_create_method_refuses_bad_values_with_one_line(tiny_model, kw, message):
    with pytest.raises(ValueError) as info:
        shiftlab.create_method("tpt", tiny_model, CLASSNAMES, **kw)
    assert str(info.value) == message


@pytest.mark.parametrize("name, kw, fragment", [
    ("tda", {"entropy_norm": "log10"}, "tda.entropy_norm: 'log10' is not a choice; must be one of 'log2', 'ln'"),
    ("tda", {"text_head": "tip_cupl"}, "tda.text_head: 'tip_cupl' is not a choice; must be one of 'ensemble', "
                                       "'zeroshot'"),
    ("tda", {"view_ratio": 0.0}, "tda.view_ratio: 0.0 is out of range; must be a finite float in (0, 1]"),
    ("tda", {"logit_scale": 0}, "tda.logit_scale: 0 is out of range; must be a finite float > 0 or None"),
    ("dmn_zs", {"dynamic_weight": -0.5}, "dmn_zs.dynamic_weight: -0.5 is out of range; must be a finite float >= 0"),
    ("dmn_zs", {"text_head": "cupl"}, "'ensemble', 'zeroshot', 'tip_cupl'"),
    ("zero", {"keep_ratio": 1.5}, "zero.keep_ratio: 1.5 is out of range; must be a finite float in (0, 1]"),
    ("zero", {"vote_rule": "hard"}, "zero.vote_rule: 'hard' is not a choice; must be one of 'soft', 'authors'"),
    ("view_ensemble", {"average": "median"}, "view_ensemble.average: 'median' is not a choice; must be one of "
                                             "'probs', 'logits'"),
    ("rtpt", {"self_mask": "diag"}, "rtpt.self_mask: 'diag' is not a choice; must be one of 'index', 'threshold'"),
])
def test_enumerated_and_bounded_fields_list_what_they_accept(tiny_model, name, kw, fragment):
    with pytest.raises(ValueError) as info:
        shiftlab.create_method(name, tiny_model, CLASSNAMES, **kw)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_an_int_is_a_float_field_value_and_is_stored_as_a_float(tiny_model):
    method = shiftlab.create_method("tpt", tiny_model, CLASSNAMES, lr=1, loss_scale=1000)
    assert type(method.config.lr) is float and method.config.lr == 1.0 and type(method.config.loss_scale) is float
    assert method_override("tpt.lr=1") == ("tpt", "lr", 1.0)


def test_a_config_handed_to_the_class_is_checked_too(tiny_model):
    from shiftlab.methods.tpt.spec import PromptTuningConfig
    with pytest.raises(ValueError, match=r"^tpt\.lr: -1 is out of range"):
        get_method_class("tpt")(tiny_model, CLASSNAMES, PromptTuningConfig(lr=-1))


def test_protocol_overrides_go_through_the_same_check(tiny_model, monkeypatch):
    from shiftlab.methods.catalogue.declarations import spec
    monkeypatch.setattr(spec("tpt"), "protocols", {"paper": {"selection_ratio": 2.0}})   # the spec's recipe
    with pytest.raises(ValueError, match=r"^tpt\.selection_ratio: 2\.0 is out of range"):
        shiftlab.create_method("tpt", tiny_model, CLASSNAMES, protocol="paper")
    shiftlab.create_method("tpt", tiny_model, CLASSNAMES, protocol="paper", selection_ratio=0.5)   # --set wins


# -- the fewest views a method needs ------------------------------------------------------------------

@pytest.mark.parametrize("name", [n for n in shiftlab.list_methods() if spec(n).needs_views])
def test_each_method_runs_at_its_declared_minimum_and_is_refused_below_it(name, tiny_model, heads):
    cls = get_method_class(name).spec
    needed = cls.needed_views(cls.config_class())
    method = shown_test_set(shiftlab.create_method(name, tiny_model, CLASSNAMES, heads=heads, views=needed,
                                                   **_offline(name)), tiny_model)
    method.prepare()
    assert torch.isfinite(method.predict(_views(tiny_model, 0, n=needed))).all()
    if needed > 1:
        with pytest.raises(ValueError) as info:
            shiftlab.create_method(name, tiny_model, CLASSNAMES, heads=heads, views=needed - 1)
        assert str(info.value).startswith(f"{name}: needs at least {needed} views (incl. the original), "
                                          f"got {needed - 1}")
        with pytest.raises(ValueError, match=f"{name}: needs at least {needed} views"):   # the library's predict too
            method.predict(_views(tiny_model, 0, n=needed - 1))


def test_the_minimum_views_are_where_the_computation_stops_being_defined(tiny_model):
    from shiftlab.methods.mta.method import view_bandwidths
    from shiftlab.methods.mta.spec import MTAConfig
    from shiftlab.methods.tpt.method import reliability_weights
    mta = get_method_class("mta").spec
    feats = torch.nn.functional.normalize(torch.randn(8, 16, generator=torch.Generator().manual_seed(0)), dim=-1)
    for ratio in (0.3, 0.1, 0.5, 1.0, 1 / 3):
        n = mta.needed_views(MTAConfig(neighbour_ratio=ratio))
        assert torch.isfinite(view_bandwidths(feats[:n] if n <= 8 else torch.cat([feats] * 2)[:n], ratio)).all()
        with pytest.raises(ValueError, match="at least one neighbour"):
            view_bandwidths(feats[:n - 1], ratio)
    assert mta.needed_views(MTAConfig()) == 5
    assert get_method_class("rtpt").spec.needed_views(None) == 2
    assert torch.isnan(reliability_weights(feats[:1])).all()           # one view: no neighbour, NaN weights
    assert torch.isfinite(reliability_weights(feats[:2])).all()


def test_the_engine_refuses_a_run_below_a_methods_minimum_before_any_work(tiny_model):
    from shiftlab.engine.step import Evaluator
    with pytest.raises(ValueError, match=r"^mta: needs at least 5 views \(incl. the original\), got 4"):
        Evaluator(tiny_model, CLASSNAMES, ["zeroshot", "mta"], run_views={"n_views": 4})
    assert Evaluator(tiny_model, CLASSNAMES, ["mta"], run_views={"n_views": 5}).methods["mta"].view_recipe.n_views == 5
