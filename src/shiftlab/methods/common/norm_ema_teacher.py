"""A second copy of the adapted image tower whose normalisation parameters follow the student's by an exponential
moving average: RoTTA's EMA teacher and AdaContrast's momentum key encoder, as CLIPTTA's toolkit builds them
(github.com/MarcLafon/cliptta at f4221f4: `ttavlm/methods/rotta.py:43` and `adacontrast.py:37`, a deepcopy of the
adapted tower). Only the normalisation parameters can differ from the student's (every other tensor of both is the
frozen shared model's), so the average runs over those alone."""
from __future__ import annotations

from typing import Any

import torch

from .norm_adaptation import NormTower


class NormEMATeacher:
    """`tower`: a NormTower of `clip` (same `skip_top_layers`), its parameters started at the student's and never
    trained; `follow(student, weight)` moves them by teacher <- (1 - weight) x teacher + weight x student (RoTTA's
    update_ema_variables, rotta.py:101-108; AdaContrast's momentum update with weight = 1 - m)."""

    def __init__(self, clip: torch.nn.Module, student: NormTower, skip_top_layers: str = "none"):
        self.tower = NormTower(clip, skip_top_layers)
        self.tower.requires_grad_(False)
        self.tower.load_norm_state(student.norm_state())

    @torch.no_grad()
    def follow(self, student: NormTower, weight: float) -> None:
        for teacher, param in zip(self.tower.adapted_parameters(), student.adapted_parameters()):
            teacher.copy_((1 - weight) * teacher + weight * param)

    def state(self) -> dict[str, Any]:
        return self.tower.norm_state()

    def load(self, state: dict[str, torch.Tensor]) -> None:
        self.tower.load_norm_state(state)
