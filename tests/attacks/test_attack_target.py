"""The model an attack differentiates is a parameter: any differentiable callable, images in [0, 1] ->
logits (`build_attack(..., target=)`); zero-shot CLIP with the initial prompt by default (transfer)."""
from __future__ import annotations

import pytest
import torch

from shiftlab.attacks import attack_seed, build_attack, pgd_linf, quantize
from shiftlab.engine.step import Evaluator
from shiftlab.synthetic import random_image
from shiftlab.views.generator import ViewConfig, ViewGenerator

pytestmark = pytest.mark.usefixtures("one_thread")


def test_an_attack_differentiates_the_target_it_is_given_not_zero_shot(golden_model):
    model, classnames = golden_model   # session-scoped: no model of its own to build
    evaluator = Evaluator(model, classnames[:4], ["zeroshot"])
    head = evaluator.heads.zeroshot
    gen = ViewGenerator(ViewConfig(n_views=2, size=64), seed=3)
    views = gen(random_image((64, 64), seed=1), 7)
    calls = []

    def shuffled(x01):   # a plain function (no nn.Module): zero-shot logits with classes 0 and 1 swapped
        calls.append(x01.shape)
        logits = model.logit_scale * model.encode_pixels(x01).float() @ head.T
        return logits[:, [1, 0, 2, 3]]

    spec = {"name": "pgd", "eps": 4 / 255, "steps": 2, "random_start": False}
    default = build_attack(spec, model, head).attack_image(views[0], 0, 7, 3)
    through = build_attack(spec, model, head, target=shuffled).attack_image(views[0], 0, 7, 3)
    assert calls, "the target was never called"
    x = views[0].float().div(255).unsqueeze(0)
    torch.manual_seed(attack_seed(3, 7))
    want = pgd_linf(shuffled, x, torch.tensor([0]), eps=4 / 255, alpha=1 / 255, steps=2, random_start=False)
    assert torch.equal(through, quantize(want[0], views[0], 4 / 255))
    assert not torch.equal(through, default)   # another model, another gradient
