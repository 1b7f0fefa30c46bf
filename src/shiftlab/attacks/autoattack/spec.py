"""AutoAttack's config and spec (no torch): `--attack autoattack`, the ensemble. Defaults are the original's
standard version (fra31/auto-attack at a392200, autoattack.py `set_version('standard')`)."""
from __future__ import annotations

import dataclasses

from ...params import param
from ..budgets import LABEL_FORMAT, BudgetConfig
from ..specs import AttackSpec

# the standard version's parts in its order (autoattack.py:307: apgd-ce, apgd-t, fab-t, square)
PARTS = ("apgd_ce", "apgd_t", "fab_t", "square")


@dataclasses.dataclass
class AutoAttackConfig(BudgetConfig):
    # the attacks run in turn, each on the samples all earlier ones failed on, comma-separated; "standard":
    # the standard version's (autoattack.py:307) for the norm: L-inf apgd_ce,apgd_t,fab_t,square; L2
    # apgd_ce,apgd_t,fab_t (no L2 Square in shiftlab, README.md)
    parts: str = "standard"
    # APGD's and FAB-T's n_iter=100, autoattack.py:33,38,46
    steps: int = param(100, ge=0)
    # apgd_targeted.n_target_classes = 9 and fab.n_target_classes = 9, autoattack.py:310,318
    targets: int = param(9, ge=1)
    rho: float = param(0.75, gt=0, le=1)       # rho=.75, autoattack.py:34
    queries: int = param(5000, ge=0)           # square.n_queries = 5000, autoattack.py:316
    p_init: float = param(0.8, gt=0, le=1)     # Square's p_init=.8, autoattack.py:42

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.parts == "standard":
            self.parts = ",".join(p for p in PARTS if self.norm == "Linf" or p != "square")
        names = [p.strip() for p in self.parts.split(",")] if isinstance(self.parts, str) else []
        unknown = [p for p in names if p not in PARTS]
        if not names or unknown or len(set(names)) != len(names):
            raise ValueError(f"autoattack: parts must be distinct names out of {', '.join(PARTS)}, comma-separated; "
                             f"got {self.parts!r}")
        if self.norm == "L2" and "square" in names:
            raise ValueError("autoattack: square is L-inf only in shiftlab; drop it from parts for an L2 budget")


class AutoAttackSpec(AttackSpec):
    name = "autoattack"
    impl = "shiftlab.attacks.autoattack.attack:AutoAttack"
    config_class = AutoAttackConfig
    summary = ("AutoAttack: APGD-CE, APGD-T, FAB-T and Square in turn; a sample is robust only if every part fails, "
               "its record names the part that broke it")
    label_format = LABEL_FORMAT
    details_format = "parts={parts} steps={steps}"
    # attack_through: every part on a method's own prediction (`--attack-target adaptive`, attacks/adaptive.py):
    # APGD-CE, APGD-T and FAB-T follow its gradient (one draw of its random views per call: bpda/eot as the method
    # declares), Square queries it; a batch method's batch together
    adaptive = True
