"""MTA as a differentiable function of the attacked views (`--attack-target adaptive`, mode full+bpda+eot).

`MTA.solve` itself, on view features that carry the pixels' gradient: the bandwidths (a sort, whose values are
differentiable), every inlierness and mean-shift iteration. BPDA: each inner loop's early stop (a comparison of how
far a step moved) is taken on the forward pass and is constant on the backward pass."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..common.differentiable import encode_views01

if TYPE_CHECKING:
    from .method import MTA


def mta_logits(method: MTA, views01: torch.Tensor) -> torch.Tensor:
    feats = encode_views01(method, views01)                                      # (B, N, D)
    view_logits = method.model.logit_scale * feats @ method.heads.zeroshot.T
    return torch.stack([method.solve(f, v, method.heads.zeroshot).logits for f, v in zip(feats, view_logits)])
