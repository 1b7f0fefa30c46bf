"""TENT (Wang, Shelhamer, Liu, Olshausen & Darrell, ICLR 2021, "Tent: Fully Test-Time Adaptation by Entropy
Minimization"), on CLIP as CLIPTTA's toolkit runs it."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import MethodSpec
from ..common.norm_config import NORM_TTA, NormTTAConfig


@dataclass
class TentConfig(NormTTAConfig):
    """CLIPTTA's TENT (`ttavlm/methods/tent.py`) with its scripts' settings
    (`ttavlm/scripts/closed_set/imagenet/tent.sh`); the shared fields in `common/norm_config.py`."""
    steps: int = param(10, ge=1)                     # --steps 10 (tent.sh:10)
    # weight of the batch's mean-prediction entropy, subtracted from the loss (their beta_reg: --beta_reg 0.0 in
    # tent.sh:9, 0.1 in configuration.py:186); TENT's own loss has none
    mean_entropy_weight: float = param(0.0, ge=0)
    # the batch's logits after the last update (CLIPTTA's tent.py:59-62); False: those of the last step's forward,
    # before its update, as DequanWang/tent's forward_and_adapt returns them (tent.py:48-58)
    predict_after_update: bool = True


class TentSpec(MethodSpec):
    capabilities = NORM_TTA
    # a small config for the registry-wide tests: one step
    test_config = {"steps": 1}
