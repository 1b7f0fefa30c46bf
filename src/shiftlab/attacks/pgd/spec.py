"""L-inf PGD (`--attack pgd`): its config and spec, without torch (the attack itself: attack.py)."""
from __future__ import annotations

import dataclasses

from ...params import param
from ..base import QUANTIZE_MODES, AttackConfig
from ..specs import AttackSpec

# The authors' code: TomSheng21/R-TPT @ e085f134eb299083ccc97327b316272fc40393b8 (R_TPT below).


@dataclasses.dataclass
class PGDConfig(AttackConfig):
    """eps, alpha: in [0, 1] pixel units; steps: PGD iterations."""
    eps: float = param(1 / 255, ge=0, le=1)            # R_TPT README.md:28 (--eps 1.0; /255 in rtpt.py:208)
    alpha: float | None = param(None, ge=0, le=1)      # None: eps / 4, R_TPT rtpt.py:83
    steps: int = param(7, ge=0)                        # R_TPT README.md:28 (--step 7)
    random_start: bool = True                          # torchattacks.PGD's, R_TPT torchattacks/attacks/pgd.py:32
    # 8-bit conversion: "round" (ours); the authors truncate (ToPILImage, R_TPT rtpt.py:218): "truncate"
    quantize: str = param("round", choices=QUANTIZE_MODES)
    # clip the 8-bit image to the eps-ball (ours); R_TPT rtpt.py:218 does not: False
    clip_to_ball: bool = True
    seed: int | None = param(None, ge=0)               # the random start's run seed; None: the run's --seed


class PGDSpec(AttackSpec):
    name = "pgd"
    impl = "shiftlab.attacks.pgd.attack:PGDAttack"
    config_class = PGDConfig
    summary = "L-inf PGD on the base view against zero-shot CLIP with the initial prompt (R-TPT's threat model)"
    label_format = "eps={eps:/255}"
    details_format = "steps={steps}"
    adaptive = True   # attack_through: PGD on a method's own prediction (attacks/adaptive.py)
