"""The reference methods (training-free): CLIP zero-shot, the 80-template prompt ensemble, the view ensemble.

Its spec: config and capabilities, no torch (facts: card.toml; code: method.py)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..adaptive_modes import Adaptive
from ..catalogue.declarations import (
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
    adaptive = Adaptive(("full",),
                        "the image tower and the zero-shot head on view 0 (nothing adapts)",
                        impl="shiftlab.methods.zeroshot.adaptive:zeroshot_logits")


class PromptEnsembleSpec(MethodSpec):
    name = "prompt_ensemble"
    impl = "shiftlab.methods.zeroshot.method:PromptEnsemble"
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
    adaptive = Adaptive(("full",),
                        "the image tower and the 80-template head on view 0 (nothing adapts)",
                        impl="shiftlab.methods.zeroshot.adaptive:prompt_ensemble_logits")
    text_head = "ensemble"


class ViewEnsembleSpec(MethodSpec):
    name = "view_ensemble"
    impl = "shiftlab.methods.zeroshot.method:ViewEnsemble"
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
    adaptive = Adaptive(("full", "eot"),
                        "the view-averaged zero-shot prediction, its random crops drawn afresh (eot)",
                        impl="shiftlab.methods.zeroshot.adaptive:view_ensemble_logits")
    config_class = ViewEnsembleConfig
