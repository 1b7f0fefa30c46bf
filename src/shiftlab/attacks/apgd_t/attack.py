"""APGD-T (`--attack apgd_t`): APGD on the targeted DLR loss, against each of the `targets` classes the
clean image ranks 2nd, 3rd, ... in turn (the algorithm: `shiftlab.attacks.apgd_ce.attack.apgd`)."""
from __future__ import annotations

import torch

from ..apgd_ce.attack import apgd
from ..bounded import BoundedAttack
from .spec import APGDTSpec


class APGDT(BoundedAttack):
    """AutoAttack's targeted APGD; needs at least 4 classes (the DLR denominator reads the 4th largest logit)."""

    spec = APGDTSpec
    min_classes = 4

    def run(self, x: torch.Tensor, y: torch.Tensor, seed: int) -> torch.Tensor:
        c = self.config
        adv, _ = apgd(self.classifier, x, y, eps=c.budget, norm=c.norm, steps=c.steps, restarts=c.restarts,
                      rho=c.rho, loss="dlr-targeted", n_targets=c.targets, every=c.attack_misclassified)
        return adv
