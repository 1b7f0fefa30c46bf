"""Square's config and spec (no torch): `--attack square`, L-inf only in shiftlab (the original also has an
L2 version; `--eps-l2` is refused here). Defaults: AutoAttack's standard version (fra31/auto-attack at
a392200, autoattack.py)."""
from __future__ import annotations

import dataclasses

from ...params import param
from ..budgets import LABEL_FORMAT, LinfBudgetConfig
from ..specs import AttackSpec


@dataclasses.dataclass
class SquareConfig(LinfBudgetConfig):
    queries: int = param(5000, ge=0)           # square.n_queries = 5000, autoattack.py:316
    p_init: float = param(0.8, gt=0, le=1)     # p_init=.8, autoattack.py:42: the first square's share of the image


class SquareSpec(AttackSpec):
    name = "square"
    impl = "shiftlab.attacks.square.attack:Square"
    config_class = SquareConfig
    summary = "Square: a score-based random search of squares at the budget's corners (no gradient), L-inf"
    label_format = LABEL_FORMAT
    details_format = "queries={queries}"
