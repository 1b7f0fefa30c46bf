"""The image tower with its gradient: what a method's differentiable prediction (`--attack-target adaptive`) encodes
its views with, as the engine encodes them (`ClipModel.encode_views`) but without inference mode."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..base import Method


def encode_views01(method: Method, views01: torch.Tensor) -> torch.Tensor:
    """Views in [0, 1], (B, N, 3, S, S) -> (B, N, D) unit float32 features, differentiable in the pixels, through the
    frozen image tower under the method's precision."""
    b, n = views01.shape[:2]
    model = method.model
    with method.precision.autocast():
        feats = model.encode_normalized(model.normalize(views01.flatten(0, 1)))
    return feats.float().reshape(b, n, -1)
