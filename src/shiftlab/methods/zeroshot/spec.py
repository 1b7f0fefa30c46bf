"""Training-free baselines: CLIP zero-shot, the 80-template prompt ensemble, the view ensemble.

Its spec: config, capabilities and facts, without torch (the code: method.py)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..facts import C_TPT_TABLE, R_TPT_TABLE, TPT_README
from ..specs import (
    EPISODIC,
    FROZEN_FEATURES,
    Capabilities,
    MethodSpec,
    ViewMethodConfig,
)


@dataclass
class ViewEnsembleConfig(ViewMethodConfig):
    average: str = param("probs", choices=("probs", "logits"))  # mean of softmax over views, or of logits


class ZeroShotSpec(MethodSpec):
    name = "zeroshot"
    impl = "shiftlab.methods.zeroshot.method:ZeroShot"
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
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


class PromptEnsembleSpec(MethodSpec):
    name = "prompt_ensemble"
    impl = "shiftlab.methods.zeroshot.method:PromptEnsemble"
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
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


class ViewEnsembleSpec(MethodSpec):
    name = "view_ensemble"
    impl = "shiftlab.methods.zeroshot.method:ViewEnsemble"
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
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
