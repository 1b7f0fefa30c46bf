"""TTC as a differentiable function of the attacked image (`--attack-target adaptive`, mode bpda;
`fn(method, views01 (B, 1, 3, S, S) in [0, 1], sample_ids) -> logits (B, C)`).

BPDA (Athalye et al. 2018): the counterattack d(x) (sign steps, clipping and the tau test: zero gradient almost
everywhere) is computed on the forward pass exactly as the method computes it, from the random start the scoring
draws for the sample ((seed, sample id), `method.random_start`), and taken as a constant on the backward pass: the
gradient of the logits of x + d(x) through the image tower and the head, i.e. d(x + d(x))/dx replaced by the
identity. With the start known the defence is deterministic to the attacker, so no expectation over it is taken.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from .method import TTC


def ttc_logits(method: TTC, views01: torch.Tensor, sample_ids: Sequence[int] | None = None) -> torch.Tensor:
    x = views01[:, 0]
    ids = [0] * x.shape[0] if sample_ids is None else list(sample_ids)   # 0: what `predict` uses without an id
    with torch.enable_grad():
        delta = torch.cat([method.counterattack(x[i:i + 1].detach(), int(ids[i])).delta for i in range(x.shape[0])])
        feats = F.normalize(method.embed(x + delta.detach()), dim=-1)
    return method.model.logit_scale * feats @ method.head().float().T
