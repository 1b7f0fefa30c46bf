"""A-TPT (Ahamed et al., ICLR 2026): TPT's loss plus an angular-diversity term on the class text features of the
same forward pass: the mean over classes of the angle from each class feature to its nearest other class
(arccos of the largest cosine, clamped to [-tau, tau]), subtracted (`objective="maximize"`) or added
(`"minimize"`) with weight lambda. The rest is TPT (methods/tpt): the confident views, AdamW, view 0 read out.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..common.prompt_tuning import PenalisedPromptTuning
from ..kinds import EpisodicMethod
from .spec import ATPTSpec


def min_angles(text_features: torch.Tensor, tau: float) -> torch.Tensor:
    """Per class, the angle (radians) to its nearest other class: (..., C, D) -> (..., C).

    As the authors' code: the features normalised again, their Gram matrix with its diagonal flipped to -1
    (so a class is never its own nearest), the row maximum clamped to [-tau, tau] (no gradient beyond), arccos."""
    unit = F.normalize(text_features, p=2, dim=-1)
    gram = unit @ unit.transpose(-1, -2)
    gram = gram - 2.0 * torch.diag_embed(gram.diagonal(dim1=-2, dim2=-1))
    return torch.acos(gram.max(dim=-1).values.clamp(-tau, tau))


class ATPT(PenalisedPromptTuning, EpisodicMethod):
    """A-TPT: TPT's marginal entropy -/+ lambda x the mean nearest-class angle of the class features."""
    spec = ATPTSpec

    penalty_name = "min_angle"

    def penalty(self, text_features: torch.Tensor) -> torch.Tensor:
        return min_angles(text_features, self.config.tau).mean(-1)

    def penalty_weight(self) -> float:
        return (-1.0 if self.config.objective == "maximize" else 1.0) * self.config.lambda_angular
