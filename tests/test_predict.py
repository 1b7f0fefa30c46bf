"""`Method.predict` (the library's entry point): input validation, and the engine's image encoder."""
from __future__ import annotations

import contextlib

import pytest
import torch

import shiftlab
from shiftlab.engine.step import Evaluator
from shiftlab.methods.base import get_method_class
from shiftlab.methods.context import ClassHeads, SampleContext
from shiftlab.models.precision import Precision
from shiftlab.models.precision import resolve as resolve_precision
from shiftlab.synthetic import random_image
from shiftlab.views.generator import ViewConfig, ViewGenerator

CLASSES = ["goldfish", "great white shark", "hammerhead"]


pytestmark = pytest.mark.usefixtures("one_thread")


def _views(model: shiftlab.ClipModel, n_views: int = 6, seed: int = 0) -> torch.Tensor:
    # ViewConfig() without a size: the model's own input size (64 px for the tiny CLIP)
    return ViewGenerator(ViewConfig(n_views=n_views), seed=seed, preprocess=model.preprocess)(
        random_image((80, 60), seed=seed), 0)


def test_library_views_at_the_default_size_work(tiny_model):
    # Views sized for another model (a fixed 224 px) would fail deep inside open_clip on a 64-px model.
    views = _views(tiny_model)
    assert views.shape == (6, 3, 64, 64)
    logits = shiftlab.create_method("zeroshot", tiny_model, CLASSES).predict(tiny_model.normalize(views.float() / 255))
    assert logits.shape == (3,) and torch.isfinite(logits).all()


@pytest.mark.parametrize("bad, message", [
    ("uint8", r"float tensor .* got torch.uint8; .*model.normalize\(views.float\(\) / 255\)"),
    ("3d", r"must be \(N, 3, 64, 64\), got shape \(3, 64, 64\)"),
    ("channels", r"must be \(N, 3, 64, 64\), got shape \(2, 1, 64, 64\)"),
    ("empty", r"at least one view"),
    ("size", r"views are 224x224 px but shiftlab-tiny takes 64x64"),
    ("list", r"must be a torch.Tensor"),
])
def test_predict_refuses_bad_views_with_one_line(tiny_model, bad, message):
    # Unnormalised uint8 views would otherwise fail with a dtype error deep inside the image tower.
    method = shiftlab.create_method("zeroshot", tiny_model, CLASSES)
    views = {"uint8": _views(tiny_model), "3d": torch.zeros(3, 64, 64), "channels": torch.zeros(2, 1, 64, 64),
             "empty": torch.zeros(0, 3, 64, 64), "size": torch.zeros(2, 3, 224, 224),
             "list": [torch.zeros(3, 64, 64)]}[bad]
    with pytest.raises(ValueError, match=message) as info:
        method.predict(views)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["zeroshot", "view_ensemble", "mta", "rlcf"])
def test_predict_equals_the_engine(tiny_model, name):
    views = [_views(tiny_model, seed=s) for s in range(3)]
    offline = dict(get_method_class(name).spec.offline_config)   # RLCF: a random-weight reward model, no download
    evaluator = Evaluator(tiny_model, CLASSES, [name], method_config={name: offline})
    ctxs = evaluator.contexts(views, [0, 1, 2])
    method = evaluator.methods[name]
    for u8, ctx in zip(views, ctxs):
        got = method.predict(tiny_model.normalize(u8.float() / 255))
        torch.testing.assert_close(got, method.predict_context(ctx).logits, rtol=0, atol=1e-5)


class _CpuBf16(Precision):
    """The policy keeps CPU in float32; this stand-in autocasts to bf16 on the CPU, as fp16 does on CUDA,
    to show that the policy's autocast is what the image tower runs under."""

    @contextlib.contextmanager
    def autocast(self):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            yield


