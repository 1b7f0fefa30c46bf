"""A-TPT (Ahamed et al., ICLR 2026): TPT's loss plus an angular-diversity term on the class text features of the
same forward pass: the mean over classes of the angle from each class feature to its nearest other class
(arccos of the largest cosine, clamped to [-tau, tau]), subtracted (`objective="maximize"`) or added
(`"minimize"`) with weight lambda. The rest is TPT (methods/tpt): the confident views, AdamW, view 0 read out.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..common.confidence import marginal_entropy
from ..common.prompt_tuning import PromptTuning
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


class ATPT(PromptTuning, EpisodicMethod):
    """A-TPT: TPT's marginal entropy -/+ lambda x the mean nearest-class angle of the class features."""
    spec = ATPTSpec

    def loss(self, selected_logits: torch.Tensor, text_features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        cfg = self.config
        entropy_loss = marginal_entropy(selected_logits)
        angle = min_angles(text_features, cfg.tau).mean(-1)
        sign = -1.0 if cfg.objective == "maximize" else 1.0
        return entropy_loss + sign * cfg.lambda_angular * angle, {"entropy_loss": entropy_loss, "min_angle": angle}

    def readout(self, image_features: torch.Tensor, text_features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        logits, _ = super().readout(image_features, text_features)
        return logits, {"min_angle_after": min_angles(text_features, self.config.tau).mean(-1)}
