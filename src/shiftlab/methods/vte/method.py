"""VTE (Döbler et al. 2024), training-free: the ensemble in image space (the mean feature of the most confident
views) read by the ensemble in text space (the 80-template class head).

Per sample: the views' logits against the class head; the int(N * selection_ratio) (at least one) lowest-entropy
views; the mean of their (unit-norm) features, not re-normalised; logits = logit scale x that mean against the
class head.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..base import MethodOutput
from ..common.confidence import select_confident
from ..context import SampleContext
from ..head_kinds import text_head
from ..kinds import EpisodicMethod
from .spec import VTESpec


@dataclass
class VTEResult:
    logits: torch.Tensor        # (..., C)
    selected: torch.Tensor      # (..., k) the views averaged, lowest entropy first
    mean_feature: torch.Tensor  # (..., D) their mean feature (norm <= 1)


def vte(image_features: torch.Tensor, head: torch.Tensor, scale: float, selection_ratio: float) -> VTEResult:
    """(..., N, D) unit-norm view features, (C, D) class head -> VTE's logits and what it averaged."""
    feats = image_features.float()
    head = head.float()
    selected = select_confident(scale * feats @ head.T, selection_ratio)
    chosen = torch.gather(feats, -2, selected.unsqueeze(-1).expand(*selected.shape, feats.shape[-1]))
    mean = chosen.mean(-2)
    return VTEResult(scale * mean @ head.T, selected, mean)


class VTE(EpisodicMethod):
    """VTE: the mean feature of the 10% lowest-entropy views against the prompt-ensemble head."""
    spec = VTESpec

    def prepare(self) -> None:
        _ = text_head(self)

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        res = vte(ctx.image_features, text_head(self), self.model.logit_scale, self.config.selection_ratio)
        return MethodOutput(res.logits, extras={"selected": res.selected.tolist(),
                                                "mean_feature_norm": float(res.mean_feature.norm())})
