"""Protocols (shiftlab.methods.catalogue.protocols): each method's effective config, view recipe and precision per
protocol."""
from __future__ import annotations

import functools
import json

import pytest
import torch

import shiftlab
from shiftlab.methods.base import get_method_class
from shiftlab.methods.catalogue.protocols import PROTOCOLS, method_overrides
from shiftlab.views.recipe import ViewRecipe

NAMES = ["cat", "dog", "hen"]
LEADERBOARD_VIEWS = ViewRecipe(n_views=64)     # view 0 + 63 RandomResizedCrop(0.08-1) + flip, no AugMix


@pytest.fixture(scope="module")
def cupl_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("cupl") / "cupl.json"
    path.write_text(json.dumps({n: [f"A {n} in the grass."] for n in NAMES}))
    return str(path)


def _method(tiny_model, name, cupl_file=None, **kw):
    if hasattr(get_method_class(name).spec.config_class, "cupl_file") and kw.get("protocol") == "paper":
        kw.setdefault("cupl_file", cupl_file)   # the paper's tip_cupl head reads the user's CuPL file
    if hasattr(get_method_class(name).spec.config_class, "descriptors_file") and kw.get("protocol") == "paper":
        kw.setdefault("descriptors_file", cupl_file)   # TPS's descriptor phrases: the same {class: [text]} format
    if hasattr(get_method_class(name).spec.config_class, "description_file") and kw.get("protocol") == "paper":
        kw.setdefault("description_file", cupl_file)   # AWT's descriptions: the same {class: [text]} format
    kw = {**get_method_class(name).spec.offline_config, **kw}   # RLCF: a random-weight reward model, no download
    if "resnet" not in get_method_class(name).spec.towers:      # TCA: a ViT only
        tiny_model = _tiny_vit()
    return shiftlab.create_method(name, tiny_model, NAMES, **kw)


@functools.cache
def _tiny_vit() -> shiftlab.ClipModel:
    return shiftlab.load_model("shiftlab-tiny-vit", None, seed=0)


def test_leaderboard_runs_every_view_method_on_the_same_views(tiny_model):
    for name in shiftlab.list_methods():
        m = _method(tiny_model, name)
        assert m.config.precision == "auto"
        if not m.spec.needs_views:
            assert m.view_recipe == ViewRecipe(n_views=1), name
        elif name == "dmn_zs":   # the first 32 of the same views (a prefix: nothing extra to encode)
            assert m.view_recipe == LEADERBOARD_VIEWS.with_views(32)
        elif name == "cosmic":   # its authors' 8 views (cosmic_ood.sh -b 8): also a prefix of the same views
            assert m.view_recipe == LEADERBOARD_VIEWS.with_views(8)
        elif name == "histpt":   # view 0 alone unless it tunes on the views (TTABC's default `tpt: False`)
            assert m.view_recipe == ViewRecipe(n_views=1) and not m.config.tune_on_views
        elif name == "awt":      # its authors' 51 views (pre_extract.sh BS=50 + the original): a prefix too
            assert m.view_recipe == LEADERBOARD_VIEWS.with_views(51)
        else:
            assert m.view_recipe == LEADERBOARD_VIEWS, name


def test_paper_recipes_are_the_authors(tiny_model, cupl_file):
    paper = {n: _method(tiny_model, n, cupl_file, protocol="paper") for n in shiftlab.list_methods()}
    assert paper["ctpt"].view_recipe == ViewRecipe(n_views=64, augmix=True)
    assert paper["ctpt"].config.lambda_atfd == 20.0 and paper["ctpt"].config.precision == "fp16"
    assert paper["tpt"].view_recipe == LEADERBOARD_VIEWS and paper["tpt"].config.precision == "fp16"
    assert paper["rtpt"].view_recipe == LEADERBOARD_VIEWS and paper["rtpt"].config.precision == "fp32"
    assert paper["mta"].view_recipe == LEADERBOARD_VIEWS
    assert paper["zero"].config.precision == "fp16"
    assert paper["tda"].view_recipe == ViewRecipe(n_views=64, augmix=True)
    assert paper["tda"].config.text_head == "ensemble" and paper["tda"].config.precision == "fp16-pure"
    assert paper["tda"].config.logit_scale == 100.0 and _method(tiny_model, "tda").config.logit_scale is None
    assert paper["dmn_zs"].view_recipe == ViewRecipe(n_views=32, scale=(0.5, 1.0))
    assert paper["dmn_zs"].config.precision == "fp32"
    assert (paper["dmn_zs"].config.memory_size, paper["dmn_zs"].config.beta) == (50, 5.5)
    assert paper["dmn_zs"].config.text_head == "tip_cupl"
    assert paper["tps"].view_recipe == LEADERBOARD_VIEWS and paper["tps"].config.precision == "fp16"
    assert paper["tps"].config.text_head == "ensemble_descriptors" and _method(tiny_model, "tps").config.text_head \
        == "ensemble"
    assert paper["rlcf"].view_recipe == LEADERBOARD_VIEWS and paper["rlcf"].config.precision == "fp16"
    assert (paper["rlcf"].config.steps, paper["rlcf"].config.sample_k) == (3, 3)
    assert (paper["tca"].config.text_head, paper["tca"].config.logit_scale) == ("ensemble", 100.0)
    # on the CPU every policy computes in float32
    assert all(m.precision.amp_dtype is None for m in paper.values())


