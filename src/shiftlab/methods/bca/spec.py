"""BCA (CVPR 2025, "Bayesian Test-Time Adaptation for Vision-Language Models") as TTABC runs it
(walawalagoose/TTABC `ttabc/model_selection/bca.py`; the authors' repository, buerzlh/Bayesian-Test-Time-Adaptation-
for-Vision-Language-Models, could not be fetched here): training-free, online; class centres (the likelihood) and
a cluster-to-class matrix (the prior) updated from confident samples."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import FROZEN_FEATURES, ONLINE, Capabilities, MethodSpec, ViewMethodConfig


@dataclass
class BCAConfig(ViewMethodConfig):
    """TTABC's "bca" entry (ttabc/configs/algorithms.py@999b436: tpt True, batch_size 64 = the views)."""
    selection_ratio: float = param(0.1, gt=0, le=1)     # "bca" selection_p 0.1 (int(64 x 0.1) = 6 views)
    center_threshold: float = param(0.05, ge=0, le=1)   # "bca" threshold1: a class centre moves above it
    center_count: int = param(20000, ge=0)              # "bca" init_count1: each centre's initial weight
    prior_threshold: float = param(0.65, ge=0, le=1)    # "bca" threshold2: a class's prior row moves above it
    prior_count: int = param(1, ge=0)                   # "bca" init_count2: each prior row's initial weight


class BCASpec(MethodSpec):
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=ONLINE)
    # thresholds every sample passes on the tiny CLIP, and a light centre weight, so that the state moves
    test_config = {"center_threshold": 0.0, "prior_threshold": 0.0, "center_count": 2}
