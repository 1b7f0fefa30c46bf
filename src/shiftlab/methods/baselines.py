"""Training-free baselines: CLIP zero-shot, the 80-template prompt ensemble, the view ensemble."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..params import param
from .base import Method, MethodOutput, ViewMethodConfig, register_method
from .context import SampleContext
from .facts import C_TPT_TABLE, R_TPT_TABLE, TPT_README


@register_method("zeroshot")
class ZeroShot(Method):
    """CLIP zero-shot: "a photo of a {name}." on view 0."""
    needs_views = False
    summary = "CLIP zero-shot, 'a photo of a {name}.', view 0"
    label = "CLIP zero-shot"
    aliases = ("clip", "clip zero-shot", "zs")
    protocols = {}     # no code of its own: `paper` runs it as `leaderboard`
    published = (
        dict(dataset="imagenet-r", backbone="RN50", protocol="leaderboard", metric="top1", value=56.1,
             source=R_TPT_TABLE),
        dict(dataset="imagenet-r", backbone="RN50", protocol="paper", metric="top1", value=56.15, source=TPT_README),
        dict(dataset="imagenet-r", backbone="RN50", protocol="paper", metric="top1", value=56.0, source=C_TPT_TABLE),
        dict(dataset="imagenet-r", backbone="RN50", protocol="paper", metric="ece20", value=2.07, source=C_TPT_TABLE),
    )
    fidelity = "golden"

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        return MethodOutput(ctx.zeroshot_logits)


@register_method("prompt_ensemble")
class PromptEnsemble(Method):
    """CLIP's 80 ImageNet templates averaged per class (normalised mean of normalised embeddings), view 0."""
    needs_views = False
    summary = "CLIP's 80-template prompt ensemble, view 0"
    text_head = "ensemble"
    label = "Prompt ensemble (80 templates)"
    aliases = ("ensemble80",)
    protocols = {}     # as `leaderboard`
    published = (
        # the README's "Ensembled prompt" row
        dict(dataset="imagenet-r", backbone="RN50", protocol="paper", metric="top1", value=60.72, source=TPT_README),
    )
    fidelity = "head golden (TDA's text features)"

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
    label = "Ensemble (64 views)"
    aliases = ("ensemble",)
    protocols = {}     # as `leaderboard`
    published = (
        # the R-TPT table's "Ensemble" row (its 60.72 beside it is the prompt ensemble's, a method of its own)
        dict(dataset="imagenet-r", backbone="RN50", protocol="leaderboard", metric="top1", value=51.3,
             source=R_TPT_TABLE),
    )
    fidelity = ""

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        view_logits = ctx.zeroshot_view_logits
        if self.config.average == "logits":
            return MethodOutput(view_logits.mean(0))
        # log of the mean probability: its softmax is exactly the averaged distribution
        log_mean = torch.logsumexp(view_logits.log_softmax(-1), dim=0) - math.log(view_logits.shape[0])
        return MethodOutput(log_mean)
