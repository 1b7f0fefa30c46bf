"""The reference methods (training-free): CLIP zero-shot, the 80-template prompt ensemble, the view ensemble."""
from __future__ import annotations

import math

import torch

from ..base import MethodOutput
from ..context import SampleContext
from ..kinds import EpisodicMethod
from .spec import PromptEnsembleSpec, ViewEnsembleSpec, ZeroShotSpec


class ZeroShot(EpisodicMethod):
    """CLIP zero-shot: "a photo of a {name}." on view 0."""
    spec = ZeroShotSpec

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        return MethodOutput(ctx.zeroshot_logits)


class PromptEnsemble(EpisodicMethod):
    """CLIP's 80 ImageNet templates averaged per class (normalised mean of normalised embeddings), view 0."""
    spec = PromptEnsembleSpec

    def prepare(self) -> None:
        _ = self.heads.ensemble

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        return MethodOutput(self.model.logit_scale * ctx.base_feature @ self.heads.ensemble.T)


class ViewEnsemble(EpisodicMethod):
    """Zero-shot predictions of all views averaged with equal weights (the R-TPT table's "Ensemble")."""
    spec = ViewEnsembleSpec

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        view_logits = ctx.zeroshot_view_logits
        if self.config.average == "logits":
            return MethodOutput(view_logits.mean(0))
        # log of the mean probability: its softmax is exactly the averaged distribution
        log_mean = torch.logsumexp(view_logits.log_softmax(-1), dim=0) - math.log(view_logits.shape[0])
        return MethodOutput(log_mean)
