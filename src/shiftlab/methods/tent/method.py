"""TENT on CLIP (Wang et al., ICLR 2021), as CLIPTTA's toolkit runs it (github.com/MarcLafon/cliptta at f4221f4,
`ttavlm/methods/tent.py` on `abstract_model.py`), for every batch of test images:

1. view 0 of each image through the adapted image tower (`common.norm_adaptation.NormTower`: the affine
   parameters of its normalisation layers adapt, BatchNorm normalises with the batch's statistics), unit
   features against the class head, logits = scale x cosine;
2. loss = mean over the batch of each image's prediction entropy, minus `mean_entropy_weight` x the
   entropy of the batch's mean prediction (their beta_reg, 0 in their TENT scripts);
3. one optimiser step (Adam, lr 1e-3 by default); steps 1-3 `steps` times (10 in their scripts);
4. the batch's logits through the tower as the last step left it (`predict_after_update`).

The state (the adapted parameters and the optimiser's moments) is carried from batch to batch (continual,
their default) and reset before every batch with `episodic`. README.md lists what differs from the authors'.
"""
from __future__ import annotations

from typing import Any

import torch

from ..common.confidence import entropy
from ..common.norm_adaptation import NormTTAMethod, mean_prediction_entropy
from .spec import TentSpec


def tent_loss(logits: torch.Tensor, mean_entropy_weight: float) -> torch.Tensor:
    """(B, C) -> the mean of the per-image entropies minus `mean_entropy_weight` x the mean prediction's entropy."""
    loss = entropy(logits).mean(0)
    if mean_entropy_weight:
        loss = loss - mean_entropy_weight * mean_prediction_entropy(logits)
    return loss


class Tent(NormTTAMethod):
    """TENT: entropy minimisation on each batch, through the image tower's normalisation parameters."""
    spec = TentSpec

    def adapt(self, pixels: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        return self.adapt_on_loss(pixels, lambda logits: tent_loss(logits, self.config.mean_entropy_weight))
