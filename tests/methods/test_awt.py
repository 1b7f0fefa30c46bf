"""AWT: its weights and transport against plain computations, and MCG-NJU/AWT's own `AWT_zero_shot/evaluate.py` on
the golden tiny CLIP (tests/fixtures/golden/awt, made by the driver beside it: 4 samples of 32 views, the ImageNet-R
template, 3 descriptions per class from a stand-in description file in their format).

Golden tolerances: tests/_golden.py's FEATURES (features, weights) and LOGITS (the transported logits).
"""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

import shiftlab
from _golden import FEATURES, FIXTURES, LOGITS, assert_close
from shiftlab import ClassHeads, SampleContext
from shiftlab.methods.awt.method import entropy_weights, sinkhorn
from shiftlab.methods.catalogue.method_plan import plan_method

pytestmark = pytest.mark.usefixtures("one_thread")


def plain_entropy(logits: torch.Tensor) -> float:
    p = logits.double().softmax(-1)
    return float(-(p * p.log()).sum())


def test_entropy_weights_written_out():
    gen = torch.Generator().manual_seed(0)
    logits = 5 * torch.randn(3, 4, 5, generator=gen)          # (N views, P prompts, C classes)
    image_w, text_w = entropy_weights(logits, 0.5, 0.25)
    want_image = torch.tensor([-plain_entropy(logits[v].mean(0)) / 0.5 for v in range(3)],
                              dtype=torch.float64).softmax(-1)
    torch.testing.assert_close(image_w.double(), want_image, rtol=0, atol=1e-6)
    anchor = logits[0].mean(0)
    for c in range(5):
        scores = []
        for p in range(4):
            swapped = anchor.clone()
            swapped[c] = logits[0, p, c]
            scores.append(-plain_entropy(swapped) / 0.25)
        torch.testing.assert_close(text_w[c].double(), torch.tensor(scores, dtype=torch.float64).softmax(-1), rtol=0,
                                   atol=1e-6)


def test_sinkhorn_meets_both_marginals():
    gen = torch.Generator().manual_seed(1)
    kernel = torch.rand(2, 4, 3, generator=gen, dtype=torch.float64) + 0.1
    u = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    v = torch.tensor([[0.2, 0.3, 0.5], [0.6, 0.2, 0.2]], dtype=torch.float64)
    plan = sinkhorn(kernel, u, v, iterations=500, tol=0.0)
    torch.testing.assert_close(plan.sum(1), v, rtol=0, atol=1e-10)          # columns, the last scaling
    torch.testing.assert_close(plan.sum(2), u.expand(2, 4), rtol=0, atol=1e-8)
    # their stopping rule: one pass when the first scaling is already within tol of ones
    one = sinkhorn(torch.ones(1, 2, 2, dtype=torch.float64), torch.full((2,), 2.0, dtype=torch.float64),
                   torch.full((1, 2), 0.5, dtype=torch.float64), iterations=100, tol=1.5)
    torch.testing.assert_close(one, torch.full((1, 2, 2), 0.25, dtype=torch.float64))


def test_descriptions_are_refused_clearly(tiny_model, tmp_path):
    names = ["goldfish", "hen"]
    heads = ClassHeads(tiny_model, names)
    ctx = SampleContext(tiny_model, heads, torch.zeros(4, 3, 64, 64),
                        image_features=F.normalize(torch.randn(4, heads.zeroshot.shape[1]), dim=-1))
    with pytest.raises(ValueError, match="awt.description_file: not set"):
        shiftlab.create_method("awt", tiny_model, names, heads=heads, n_descriptions=50).predict_context(ctx)
    # their 50 descriptions under --protocol paper; without their file the default reads the class prompt alone
    assert plan_method("awt", "paper").config.n_descriptions == 50
    with pytest.raises(ValueError, match="^awt.description_file: not set"):   # refused as it is built, before a sample
        shiftlab.create_method("awt", tiny_model, names, heads=heads, protocol="paper")
    short = tmp_path / "d.json"
    short.write_text(json.dumps({"goldfish": ["a"], "hen": ["b", "c"]}))
    with pytest.raises(ValueError, match="fewer than n_descriptions=2"):
        shiftlab.create_method("awt", tiny_model, names, heads=heads, description_file=str(short),
                               n_descriptions=2).predict_context(ctx)
    out = shiftlab.create_method("awt", tiny_model, names, heads=heads).predict_context(ctx)
    assert out.logits.shape == (2,) and math.isfinite(float(out.logits.sum()))


def test_a_description_file_the_config_would_not_read_is_refused(tiny_model, tmp_path):
    """`--set awt.description_file=PATH` without n_descriptions ran the class prompt alone and said nothing (a
    missing file too)."""
    with pytest.raises(ValueError) as info:
        shiftlab.create_method("awt", tiny_model, ["goldfish", "hen"], description_file=str(tmp_path / "d.json"))
    assert str(info.value).startswith("awt.description_file is set but awt.n_descriptions is 0: the file would not "
                                      "be read; set awt's n_descriptions=50") and "\n" not in str(info.value)


# -- golden checks: their evaluate.py ---------------------------------------------------------------------------

def stand_in_descriptions(classnames: list[str]) -> dict[str, list[str]]:
    """The driver's stand-in file (tests/fixtures/golden/awt/driver.py): class c -> 'a photo of a <class c+1+i>'."""
    n = len(classnames)
    return {c: [f"a photo of a {classnames[(k + 1 + i) % n]}" for i in range(3)] for k, c in enumerate(classnames)}


@pytest.mark.golden
def test_every_golden_key(golden_model, golden_dir, tmp_path):
    expected = torch.load(FIXTURES / "awt" / "awt.pt", weights_only=True)
    model, names = golden_model
    heads = ClassHeads(model, names)
    path = tmp_path / "imagenet_r.json"
    path.write_text(json.dumps(stand_in_descriptions(names)))
    method = shiftlab.create_method("awt", model, names, heads=heads, description_file=str(path), n_descriptions=3,
                                    template="a rendition photo of a {}")
    assert_close(method.prompt_features, expected["text_features"], FEATURES, "text_features")
    inputs = torch.load(golden_dir / "inputs.pt", weights_only=True)["views_unit"]
    for i in range(len(inputs)):
        ctx = SampleContext(model, heads, model.normalize(inputs[i]))
        assert_close(ctx.image_features, expected["features"][i], FEATURES, f"{i}/features")
        logits = model.logit_scale * ctx.image_features @ method.prompt_features.reshape(-1, 32).T
        image_w, text_w = entropy_weights(logits.view(32, 200, 4).transpose(1, 2), 0.5, 0.5)
        assert_close(image_w, expected[f"{i}/image_weights"], FEATURES, f"{i}/image_weights")
        assert_close(text_w, expected[f"{i}/text_weights"], FEATURES, f"{i}/text_weights")
        assert_close(method.predict_context(ctx).logits, expected[f"{i}/logits"], LOGITS, f"{i}/logits")
