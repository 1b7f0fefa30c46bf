"""N-TPT as TTABC's `ttabc/model_selection/ntpt.py` computes it: TPT's loss plus lambda x the mean squared gap
between the class text features' pairwise cosines and 1 / (1 - K), the cosine between the K vertices of a regular
simplex centred at the origin (equal, maximal pairwise angles). The rest is TPT (methods/tpt).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..common.confidence import marginal_entropy
from ..common.prompt_tuning import PromptTuning
from ..kinds import EpisodicMethod
from .spec import NTPTSpec


def simplex_penalty(text_features: torch.Tensor) -> torch.Tensor:
    """TTABC's `cosine_similarity_loss`: (..., K, D) -> (...).

    The features normalised again, their cosine matrix with the diagonal set to 0, every entry minus 1 / (1 - K),
    squared, summed, divided by K (K - 1). The K diagonal entries each add (1 / (1 - K))^2 to the sum: a constant,
    1 / (K - 1)^3 in all, without gradient; it is kept, as theirs, so the values agree."""
    k = text_features.shape[-2]
    unit = F.normalize(text_features, dim=-1)
    cos = unit @ unit.transpose(-1, -2)
    cos = cos - torch.diag_embed(cos.diagonal(dim1=-2, dim2=-1))
    return ((cos - 1.0 / (1 - k)) ** 2).sum((-2, -1)) / (k * (k - 1))


class NTPT(PromptTuning, EpisodicMethod):
    """N-TPT: TPT's marginal entropy + lambda x the simplex penalty of the class features."""
    spec = NTPTSpec

    def loss(self, selected_logits: torch.Tensor, text_features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        entropy_loss = marginal_entropy(selected_logits)
        penalty = simplex_penalty(text_features)
        return entropy_loss + self.config.lambda_simplex * penalty, {"entropy_loss": entropy_loss,
                                                                     "simplex": penalty}

    def readout(self, image_features: torch.Tensor, text_features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        logits, _ = super().readout(image_features, text_features)
        return logits, {"simplex_after": simplex_penalty(text_features)}
