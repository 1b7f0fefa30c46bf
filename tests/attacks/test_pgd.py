"""R-TPT's attack pipeline against the authors' own code (TomSheng21/R-TPT `rtpt.py`,
tests/fixtures/golden/online/rtpt_attack.pt): PGD on the base view, the 8-bit conversion,
and the views rebuilt from the adversarial image.

The fixture ran 4 samples of the stream with eps 1/255, alpha eps/4, 7 steps, 32 views; the
driver seeded the random start with torch.manual_seed(1000 + i), so shiftlab can draw the
same start. Tolerances (tests/_golden.py): the 8-bit conversion and view 0 exactly (integer
pipelines, and a truncation of the fixture's own floats); PGD's float result to PIXELS on at
least 99% of the pixels (a gradient component near 0 can take the other sign in another
implementation and move that pixel by 2 alpha); the attack's context PARAMS; logits LOGITS.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import shiftlab
from _golden import LOGITS, PARAMS, PIXELS, assert_close, online_fixture
from shiftlab.attacks import ZeroShotClassifier, eps_255, pgd_linf, quantize
from shiftlab.models.text import ContextPrompt
from shiftlab.views.generator import base_view, to_uint8_tensor

pytestmark = [pytest.mark.golden, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def attack_golden(golden_dir, golden_model):
    model, classnames = golden_model
    want, info = online_fixture(golden_dir, "rtpt_attack")
    stream = torch.load(golden_dir / "online" / "stream.pt", weights_only=True)
    return model, classnames, want, info, stream


def _pil(u8: torch.Tensor) -> Image.Image:
    return Image.fromarray(u8.permute(1, 2, 0).numpy(), "RGB")


def test_base_view_conversion_and_rebuilt_view_match_the_authors(attack_golden):
    model, _, want, info, stream = attack_golden
    eps = info["eps"] / 255
    for i in range(info["n_samples"]):
        clean_u8 = to_uint8_tensor(base_view(_pil(stream["base_u8"][i]), model.image_size))
        assert torch.equal(clean_u8.float() / 255, want[f"{i}/clean"]), f"sample {i}: base view"
        # the authors' ToPILImage truncates; shiftlab's quantize(mode="truncate") must agree
        adv_u8 = quantize(want[f"{i}/adv_float"], clean_u8, eps, "truncate")
        assert torch.equal(adv_u8, want[f"{i}/adv_u8"]), f"sample {i}: 8-bit conversion"
        assert int((adv_u8.to(torch.int16) - clean_u8.to(torch.int16)).abs().max()) <= eps_255(eps)
        # the views are rebuilt from the adversarial image: view 0 is its base view
        assert torch.equal(to_uint8_tensor(base_view(_pil(adv_u8), model.image_size)), want[f"{i}/views_u8"][0])
        assert not torch.equal(want[f"{i}/views_u8"][0], clean_u8)


def test_pgd_matches_the_authors_attack_on_the_first_sample(attack_golden):
    model, classnames, want, info, _ = attack_golden
    heads = shiftlab.ClassHeads(model, classnames)
    classifier = ZeroShotClassifier(model, heads.zeroshot, model.logit_scale)
    eps = info["eps"] / 255
    x = want["0/clean"].unsqueeze(0)
    torch.manual_seed(info["seed0"] + 0)
    got = pgd_linf(classifier, x, want["labels"][:1], eps=eps, alpha=info["alpha"] / 255, steps=info["steps"])[0]
    close = (got - want["0/adv_float"]).abs() <= PIXELS
    assert float(close.float().mean()) >= 0.99, f"only {float(close.float().mean()):.4f} of the pixels agree"
    assert float((got - want["0/adv_float"]).abs().max()) <= 2 * info["alpha"] / 255 + PIXELS
    print("PGD: share of pixels within PIXELS:", float(close.float().mean()))


def test_the_authors_attack_a_prompt_carried_over_from_the_previous_sample(attack_golden):
    """A documented difference (docs/ROBUSTNESS.md): rtpt.py attacks before it resets the prompt,
    so sample i >= 1 is attacked through the prompt R-TPT tuned on sample i - 1; shiftlab attacks
    every sample through the initial prompt."""
    model, classnames, want, info, _ = attack_golden
    init = ContextPrompt(model, classnames[:1]).ctx.detach()
    assert_close(want["0/attack_ctx"], init, PARAMS, "attack context")
    for i in range(1, info["n_samples"]):
        assert float((want[f"{i}/attack_ctx"] - init).abs().max()) > 1e-3


def test_zero_shot_logits_of_the_adversarial_base_view(attack_golden):
    model, classnames, want, info, _ = attack_golden
    zeroshot = shiftlab.create_method("zeroshot", model, classnames)
    for i in range(info["n_samples"]):
        views = model.normalize(want[f"{i}/views_u8"][:1].float() / 255)
        assert_close(zeroshot.predict(views), want[f"{i}/clip_logits"], LOGITS, f"sample {i}: logits")


def test_truncation_without_the_ball_clip_is_torchvisions_to_pil_image():
    """The authors convert with transforms.ToPILImage() (float * 255, truncated to uint8) and do not
    clip to the eps-ball; quantize(mode="truncate", clip_to_ball=False) must be the same map."""
    import torchvision.transforms as T
    g = torch.Generator().manual_seed(0)
    clean_u8 = torch.randint(2, 254, (3, 16, 16), generator=g, dtype=torch.uint8)
    eps = 1 / 255
    delta = (torch.rand(3, 16, 16, generator=g) * 2 - 1) * eps
    delta[0, 0, :8] = -eps                                   # pixels exactly at the ball's edge
    x = (clean_u8.float() / 255 + delta).clamp(0, 1)
    x[0, 1, 0] = (float(clean_u8[0, 1, 0]) - 1) / 255 - 1e-7   # float rounding below clean - 1 level
    authors = torch.from_numpy(np.array(T.ToPILImage()(x))).permute(2, 0, 1)
    assert torch.equal(quantize(x, clean_u8, eps, "truncate", clip_to_ball=False), authors)
    clipped = quantize(x, clean_u8, eps, "truncate")
    assert int(authors[0, 1, 0]) == int(clean_u8[0, 1, 0]) - 2 and int(clipped[0, 1, 0]) == int(clean_u8[0, 1, 0]) - 1
    assert int((clipped.to(torch.int16) - clean_u8.to(torch.int16)).abs().max()) <= 1
