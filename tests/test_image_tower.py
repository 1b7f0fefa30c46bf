"""The image tower's execution choices change no prediction: they are for speed only.

Convolutional towers run in channels_last; the features must equal those of the same weights in
the default (contiguous) layout. Tolerance for float32: features within 1e-5 (measured ~4e-8 on
RN50: logits at scale 100 within 4.3e-6, benchmarks/image_tower_ab.py), identical top-1.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import shiftlab


def _plain_features(model: shiftlab.ClipModel, x: torch.Tensor) -> torch.Tensor:
    visual = copy.deepcopy(model.clip.visual).to(memory_format=torch.contiguous_format)
    assert all(p.is_contiguous() for p in visual.parameters())
    with torch.no_grad():
        return F.normalize(visual(x.contiguous()), dim=-1)


def _check_same_features(model: shiftlab.ClipModel, n: int) -> None:
    torch.manual_seed(0)
    size = model.image_size
    x = model.normalize(torch.rand(n, 3, size, size))
    assert model.channels_last
    conv = next(m for m in model.clip.visual.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        ours = model.encode_normalized(x)
    plain = _plain_features(model, x)
    torch.testing.assert_close(ours, plain, rtol=0, atol=1e-5)
    head = F.normalize(torch.randn(200, ours.shape[-1], generator=torch.Generator().manual_seed(1)), dim=-1)
    assert torch.equal((ours @ head.T).argmax(-1), (plain @ head.T).argmax(-1))


def test_channels_last_tower_gives_the_plain_features_tiny(tiny_model):
    _check_same_features(tiny_model, 8)


def test_channels_last_tower_keeps_gradients_for_attacks(tiny_model):
    x = tiny_model.normalize(torch.rand(2, 3, tiny_model.image_size, tiny_model.image_size)).requires_grad_(True)
    tiny_model.encode_normalized(x).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


@pytest.mark.slow
def test_channels_last_tower_gives_the_plain_features_rn50():
    model = shiftlab.load_model("RN50-quickgelu", None)
    _check_same_features(model, 4)

