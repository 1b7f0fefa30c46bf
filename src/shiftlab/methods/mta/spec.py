"""MTA: MeanShift for Test-time Augmentation (Zanella & Ben Ayed, CVPR 2024), training-free."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ...params import param
from ..catalogue.declarations import EPISODIC, FROZEN_FEATURES, Capabilities, MethodSpec, ViewMethodConfig


@dataclass
class MTAConfig(ViewMethodConfig):
    lambda_y: float = param(0.2, gt=0)           # temperature of the inlierness softmax
    lambda_q: float = param(4.0, ge=0)           # weight of the prediction-affinity term
    outer_iterations: int = param(5, ge=1)       # always run in full (the authors have no convergence test)
    inner_iterations: int = param(5, ge=1)       # at most, for each of the inlierness and mode loops
    tol: float = param(1e-6, ge=0)               # L2 change that ends an inner loop early
    neighbour_ratio: float = param(0.3, gt=0, le=1)   # k = int(ratio * (N - 1)) neighbours set a view's bandwidth
    temperature: float = param(1.0, gt=0)        # of the softmax behind the affinity matrix


class MTASpec(MethodSpec):
    capabilities = Capabilities(reads=(FROZEN_FEATURES,), state=EPISODIC)
    min_views_why = "each view's bandwidth needs k = int(neighbour_ratio * (N - 1)) >= 1 nearest neighbours"
    @classmethod
    def needed_views(cls, config: Any) -> int:
        """The smallest N with int(neighbour_ratio * (N - 1)) >= 1 (5 for the default ratio 0.3)."""
        n = 1 + math.ceil(1 / config.neighbour_ratio)
        while n > 2 and int(config.neighbour_ratio * (n - 2)) >= 1:   # float rounding of 1 / ratio
            n -= 1
        while int(config.neighbour_ratio * (n - 1)) < 1:
            n += 1
        return n
