"""Training-free baselines: CLIP zero-shot, the 80-template prompt ensemble, the view ensemble."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..params import param
from .base import Method, MethodOutput, ViewMethodConfig, register_method
from .context import SampleContext


@register_method("zeroshot")
class ZeroShot(Method):
    """CLIP zero-shot: "a photo of a {name}." on view 0."""
    needs_views = False
    summary = "CLIP zero-shot, 'a photo of a {name}.', view 0"

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        return MethodOutput(ctx.zeroshot_logits)


@register_method("prompt_ensemble")
class PromptEnsemble(Method):
    """CLIP's 80 ImageNet templates averaged per class (normalised mean of normalised embeddings), view 0."""
    needs_views = False
    summary = "CLIP's 80-template prompt ensemble, view 0"
    fixed_text_head = "ensemble"

    def prepare(self) -> None:
        _ = self.heads.ensemble

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        return MethodOutput(self.model.logit_scale * ctx.base_feature @ self.heads.ensemble.T)


@dataclass
class ViewEnsembleConfig(ViewMethodConfig):
    average: str = param("probs", choices=("probs", "logits"))  # mean of softmax over views, or of logits


@register_method("view_ensemble")
class ViewEnsemble(Method):
    """Zero-shot predictions of all views averaged with equal weights (the R-TPT table's "Ensemble")."""
    config_class = ViewEnsembleConfig
    summary = "zero-shot over all views, equal-weight average of probabilities (or logits)"

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        view_logits = ctx.zeroshot_view_logits
        if self.config.average == "logits":
            return MethodOutput(view_logits.mean(0))
        # log of the mean probability: its softmax is exactly the averaged distribution
        log_mean = torch.logsumexp(view_logits.log_softmax(-1), dim=0) - math.log(view_logits.shape[0])
        return MethodOutput(log_mean)
