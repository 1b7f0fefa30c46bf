"""FAB-T's config and spec (no torch): `--attack fab_t`. Defaults are AutoAttack's standard version
(fra31/auto-attack at a392200: FABAttack_PT's constructor in fab_pt.py, and autoattack.py, which builds it
with n_iter=100 and sets n_restarts=1, n_target_classes=9 for the standard version)."""
from __future__ import annotations

import dataclasses

from ...params import param
from ..budgets import LABEL_FORMAT, BudgetConfig
from ..specs import AttackSpec


@dataclasses.dataclass
class FABTConfig(BudgetConfig):
    steps: int = param(100, ge=0)              # n_iter=100, autoattack.py:38 (fab_pt.py:40)
    restarts: int = param(1, ge=1)             # the standard version's fab.n_restarts = 1, autoattack.py:316
    targets: int = param(9, ge=1)              # the standard version's fab.n_target_classes = 9, autoattack.py:318
    alpha_max: float = param(0.1, ge=0, le=1)  # alpha_max=0.1, fab_pt.py:42: the clean image's step's most weight
    eta: float = param(1.05, ge=1, le=2)       # eta=1.05, fab_pt.py:43: overshoot past the linearised boundary
    beta: float = param(0.9, gt=0, le=1)       # beta=0.9, fab_pt.py:44: pull back to the clean image when adversarial


class FABTSpec(AttackSpec):
    name = "fab_t"
    impl = "shiftlab.attacks.fab_t.attack:FABT"
    config_class = FABTConfig
    summary = ("FAB-T: the minimal adversarial step toward each likely class's linearised boundary, kept if within "
               "the budget (AutoAttack's third attack), L-inf or L2")
    label_format = LABEL_FORMAT
    details_format = "steps={steps} targets={targets}"