def test_one_image_encoder_under_the_precision_policy(tiny_model):
    x = tiny_model.normalize(_views(tiny_model, n_views=5).float() / 255)
    heads = ClassHeads(tiny_model, CLASSES)
    full = SampleContext(tiny_model, heads, x).image_features
    assert torch.equal(full, tiny_model.encode_views(x))
    assert torch.equal(full, tiny_model.encode_views(x, resolve_precision("auto", "cpu")))
    low = SampleContext(tiny_model, heads, x, precision=_CpuBf16("bf16", "cpu")).image_features
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = torch.nn.functional.normalize(tiny_model.clip.encode_image(x), dim=-1).float()
    assert low.dtype == torch.float32 and torch.equal(low, want) and (low - full).abs().max() > 0
    # chunking does not change the features beyond float noise
    torch.testing.assert_close(tiny_model.encode_views(x, chunk_size=2), full, rtol=0, atol=1e-6)
    # predict encodes with the method's precision ("auto": the run's), as the engine encodes its views
    method = shiftlab.create_method("view_ensemble", tiny_model, CLASSES)
    assert method.run_precision == "auto"
    ctx = SampleContext(tiny_model, method.heads, x, precision=resolve_precision("auto", tiny_model.device))
    torch.testing.assert_close(method.predict(x), method.predict_context(ctx).logits, rtol=0, atol=0)


# -- one call on an image ---------------------------------------------------------------------------

def _image_file(tmp_path, name="cat.jpg"):
    path = tmp_path / name
    random_image((90, 70), seed=4).save(path)
    return path


@pytest.mark.parametrize("method", ["zeroshot", "zero", "tda"])
def test_predict_image_is_the_method_on_its_own_views(tiny_model, tmp_path, method):
    # the one-call path equals drawing the method's recipe by hand and calling predict
    import numpy as np
    from PIL import Image
    path = _image_file(tmp_path)
    m = shiftlab.create_method(method, tiny_model, CLASSES)
    by_path = m.predict_image(path, seed=3)
    m = shiftlab.create_method(method, tiny_model, CLASSES)
    gen = ViewGenerator(ViewConfig.from_recipe(m.view_recipe), 3, preprocess=tiny_model.preprocess)
    views = gen(Image.open(path).convert("RGB"), 0)
    assert views.shape[0] == m.view_recipe.n_views
    logits = m.predict(tiny_model.normalize(views.float() / 255))
    torch.testing.assert_close(by_path.logits, logits, rtol=0, atol=1e-6)
    assert by_path.index == int(by_path.probs.argmax()) and by_path.name == CLASSES[by_path.index]
    assert abs(float(by_path.probs.sum()) - 1) < 1e-5
    for other in (Image.open(path), np.asarray(Image.open(path).convert("RGB")), str(path)):
        again = shiftlab.create_method(method, tiny_model, CLASSES).predict_image(other, seed=3)
        torch.testing.assert_close(again.probs, by_path.probs, rtol=0, atol=0)
    top = by_path.top(5)
    assert len(top) == 3 and top[0] == (by_path.name, pytest.approx(by_path.confidence))
    assert [p for _, p in top] == sorted((p for _, p in top), reverse=True)


def test_shiftlab_predict_with_a_dataset_name(tiny_model, tmp_path):
    from shiftlab.datasets.classes import classnames_for_wnids, imagenet_r_wnids
    names = shiftlab.classnames("imagenet-r")
    assert names == classnames_for_wnids(imagenet_r_wnids()) and len(names) == 200
    assert shiftlab.classnames("R") == names
    flowers = shiftlab.classnames("flowers102")
    assert len(flowers) == 102 and flowers[0] == "pink primrose" and flowers[-1] == "blackberry lily"
    assert len(shiftlab.classnames("imagenet-v2")) == 1000
    with pytest.raises(ValueError, match="imagefolder: its class names come from its folders"):
        shiftlab.classnames("imagefolder")
    pred = shiftlab.predict(_image_file(tmp_path), method="zeroshot", model=tiny_model, classes="imagenet-r")
    assert pred.probs.shape == (200,) and pred.name == names[pred.index]
    same = shiftlab.create_method("zeroshot", tiny_model, names).predict_image(_image_file(tmp_path))
    torch.testing.assert_close(pred.logits, same.logits, rtol=0, atol=0)


