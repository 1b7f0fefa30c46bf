"""The reference methods' predictions as differentiable functions of the attacked views (`--attack-target adaptive`;
`fn(method, views01 (B, N, 3, S, S) in [0, 1]) -> logits (B, C)`, shiftlab.attacks.adaptive)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from ..common.differentiable import encode_views01

if TYPE_CHECKING:
    from .method import PromptEnsemble, ViewEnsemble, ZeroShot


def zeroshot_logits(method: ZeroShot, views01: torch.Tensor) -> torch.Tensor:
    return method.model.logit_scale * encode_views01(method, views01[:, :1])[:, 0] @ method.heads.zeroshot.T


def prompt_ensemble_logits(method: PromptEnsemble, views01: torch.Tensor) -> torch.Tensor:
    return method.model.logit_scale * encode_views01(method, views01[:, :1])[:, 0] @ method.heads.ensemble.T


def view_ensemble_logits(method: ViewEnsemble, views01: torch.Tensor) -> torch.Tensor:
    view_logits = method.model.logit_scale * encode_views01(method, views01) @ method.heads.zeroshot.T   # (B, N, C)
    if method.config.average == "logits":
        return view_logits.mean(1)
    return torch.logsumexp(view_logits.log_softmax(-1), dim=1) - math.log(view_logits.shape[1])
