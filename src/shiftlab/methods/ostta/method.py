"""OSTTA on CLIP (Lee et al., ICCV 2023), as CLIPTTA's toolkit runs it (github.com/MarcLafon/cliptta at f4221f4,
`ttavlm/methods/ostta.py` on `abstract_model.py`), for every batch of test images (view 0 of each, through the
tower of `common.norm_adaptation`), `steps` times:

1. the source model (the tower with its initial normalisation parameters, never adapted: their `model0`) gives
   each image its prediction c0 and probability p0 = P0(c0) (ostta.py:37-41);
2. the adapted tower's probability p = P(c0) of the same class; the images with p - p0 >= margin are kept
   (ostta.py:43-50);
3. loss = tta_weight x the kept images' mean entropy (every image's when none is kept) - mean_entropy_weight x
   H(mean prediction) (ostta.py:49-60); one optimiser step.

Then the batch's logits through the adapted tower, and its own OOD score (`score` of the cosines at
`ood_logit_scale`, ostta.py:66-70) recorded with each image. README.md lists what differs from the authors'.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..common.confidence import entropy
from ..common.norm_adaptation import NormTower, mean_prediction_entropy
from ..common.ood_scores import OwnOODScoreMethod
from .spec import OSTTASpec


def wisdom_of_crowds_filter(probs: torch.Tensor, source_probs: torch.Tensor, margin: float) -> torch.Tensor:
    """(B, C) adapted and source probabilities -> (B,) bool: the adapted probability of the source's predicted
    class exceeds the source's own by at least `margin`."""
    p0, c0 = source_probs.max(-1)
    return probs.gather(-1, c0[:, None])[:, 0] - p0 >= margin


def ostta_loss(logits: torch.Tensor, kept: torch.Tensor, tta_weight: float,
               mean_entropy_weight: float) -> torch.Tensor:
    """(B, C) scaled logits, (B,) kept -> () tta_weight x mean entropy of the kept images (of all when none is)
    - mean_entropy_weight x the entropy of the batch's mean prediction."""
    h = entropy(logits)
    h = h[kept] if bool(kept.any()) else h
    return tta_weight * h.mean(0) - mean_entropy_weight * mean_prediction_entropy(logits)


class OSTTA(OwnOODScoreMethod):
    """OSTTA: entropy minimisation on the images the adapted model is surer of than the source model."""
    spec = OSTTASpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # their model0: a copy of the configured model (BatchNorm on batch statistics), never stepped
        self.source_tower = NormTower(self.model.clip)

    @torch.no_grad()
    def source_logits(self, pixels: torch.Tensor) -> torch.Tensor:
        if self.model.channels_last:
            pixels = pixels.contiguous(memory_format=torch.channels_last)
        with self.precision.autocast():
            features = self.source_tower(pixels)
        return self.scale * F.normalize(features.float(), dim=-1) @ self.head.T

    def adapt(self, pixels: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        cfg = self.config
        losses, kept = [], None
        for _ in range(cfg.steps):
            source = self.source_logits(pixels).softmax(-1)
            logits = self.logits(pixels)
            kept = wisdom_of_crowds_filter(logits.detach().softmax(-1), source, cfg.margin)
            loss = ostta_loss(logits, kept, cfg.tta_weight, cfg.mean_entropy_weight)
            losses.append(float(loss.detach()))
            self.step(loss)
        logits, scores = self.scored_logits(pixels)
        return logits, self.scored_extras(scores, losses, {"kept": [bool(k) for k in kept]})
