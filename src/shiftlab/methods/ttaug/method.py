"""TTAug on CLIP, as mariodoebler/test-time-adaptation runs it (`classification/methods/ttaug.py`, 8b2ed63): an image's
views (the original and its AugMix views) through the image tower whose BatchNorm layers normalise with (1 - alpha)
x the source and alpha x the views' statistics (`common.norm_statistics.StatsTower`, their AlphaBatchNorm), logits =
scale x cosine to the class head, averaged over the views. Nothing is learnt, nothing is carried to the next image.
README.md lists what differs from the authors' code."""
from __future__ import annotations

from typing import Any

import torch

from ..base import MethodOutput
from ..common.norm_statistics import StatsTower, StatsTowerMethod
from ..context import SampleContext
from ..kinds import EpisodicMethod
from .spec import TTAugSpec


class TTAug(StatsTowerMethod, EpisodicMethod):
    """TTAug: the mean of the views' logits."""
    spec = TTAugSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.tower = StatsTower(self.model.clip, self.config.statistics, self.config.alpha)

    @torch.no_grad()
    def view_logits(self, views: torch.Tensor) -> torch.Tensor:
        """(V, 3, S, S) normalised views, one batch -> (V, C) logits."""
        return self.tower_logits(views)

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        views = self.recipe_views(ctx, "normalises its views with their own statistics and needs the image's pixels")
        return MethodOutput(self.view_logits(views).mean(0))
