"""N-TPT, as TTABC runs it (walawalagoose/TTABC `ttabc/model_selection/ntpt.py`, the only code found): TPT plus a
penalty pulling the class text features' pairwise cosines to the regular simplex's 1 / (1 - K)."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..common.prompt_tuning_config import PromptTuningConfig, PromptTuningSpec


@dataclass
class NTPTConfig(PromptTuningConfig):
    # TTABC ttabc/configs/algorithms.py@abb828a "ntpt": lambda_term 10.0 (lr 5e-3, 1 step, selection 0.1, 4 context
    # tokens from "a photo of a", 64 views: the TPT defaults)
    lambda_simplex: float = param(10.0, ge=0)


class NTPTSpec(PromptTuningSpec):
    """N-TPT: TPT's spec, with the simplex penalty's weight (`NTPTConfig`)."""
