"""TDA (Karmanov et al., CVPR 2024, "Efficient Test-Time Adaptation of Vision-Language Models")."""
from __future__ import annotations

from ..catalogue.declarations import FROZEN_FEATURES, ONLINE, Capabilities, MethodSpec
from ..common.tda_cache_config import TDAConfig


class TDASpec(MethodSpec):
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=ONLINE)
    config_class = TDAConfig
    supports_pure_fp16 = True   # --set tda.precision=fp16-pure: the authors' half model (on CUDA)
    # both caches fill on a short stream
    test_config = {"pos_capacity": 2, "neg_entropy_lower": 0.0, "neg_entropy_upper": 1.0}
