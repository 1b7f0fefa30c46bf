"""ZERO (Farina et al. 2025, "Frustratingly Easy Test-Time Adaptation of VLMs"), training-free."""
from __future__ import annotations

from dataclasses import dataclass

from ...params import param
from ..catalogue.declarations import EPISODIC, FROZEN_FEATURES, Capabilities, MethodSpec, ViewMethodConfig

VOTE_RULES = ("soft", "authors")


@dataclass
class ZeroConfig(ViewMethodConfig):
    keep_ratio: float = param(0.3, gt=0, le=1)   # share of views (lowest entropy) that vote; at least one
    # "soft": ties in votes go to the higher mean kept probability (shiftlab's choice: scores are
    # probabilities, top-5 is ordered). "authors": FarinaMatteo/zero's decision, their entropy
    # arithmetic and greedy tie-break included (`zero_vote_authors`).
    vote_rule: str = param("soft", choices=VOTE_RULES)


class ZeroSpec(MethodSpec):
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
