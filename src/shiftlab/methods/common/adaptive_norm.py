"""The norm-adapting batch methods (TENT, SAR, EATA, DeYO) attacked against their state (`--attack-target adaptive`,
mode state): the batch's view 0 through the image tower with the norm parameters the method holds when the batch
arrives (BatchNorm with the batch's statistics, as its adaptation sees them), no step taken; the attacked batch then
adapts as a clean one would."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .norm_adaptation import NormTTAMethod


def norm_state_logits(method: NormTTAMethod, views01: torch.Tensor) -> torch.Tensor:
    """(B, N, 3, S, S) in [0, 1] -> (B, C): `NormTTAMethod.logits` of view 0, differentiable in the pixels."""
    with torch.enable_grad():
        return method.logits(method.model.normalize(views01[:, 0]))
