"""APGD-CE's config and spec (no torch): `--attack apgd_ce`. Defaults are AutoAttack's standard version
(fra31/auto-attack at a392200, autoattack.py)."""
from __future__ import annotations

import dataclasses

from ...params import param
from ..budgets import LABEL_FORMAT, BudgetConfig
from ..specs import AttackSpec


@dataclasses.dataclass
class APGDCEConfig(BudgetConfig):
    steps: int = param(100, ge=0)              # n_iter=100, autoattack.py:33
    restarts: int = param(1, ge=1)             # the standard version's apgd.n_restarts = 1, autoattack.py:309
    rho: float = param(0.75, gt=0, le=1)       # rho=.75, autoattack.py:34: the oscillation threshold


class APGDCESpec(AttackSpec):
    name = "apgd_ce"
    impl = "shiftlab.attacks.apgd_ce.attack:APGDCE"
    config_class = APGDCEConfig
    summary = "APGD on the cross-entropy (AutoAttack's first attack), L-inf or L2, against zero-shot CLIP by default"
    label_format = LABEL_FORMAT
    details_format = "steps={steps}"
    # attack_through: APGD-CE on a method's own prediction (`--attack-target adaptive`, attacks/adaptive.py), one
    # draw of its random views per call (APGD takes no EOT average here), a batch method's batch together
    adaptive = True