def test_set_overrides_merge_onto_the_protocol(tiny_model, cupl_file):
    # --set dmn_zs.views={'n_views': 16} keeps the paper's crop scale; a bare count does too
    for views in ({"n_views": 16}, 16):
        m = _method(tiny_model, "dmn_zs", cupl_file, protocol="paper", views=views)
        assert m.view_recipe == ViewRecipe(n_views=16, scale=(0.5, 1.0))
    m = _method(tiny_model, "tpt", views={"augmix": True, "augmix_severity": 3})
    assert m.view_recipe == ViewRecipe(n_views=64, augmix=True, augmix_severity=3)
    m = _method(tiny_model, "ctpt", protocol="paper", views=ViewRecipe(n_views=8))
    assert m.view_recipe == ViewRecipe(n_views=8)     # a whole recipe replaces
    with pytest.raises(ValueError, match=r"dmn_zs: views: unknown recipe field\(s\) \['crop'\]"):
        _method(tiny_model, "dmn_zs", views={"crop": 3})


def test_run_precision_replaces_the_protocols_but_not_a_set(tiny_model):
    assert _method(tiny_model, "rtpt", protocol="paper", run_precision="bf16").precision.name == "bf16"
    assert _method(tiny_model, "rtpt", protocol="paper").precision.name == "fp32"
    set_by_user = _method(tiny_model, "rtpt", protocol="paper", run_precision="bf16", precision="fp16")
    assert set_by_user.precision.name == "fp16"
    assert method_overrides("paper", get_method_class("rtpt"), run_precision="fp32") == {}


def test_unknown_protocol_is_one_clear_error(tiny_model):
    with pytest.raises(ValueError, match=r"protocol must be one of leaderboard, paper, got 'papers'"):
        _method(tiny_model, "tpt", protocol="papers")


def test_predict_encodes_only_the_views_the_method_reads(tiny_model, cupl_file, monkeypatch):
    encoded = []
    original = tiny_model.encode_normalized

    def counting(x):
        encoded.append(x.shape[0])
        return original(x)

    monkeypatch.setattr(tiny_model, "encode_normalized", counting)
    gen = torch.Generator().manual_seed(0)
    views = tiny_model.normalize(torch.rand(64, 3, tiny_model.image_size, tiny_model.image_size, generator=gen))
    for name, protocol, n in [("dmn_zs", "leaderboard", 32), ("dmn_zs", "paper", 32), ("mta", "leaderboard", 64),
                              ("zeroshot", "leaderboard", 1), ("tda", "leaderboard", 64)]:
        encoded.clear()
        m = _method(tiny_model, name, cupl_file, protocol=protocol)
        m.prepare()
        assert torch.isfinite(m.predict(views)).all()
        assert sum(encoded) == n, (name, protocol, encoded)


def test_methods_command_prints_both_protocols(capsys):
    from shiftlab.cli import main
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for protocol in PROTOCOLS:
        assert sum(line.strip().startswith(protocol + ":") for line in lines) == len(shiftlab.list_methods())
    dmn = out[out.index("dmn_zs"):]
    assert "paper:        32 views: original + 31 x RandomResizedCrop(scale 0.5-1) + flip; precision fp32" in dmn
    ctpt = out[out.index("ctpt"):]
    assert "+ AugMix(severity 1, width 3); precision fp16" in ctpt.split("dmn_zs")[0]


def test_methods_command_prints_each_protocols_text_head(capsys):
    from shiftlab.cli import main
    assert main(["methods"]) == 0
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]

    def recipe(method: str, protocol: str) -> str:
        start = next(i for i, line in enumerate(lines) if line.split(" ")[0] == method)
        return next(line for line in lines[start:] if line.startswith(protocol + ":"))

    views32 = "32 views: original + 31 x RandomResizedCrop(scale {}) + flip"
    assert recipe("dmn_zs", "leaderboard") == ("leaderboard:  " + views32.format("0.08-1") +
                                               "; precision auto; text CLIP's 80 templates")
    tip_cupl = "text tip_cupl: 7 Tip-Adapter templates + CuPL descriptions (cupl_file)"
    assert recipe("dmn_zs", "paper") == ("paper:        " + views32.format("0.5-1") + "; precision fp32; "
                                         + tip_cupl + ", memory_size=50, beta=5.5")
    assert recipe("tda", "paper").endswith("+ AugMix(severity 1, width 3); precision fp16-pure; "
                                           "text CLIP's 80 templates, logit_scale=100.0")
    tuned = "; text 4 tuned context tokens from 'a photo of a' + '{}.'"
    assert recipe("tpt", "leaderboard").endswith("; precision auto" + tuned)
    assert recipe("ctpt", "paper").endswith("; precision fp16" + tuned + ", lambda_atfd=20.0")
    for protocol in PROTOCOLS:
        assert recipe("zeroshot", protocol).endswith("view 0 only (resize + centre crop); precision auto; "
                                                      "text 'a photo of a {}.'")
        assert recipe("prompt_ensemble", protocol).endswith("; text CLIP's 80 templates")
        assert recipe("zero", protocol).endswith("; text 'a photo of a {}.'")
    assert recipe("mta", "paper").endswith("; precision fp16; text 'a photo of a {}.'")
    capsys.readouterr()
    assert main(["methods", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["dmn_zs"]["protocols"]["leaderboard"]["text_head"] == "CLIP's 80 templates"
    assert rows["dmn_zs"]["protocols"]["paper"]["text_head"].startswith("tip_cupl")
    assert rows["tda"]["protocols"]["paper"]["precision"] == "fp16-pure"
