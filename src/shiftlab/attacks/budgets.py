"""The threat model shared by the AutoAttack attacks, without torch: an L-inf or an L2 budget.

`eps` is the L-inf budget in [0, 1] pixel units (what `--eps` sets for every attack); `eps_l2`, when
given, makes the attack an L2 one with that radius instead (`--eps-l2`; the L-inf `eps` is then unused).
Three fields follow from those two and are recorded, not set: `norm` ("Linf" or "L2"), `budget` (the
radius in force) and `threat` ("eps=4/255" or "L2 eps=0.5", the run's label). An attack that takes
only L-inf budgets (pgd) has no `eps_l2` field, so `--eps-l2` with it is refused before torch.
"""
from __future__ import annotations

import dataclasses

from ..params import param
from .base import QUANTIZE_MODES, AttackConfig, format_255

NORMS = ("Linf", "L2")
L2_MAX = 1000.0   # far above the L2 norm of any image difference that matters; a bound so typos are refused


@dataclasses.dataclass
class LinfBudgetConfig(AttackConfig):
    """An L-inf attack's budget, its 8-bit conversion and its seed (subclasses add their own fields)."""

    # L-inf budget; 1/255 as shiftlab's pgd (the R-TPT paper's budget, R-TPT README.md:28)
    eps: float = param(1 / 255, ge=0, le=1)
    # 8-bit conversion of an L-inf result (pixels.quantize; an L2 result is always rounded toward the clean image)
    quantize: str = param("round", choices=QUANTIZE_MODES)
    seed: int | None = param(None, ge=0)       # the per-sample seeds' run seed; None: the run's --seed
    # also attack a sample the attacked model already misclassifies (ours, for the transfer protocol: a method
    # may correct zero-shot's error); the original leaves it clean (autopgd_base.py `perturb`: acc = y_pred == y)
    attack_misclassified: bool = False
    norm: str = dataclasses.field(default="Linf", init=False)
    budget: float = dataclasses.field(default=1 / 255, init=False)
    threat: str = dataclasses.field(default="", init=False)

    def __post_init__(self) -> None:
        eps_l2 = getattr(self, "eps_l2", None)
        self.norm = "L2" if eps_l2 is not None else "Linf"
        self.budget = eps_l2 if eps_l2 is not None else self.eps
        shown = format_255(self.eps) if isinstance(self.eps, (int, float)) else str(self.eps)
        self.threat = f"L2 eps={eps_l2:g}" if eps_l2 is not None else f"eps={shown}"


@dataclasses.dataclass
class BudgetConfig(LinfBudgetConfig):
    """An attack that takes an L-inf or an L2 budget."""

    # L2 budget: None = an L-inf attack (ours: AutoAttack takes norm='L2' and one eps, autoattack.py:14)
    eps_l2: float | None = param(None, ge=0, le=L2_MAX)


LABEL_FORMAT = "{threat}"                    # 'apgd_ce eps=4/255', 'apgd_ce L2 eps=0.5'
BUDGET_FIELDS = ("norm", "budget")           # what every attacked record carries beside the label's fields