def test_transform_is_the_runs_view_zero(tiny_model):
    from PIL import Image
    img = random_image((120, 80), seed=2)
    x = tiny_model.transform(img)
    view0 = ViewGenerator(ViewConfig(n_views=1), 0, preprocess=tiny_model.preprocess)(img, 0)[0]
    assert x.shape == (3, 64, 64) and x.dtype == torch.float32
    torch.testing.assert_close(x, tiny_model.normalize(view0.float().div(255).unsqueeze(0))[0], rtol=0, atol=0)
    assert isinstance(img, Image.Image)


@pytest.mark.parametrize("bad, message", [
    (3.5, "image must be a path, a PIL image, a uint8 array or a uint8 tensor, got float"),
    ("nope.jpg", "file not found"),
])
def test_predict_image_refuses_what_is_not_an_image(tiny_model, bad, message):
    from shiftlab.datasets.imageio import ImageDecodeError
    m = shiftlab.create_method("zeroshot", tiny_model, CLASSES)
    with pytest.raises((ValueError, ImageDecodeError), match=message):
        m.predict_image(bad)
    import numpy as np
    with pytest.raises(ValueError, match=r"image array must be uint8"):
        m.predict_image(np.zeros((8, 8, 3), dtype=np.float32))


@pytest.mark.parametrize("doc, heading", [("README.md", "## Library use"), ("docs/LIBRARY.md", "# Library use")])
def test_readme_library_section_runs_as_written(tiny_model, tmp_path, monkeypatch, doc, heading):
    # the library snippet (the README's, and docs/LIBRARY.md's longer one), executed: only the weights are the
    # tiny random CLIP's
    import re
    from pathlib import Path
    readme = (Path(__file__).resolve().parents[1] / doc).read_text()
    section = readme[readme.index(heading):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    _image_file(tmp_path)
    monkeypatch.setattr(shiftlab, "load_model", lambda *a, **k: tiny_model)
    exec(compile(code, doc, "exec"), {})

@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_predict_refuses_non_finite_views_before_an_online_memory_sees_them(tiny_model, value):
    # One NaN view written into dmn_zs's memory would poison every later prediction of the stream.
    x = tiny_model.normalize(_views(tiny_model, n_views=8).float() / 255)
    clean = shiftlab.create_method("dmn_zs", tiny_model, CLASSES)
    method = shiftlab.create_method("dmn_zs", tiny_model, CLASSES)
    bad = x.clone()
    bad[3, 1, 5, 7] = value
    bad[5] = value
    with pytest.raises(ValueError) as info:
        method.predict(bad)
    assert str(info.value) == "views hold NaN or inf values (view 3 and 1 more); pass finite, normalised pixels"
    assert sum(method.memory.counts) == 0        # nothing stored
    torch.testing.assert_close(method.predict(x), clean.predict(x), rtol=0, atol=0)


@pytest.mark.parametrize("classnames, message", [
    ([], "classnames is empty: give the dataset's class names, one per class"),
    ("abc", "classnames must be a list of class names, got 'abc' (a string would make one class of each character)"),
    ({"cat", "dog"}, "classnames must be a list of class names, got set"),
    (["cat", "dog", "cat"], "classnames[2] 'cat' repeats classnames[0]: two classes with one name get the same "
                            "text features; name every class once"),
    (["cat", ""], "classnames[1] is ''; every class name must be a non-empty string"),
    (["cat", 7], "classnames[1] is 7; every class name must be a non-empty string"),
])
@pytest.mark.parametrize("build", ["create_method", "class"])
def test_class_names_are_a_list_of_distinct_names(tiny_model, classnames, message, build):
    with pytest.raises(ValueError) as info:
        if build == "create_method":
            shiftlab.create_method("zeroshot", tiny_model, classnames)
        else:
            shiftlab.methods.get_method_class("tda")(tiny_model, classnames)
    assert str(info.value) == message


def test_published_lists_with_duplicate_names_run_when_asked(tiny_model):
    # CLIP's ImageNet class names hold two pairs of equal names; the engine runs them as published
    names = ["missile", "goldfish", "missile"]
    method = shiftlab.create_method("zeroshot", tiny_model, tuple(names), allow_duplicate_names=True)
    assert method.classnames == names
    assert Evaluator(tiny_model, names, ["zeroshot", "tda"]).methods["tda"].classnames == names
