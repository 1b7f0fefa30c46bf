"""APGD-T's config and spec (no torch): `--attack apgd_t`. Defaults are AutoAttack's standard version
(fra31/auto-attack at a392200, autoattack.py)."""
from __future__ import annotations

import dataclasses

from ...params import param
from ..budgets import LABEL_FORMAT, BudgetConfig
from ..specs import AttackSpec


@dataclasses.dataclass
class APGDTConfig(BudgetConfig):
    steps: int = param(100, ge=0)              # n_iter=100, autoattack.py:46
    restarts: int = param(1, ge=1)             # n_restarts=1 per target class, autoattack.py:46
    targets: int = param(9, ge=1)              # the standard version's n_target_classes = 9, autoattack.py:310
    rho: float = param(0.75, gt=0, le=1)       # rho=.75, autoattack.py:47


class APGDTSpec(AttackSpec):
    name = "apgd_t"
    impl = "shiftlab.attacks.apgd_t.attack:APGDT"
    config_class = APGDTConfig
    summary = "APGD on the targeted DLR loss, one run per likely class (AutoAttack's second attack), L-inf or L2"
    label_format = LABEL_FORMAT
    details_format = "steps={steps} targets={targets}"
