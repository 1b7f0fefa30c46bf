"""The reference methods (training-free): CLIP zero-shot, the 80-template prompt ensemble, the view ensemble."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import EPISODIC, FROZEN_FEATURES, Capabilities, MethodSpec, ViewMethodConfig


@dataclass
class ViewEnsembleConfig(ViewMethodConfig):
    average: str = param("probs", choices=("probs", "logits"))  # mean of softmax over views, or of logits


class ZeroShotSpec(MethodSpec):
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)


class PromptEnsembleSpec(MethodSpec):
    name = "prompt_ensemble"
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
    text_head = "ensemble"


class ViewEnsembleSpec(MethodSpec):
    name = "view_ensemble"
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
