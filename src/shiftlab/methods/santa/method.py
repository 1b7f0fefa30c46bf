"""SANTA on CLIP, source-free, as mariodoebler/test-time-adaptation's `classification/methods/santa.py` (8b2ed63)
computes it with CLIP's split (features: the image tower's unit features; classifier: the class head at the logit
scale). The image tower's normalisation layers adapt (`common.norm_adaptation.NormTower`, BatchNorm on the batch's
statistics); the anchor is the source tower (`common.ema_teacher.anchor_tower`). For every batch of test images (view
0 of each), `steps` times:

1. the student's logits on the batch and on one random augmentation of it (`common.tta_transforms`, one draw for
   the whole batch); the anchor's logits on the batch;
2. loss = lambda_ce_trg x the batch's mean of (H(student, anchor) + H(student on the augmentation, anchor)) / 2, H(p, q)
   = -sum softmax(p) log_softmax(q) (`AugCrossEntropy`, losses.py:22-29: the anchor is the target, the student's
   probabilities carry the gradient); one optimiser step.

The batch's outputs are the student's logits of the last step (before its update). The augmentation of update k
draws from `update_generator(augment_seed, k)`. The contrastive loss to source prototypes needs source data and is
refused (README.md).
"""
from __future__ import annotations

from typing import Any

import torch

from ..common.augmented_self_training import AugmentedSelfTraining
from ..common.ema_teacher import anchor_tower
from ..common.norm_adaptation import NormTower, NormTTAMethod
from .spec import SANTASpec


def anchored_cross_entropy(x: torch.Tensor, x_aug: torch.Tensor, anchor: torch.Tensor,
                           alpha: float = 0.5) -> torch.Tensor:
    """(B, C) x3 -> (B,) their AugCrossEntropy (losses.py:22-29): -(1 - alpha) sum softmax(x) log_softmax(anchor) -
    alpha sum softmax(x_aug) log_softmax(anchor)."""
    target = anchor.log_softmax(1)
    return -(1 - alpha) * (x.softmax(1) * target).sum(1) - alpha * (x_aug.softmax(1) * target).sum(1)


class SANTA(AugmentedSelfTraining, NormTTAMethod):
    """SANTA, source-free: the norm parameters pulled towards the source model's predictions."""
    spec = SANTASpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if self.config.source_contrastive:
            raise ValueError(f"{self.name}.source_contrastive: True is refused: the contrastive loss to the source "
                             "class prototypes needs the source (ImageNet training) data, which a test-time run does "
                             "not have")

    def make_tower(self) -> NormTower:
        """The student (its norm parameters); beside it the anchor."""
        self.anchor = anchor_tower(self.model.clip)
        return super().make_tower()

    def reset_extra(self) -> None:
        self.updates = 0

    def extra_state(self) -> dict[str, Any]:
        return {"updates": self.updates}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.updates = int(state["updates"])

    def episodic_reset(self) -> None:
        """The parameters and the optimiser; their global generator runs on, as the count of updates does here."""
        self.reset_tower()

    def objective(self, pixels: torch.Tensor, student: torch.Tensor, augmented: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """Their AugCrossEntropy of the student's logits, of the batch and of its augmentation, to the source
        model's; the outputs: the student's."""
        with torch.no_grad():
            anchor = self.logits(pixels, self.anchor)
        return self.config.lambda_ce_trg * anchored_cross_entropy(student, augmented, anchor).mean(0), student.detach()
