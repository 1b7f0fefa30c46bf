"""RMT on CLIP, source-free, as mariodoebler/test-time-adaptation's `classification/methods/rmt.py` (8b2ed63)
computes it with CLIP's split (features: the image tower's unit features; classifier: the class head at the logit
scale). Two copies of the image tower (`common.norm_adaptation.NormTower` with every module's weight and bias
adapted, BatchNorm on the batch's statistics): the student (stepped by SGD) and the teacher (its EMA:
`common.ema_teacher.MeanTeacher`). For every batch of test images (view 0 of each), `steps` times:

1. the student's logits on the batch and on one random augmentation of it (`common.tta_transforms`, one draw for
   the whole batch); the teacher's logits on the batch;
2. loss = lambda_ce_trg x the batch's mean of (SCE(student, teacher) + SCE(student on the augmentation, teacher)) / 2,
   SCE the symmetric cross-entropy (half each way, `utils/losses.py:13-19`); one optimiser step;
3. the teacher's EMA step towards the student.

The batch's outputs are student + teacher logits of the last step (before its updates). The augmentation of update
k draws from `update_generator(augment_seed, k)`. Their source replay, contrastive loss to source prototypes and
warm-up need source data and are refused (README.md).
"""
from __future__ import annotations

from typing import Any

import torch

from ..common.augmented_self_training import AugmentedSelfTraining
from ..common.ema_teacher import MeanTeacher, TeacherAndUpdates
from ..common.norm_adaptation import NormTower, NormTTAMethod
from .spec import RMTSpec

# the parts of their RMT that need the source (ImageNet training) data, each with what it is
SOURCE_PARTS = {"source_replay": "the cross-entropy on labelled source batches",
                "source_contrastive": "the contrastive loss to the source class prototypes",
                "source_warmup": "the mean-teacher warm-up on source images"}


def symmetric_cross_entropy(x: torch.Tensor, x_ema: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """(B, C), (B, C) -> (B,) their SymmetricCrossEntropy (losses.py:13-19): -(1 - alpha) sum softmax(x_ema)
    log_softmax(x) - alpha sum softmax(x) log_softmax(x_ema)."""
    return (-(1 - alpha) * (x_ema.softmax(1) * x.log_softmax(1)).sum(1)
            - alpha * (x.softmax(1) * x_ema.log_softmax(1)).sum(1))


class RMT(TeacherAndUpdates, AugmentedSelfTraining, NormTTAMethod):
    """RMT, source-free: a student trained on the symmetric cross-entropy to its EMA teacher."""
    spec = RMTSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        for field, what in SOURCE_PARTS.items():
            if getattr(self.config, field):
                raise ValueError(f"{self.name}.{field}: True is refused: {what} needs the source (ImageNet "
                                 "training) data, which a test-time run does not have")

    def make_tower(self) -> NormTower:
        """The student; beside it the teacher."""
        clip, skip = self.model.clip, self.config.skip_top_layers
        self.teacher = MeanTeacher(clip, skip, adapt="weights")
        return NormTower(clip, skip, adapt="weights")

    # -- the computation -------------------------------------------------------------------------------------------
    def objective(self, pixels: torch.Tensor, student: torch.Tensor, augmented: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """The symmetric cross-entropy of the student's logits, of the batch and of its augmentation, to the
        teacher's; the outputs: student + teacher."""
        with torch.no_grad():
            teacher = self.logits(pixels, self.teacher.tower)
        loss = self.config.lambda_ce_trg * (0.5 * symmetric_cross_entropy(student, teacher)
                                            + 0.5 * symmetric_cross_entropy(augmented, teacher)).mean(0)
        return loss, (student + teacher).detach()

    def after_step(self) -> None:
        self.teacher.update(self.tower, self.config.teacher_momentum)


def ensemble_state_logits(method: RMT, views01: torch.Tensor) -> torch.Tensor:
    """(B, N, 3, S, S) in [0, 1] -> (B, C): student + teacher logits of view 0 with the parameters they hold (the
    batch's output before its update), differentiable in the pixels."""
    with torch.enable_grad():
        pixels = method.model.normalize(views01[:, 0])
        return method.logits(pixels) + method.logits(pixels, method.teacher.tower)
