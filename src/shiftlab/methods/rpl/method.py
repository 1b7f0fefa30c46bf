"""RPL on CLIP, as mariodoebler/test-time-adaptation runs it (`classification/methods/rpl.py`, 8b2ed63, built on
oripress/CCC's `models/rpl.py`), for every batch of test images (view 0 of each, through the tower of
`common.norm_adaptation`: every normalisation layer's affine parameters adapt, BatchNorm with the batch's
statistics), `steps` times:

1. logits = scale x cosine; each image's pseudo-label = its argmax;
2. loss = the batch's mean generalised cross-entropy (1 - p_label ** q) / q (`generalized_cross_entropy`);
3. one optimiser step.

The batch's outputs are the logits of the last step's forward (before its update). README.md lists what differs
from the authors' code.
"""
from __future__ import annotations

from typing import Any

import torch

from ..common.norm_adaptation import NormTTAMethod
from .spec import RPLSpec


def generalized_cross_entropy(logits: torch.Tensor, q: float) -> torch.Tensor:
    """(B, C) -> (B,) (1 - p_y ** q) / q with y each row's argmax (losses.py:44-55: the pseudo-label's probability
    carries the gradient, the label itself none)."""
    probs = logits.softmax(-1)
    p_label = probs.gather(1, probs.argmax(-1, keepdim=True)).squeeze(1)
    return (1.0 - p_label ** q) / q


class RPL(NormTTAMethod):
    """RPL: self-learning with the generalised cross-entropy on hard pseudo-labels."""
    spec = RPLSpec

    def adapt(self, pixels: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        return self.adapt_on_loss(pixels, lambda logits: generalized_cross_entropy(logits, self.config.q).mean(0))
