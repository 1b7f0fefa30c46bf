"""TDA (Karmanov et al., CVPR 2024, "Efficient Test-Time Adaptation of Vision-Language Models").

A positive cache (per class, the lowest-entropy test features) and a negative cache
(features of moderately uncertain samples, with a mask of the classes they found
plausible), read out with the affinity function exp(-beta (1 - affinity)) and added to /
subtracted from the zero-shot logits. Online: see docs/ONLINE.md. The code, which BoostAdapter
builds on too: methods/common/tda_cache.py.
"""
from __future__ import annotations

from ..common.tda_cache import TDACacheMethod
from .spec import TDASpec


class TDA(TDACacheMethod):
    """TDA: the shared caches as they are (common/tda_cache.py)."""
    spec = TDASpec
