"""N-TPT as TTABC's `ttabc/model_selection/ntpt.py` computes it: TPT's loss plus lambda x the mean squared gap
between the class text features' pairwise cosines and 1 / (1 - K), the cosine between the K vertices of a regular
simplex centred at the origin (equal, maximal pairwise angles). The rest is TPT (methods/tpt).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..common.prompt_tuning import PenalisedPromptTuning
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


class NTPT(PenalisedPromptTuning, EpisodicMethod):
    """N-TPT: TPT's marginal entropy + lambda x the simplex penalty of the class features."""
    spec = NTPTSpec

    penalty_name = "simplex"

    def penalty(self, text_features: torch.Tensor) -> torch.Tensor:
        return simplex_penalty(text_features)

    def penalty_weight(self) -> float:
        return self.config.lambda_simplex
