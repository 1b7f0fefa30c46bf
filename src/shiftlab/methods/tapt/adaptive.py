"""TAPT as a differentiable function of its attacked views (`--attack-target adaptive`, mode full+bpda+eot): the
family's unrolled AdamW steps of the deep visual prompts, second order through the image tower
(methods/common/token_alignment_adaptive.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..common.prompt_tuning_adaptive import adamw_step
from ..common.token_alignment_adaptive import token_alignment_logits

if TYPE_CHECKING:
    from .method import TAPT


def tapt_logits(method: TAPT, views01: torch.Tensor) -> torch.Tensor:
    """views01 (B, N, 3, S, S) in [0, 1] -> logits (B, C)."""
    return token_alignment_logits(method, views01, adamw_step)
