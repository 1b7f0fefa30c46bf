"""N-TPT, as TTABC runs it (walawalagoose/TTABC `ttabc/model_selection/ntpt.py`, the only code found): TPT plus a
penalty pulling the class text features' pairwise cosines to the regular simplex's 1 / (1 - K).

Its spec: config and capabilities, no torch (facts: card.toml; code: method.py)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..adaptive_modes import Adaptive
from ..catalogue.declarations import EPISODIC, FROZEN_FEATURES, Capabilities
from ..common.prompt_tuning_config import PromptTuningConfig, PromptTuningSpec


@dataclass
class NTPTConfig(PromptTuningConfig):
    # TTABC ttabc/configs/algorithms.py@abb828a "ntpt": lambda_term 10.0 (lr 5e-3, 1 step, selection 0.1, 4 context
    # tokens from "a photo of a", 64 views: the TPT defaults)
    lambda_simplex: float = param(10.0, ge=0)


class NTPTSpec(PromptTuningSpec):
    name = "ntpt"
    impl = "shiftlab.methods.ntpt.method:NTPT"
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
    adaptive = Adaptive(("full", "bpda", "eot"),
                        "the image tower, every AdamW step of the prompt (create_graph through the text"
                        " tower) and the readout with the simplex penalty in the loss; bpda: the"
                        " confident-view selection (its indices constant on the backward pass); random crops"
                        " drawn afresh (eot)",
                        impl="shiftlab.methods.common.prompt_tuning_adaptive:prompt_tuning_logits")
    config_class = NTPTConfig
