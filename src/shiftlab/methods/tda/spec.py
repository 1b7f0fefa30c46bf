"""TDA (Karmanov et al., CVPR 2024, "Efficient Test-Time Adaptation of Vision-Language Models").

Its spec: config and capabilities, no torch (facts: card.toml; code: method.py)."""
from __future__ import annotations

from ..adaptive_modes import Adaptive
from ..catalogue.declarations import (
    FROZEN_FEATURES,
    ONLINE,
    Capabilities,
    MethodSpec,
)
from ..common.tda_cache_config import TDAConfig


class TDASpec(MethodSpec):
    name = "tda"
    impl = "shiftlab.methods.tda.method:TDA"
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=ONLINE)
    adaptive = Adaptive(("state", "bpda", "eot"),
                        "attacked against the state it holds when the sample arrives (state); the sample's own"
                        " cache write on a copy of the caches, the written feature differentiated; bpda: the"
                        " confident-view selection and which entry a write keeps; random crops drawn afresh (eot)",
                        impl="shiftlab.methods.tda.adaptive:tda_logits")
    config_class = TDAConfig
    supports_pure_fp16 = True   # --set tda.precision=fp16-pure: the authors' half model (on CUDA)
    # both caches fill on a short stream
    test_config = {"pos_capacity": 2, "neg_entropy_lower": 0.0, "neg_entropy_upper": 1.0}
