"""TTAug: the mean of its views' logits against a straightforward computation, and the method as
mariodoebler/test-time-adaptation runs it on CLIP (`classification/methods/ttaug.py` on its ZeroShotCLIP,
AlphaBatchNorm) over the golden tiny ResNet CLIP (tests/fixtures/golden/ttaug, made by the driver beside the
fixtures, float32 on the CPU): 3 images of the golden stream, 8 views each, alpha 0.1 and 0.5; each view's logits
and their mean within LOGITS."""
from __future__ import annotations

import json

import pytest
import torch

import shiftlab
from _golden import FEATURES, LOGITS, assert_close, stream_views
from shiftlab.methods.context import SampleContext
from shiftlab.views.recipe import ViewRecipe

pytestmark = pytest.mark.usefixtures("one_thread")

CLASSES = ["cat", "dog", "car", "bus"]
VARIANTS = {"ttaug": {}, "ttaug_alpha": {"alpha": 0.5}}


def test_the_output_is_the_mean_of_the_views_logits_and_source_statistics_are_the_frozen_tower(tiny_model):
    x = tiny_model.normalize(torch.rand(5, 3, 64, 64, generator=torch.Generator().manual_seed(0)))
    method = shiftlab.create_method("ttaug", tiny_model, CLASSES, views=ViewRecipe(n_views=5), statistics="source")
    frozen = tiny_model.logit_scale * tiny_model.encode_views(x) @ method.heads.zeroshot.T
    assert_close(method.predict(x), frozen.mean(0), 1e-4, "source statistics")
    mixed = shiftlab.create_method("ttaug", tiny_model, CLASSES, views=ViewRecipe(n_views=5))
    per_view = mixed.view_logits(x)
    torch.testing.assert_close(mixed.predict(x), per_view.mean(0))
    assert (per_view - frozen).abs().max() > 1e-3          # the views' statistics change every view's logits
    assert not torch.equal(mixed.view_logits(x[:3])[0], per_view[0])   # and depend on the other views
    three = shiftlab.create_method("ttaug", tiny_model, CLASSES, views=ViewRecipe(n_views=3))
    torch.testing.assert_close(three.predict(x), mixed.view_logits(x[:3]).mean(0))   # only its recipe's views


@pytest.mark.golden
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_ttaug_matches_their_code_image_by_image(golden_model, golden_dir, variant):
    from shiftlab.methods.context import ClassHeads
    model, names = golden_model
    heads = ClassHeads(model, names)
    want = torch.load(golden_dir / "ttaug" / f"{variant}.pt", map_location="cpu", weights_only=True)
    info = json.loads((golden_dir / "ttaug" / "ttaug.json").read_text())["fixtures"][variant]
    method = shiftlab.create_method("ttaug", model, names, heads=heads, views=ViewRecipe(n_views=info["views"]),
                                    **VARIANTS[variant])
    assert_close(heads.zeroshot, want["prototypes"], FEATURES, "text head")
    views = stream_views(golden_dir, info["views"])
    assert info["images"] == 3
    for i in range(info["images"]):
        x = model.normalize(views[i])
        assert_close(method.view_logits(x), want[f"{i}/views"], LOGITS, f"image {i} view logits")
        out = method.predict_context(SampleContext(model, heads, x))
        assert_close(out.logits, want[f"{i}/logits"][0], LOGITS, f"image {i} logits")
