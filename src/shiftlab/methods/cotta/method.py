"""CoTTA on CLIP, as mariodoebler/test-time-adaptation runs it (`classification/methods/cotta.py`, 8b2ed63, built on
qinenergy/cotta's `imagenet/cotta.py`). Three copies of the image tower (`common.norm_adaptation.NormTower` with
every module's weight and bias adapted, BatchNorm on the batch's statistics): the student (stepped by SGD), the
teacher (its EMA: `common.ema_teacher.MeanTeacher`) and the anchor (the source weights). For every batch of test
images (view 0 of each), `steps` times:

1. the student's logits; the anchor's probabilities; if the anchor's mean max probability is below
   `confidence_threshold`, the teacher's logits averaged over `n_augmentations` random augmentations of the batch
   (`common.tta_transforms`, one draw per augmentation for the whole batch), else the teacher's logits on the batch;
2. loss = the batch's mean consistency between the student and that teacher prediction (`symmetric`: half the
   cross-entropy each way; `teacher_ce`: the student's cross-entropy to the teacher); one optimiser step;
3. the teacher's EMA step towards the student; each student weight entry back to its source value with
   probability `restore_probability`.

The batch's outputs are the teacher's prediction of the last step (before its updates). The random draws (the
augmentations, then the restore) of update k come from `update_generator(augment_seed, k)`. README.md lists what
differs from the authors' code.
"""
from __future__ import annotations

from typing import Any

import torch

from ..common.ema_teacher import MeanTeacher, TeacherAndUpdates, anchor_tower, stochastic_restore_, update_generator
from ..common.norm_adaptation import NormTower, NormTTAMethod
from ..common.tta_transforms import augment_normalized
from .spec import CoTTASpec


def consistency_loss(student: torch.Tensor, teacher: torch.Tensor, kind: str) -> torch.Tensor:
    """(B, C) student and teacher logits -> (B,) CoTTA's loss (cotta.py:131-138): `teacher_ce` = -sum softmax(t)
    log_softmax(s); `symmetric` = half that plus half -sum softmax(s) log_softmax(t)."""
    to_teacher = -(teacher.softmax(1) * student.log_softmax(1)).sum(1)
    if kind == "teacher_ce":
        return to_teacher
    return 0.5 * to_teacher - 0.5 * (student.softmax(1) * teacher.log_softmax(1)).sum(1)


class CoTTA(TeacherAndUpdates, NormTTAMethod):
    """CoTTA: a student distilled from its EMA teacher, with stochastic restore to the source weights."""
    spec = CoTTASpec

    def make_tower(self) -> NormTower:
        """The student; beside it the teacher and the anchor (the source model)."""
        clip, skip = self.model.clip, self.config.skip_top_layers
        student = NormTower(clip, skip, adapt="weights")
        self.teacher = MeanTeacher(clip, skip, adapt="weights")
        self.anchor = anchor_tower(clip)
        return student

    # -- the computation -------------------------------------------------------------------------------------------
    def augment(self, pixels: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """(B, 3, S, S) normalised -> one random augmentation of the batch, normalised."""
        cfg = self.config
        return augment_normalized(self.model, pixels, generator, soft=cfg.soft_augmentations,
                                  gaussian_std=cfg.gaussian_std)

    def teacher_prediction(self, pixels: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, bool, float]:
        """The teacher's logits for the batch (augmentation-averaged when the anchor is unsure), whether they were
        averaged, and the anchor's mean max probability (cotta.py:47-58)."""
        cfg = self.config
        with torch.no_grad():
            confidence = float(self.logits(pixels, self.anchor).softmax(1).max(1).values.mean(0))
            if confidence < cfg.confidence_threshold:
                outputs = [self.logits(self.augment(pixels, generator), self.teacher.tower)
                           for _ in range(cfg.n_augmentations)]
                return torch.stack(outputs).mean(0), True, confidence
            return self.logits(pixels, self.teacher.tower), False, confidence

    def adapt(self, pixels: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        cfg = self.config
        losses, outputs, augmented, confidence = [], None, False, 0.0
        initial = [self._initial_norm[name] for name in self.tower.parameter_names]
        for _ in range(cfg.steps):
            generator = update_generator(cfg.augment_seed, self.updates)
            student = self.logits(pixels)
            outputs, augmented, confidence = self.teacher_prediction(pixels, generator)
            loss = consistency_loss(student, outputs, cfg.loss).mean(0)
            losses.append(float(loss.detach()))
            self.step(loss)
            self.teacher.update(self.tower, cfg.teacher_momentum)
            if cfg.restore_probability > 0:
                stochastic_restore_(self.tower.adapted_parameters(), initial, cfg.restore_probability, generator)
            self.updates += 1
        extras = {"loss": losses[0], "last_loss": losses[-1], "augmented": augmented,
                  "anchor_confidence": confidence}
        return outputs.detach(), [dict(extras) for _ in range(pixels.shape[0])]


def teacher_state_logits(method: CoTTA, views01: torch.Tensor) -> torch.Tensor:
    """(B, N, 3, S, S) in [0, 1] -> (B, C): the teacher's logits of view 0 with the parameters it holds, differentiable
    in the pixels (its output whenever the anchor is confident)."""
    with torch.enable_grad():
        return method.logits(method.model.normalize(views01[:, 0]), method.teacher.tower)
