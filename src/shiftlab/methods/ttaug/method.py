"""TTAug on CLIP, as mariodoebler/test-time-adaptation runs it (`classification/methods/ttaug.py`, 8b2ed63): an image's
views (the original and its AugMix views) through the image tower whose BatchNorm layers normalise with (1 - alpha)
x the source and alpha x the views' statistics (`common.norm_statistics.StatsTower`, their AlphaBatchNorm), logits =
scale x cosine to the class head, averaged over the views. Nothing is learnt, nothing is carried to the next image.
README.md lists what differs from the authors' code."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..base import Method, MethodOutput
from ..common.norm_adaptation import BatchStatisticsError
from ..common.norm_statistics import StatsTower
from ..context import SampleContext
from .spec import TTAugSpec


class TTAug(Method):
    """TTAug: the mean of the views' logits."""
    spec = TTAugSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.tower = StatsTower(self.model.clip, self.config.statistics, self.config.alpha)

    @property
    def head(self) -> torch.Tensor:
        return self.heads.ensemble if self.config.text_head == "ensemble" else self.heads.zeroshot

    @property
    def scale(self) -> float:
        return self.config.logit_scale if self.config.logit_scale is not None else self.model.logit_scale

    @torch.no_grad()
    def view_logits(self, views: torch.Tensor) -> torch.Tensor:
        """(V, 3, S, S) normalised views, one batch -> (V, C) logits."""
        if self.model.channels_last:
            views = views.contiguous(memory_format=torch.channels_last)
        try:
            with self.precision.autocast():
                features = self.tower(views)
        except BatchStatisticsError as exc:
            raise ValueError(f"{self.name}: {self.model.name}: {exc}") from None
        return self.scale * F.normalize(features.float(), dim=-1) @ self.head.T

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        if ctx.views is None:
            raise ValueError(f"{self.name} normalises its views with their own statistics and needs the image's "
                             "pixels, not stored features")
        views = ctx.views[:self.view_recipe.n_views].to(self.model.device)
        return MethodOutput(self.view_logits(views).mean(0))
