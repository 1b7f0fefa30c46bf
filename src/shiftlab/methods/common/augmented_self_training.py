"""The update loop RMT and SANTA share (mariodoebler/test-time-adaptation's `methods/rmt.py` and `santa.py` at
8b2ed63, source-free): each of `steps` updates per batch reads the student's logits of the batch and of one random
augmentation of it (`tta_transforms.augment_normalized` with the config's `soft_augmentations` and
`gaussian_std`, drawn from `ema_teacher.update_generator(augment_seed, updates)`), then takes one optimiser step
on the method's loss against its target (RMT: its EMA teacher; SANTA: the source model)."""
from __future__ import annotations

from typing import Any

import torch

from .ema_teacher import update_generator
from .tta_transforms import augment_normalized


class AugmentedSelfTraining:
    """Mixed in before `NormTTAMethod`: `adapt` runs the loop; a method defines `objective` (the loss and the
    outputs of one update) and may define `after_step` (RMT: the teacher's EMA update). Its `updates` counts the
    optimiser steps since the start (the seed of each update's draws)."""
    updates: int

    def objective(self, pixels: torch.Tensor, student: torch.Tensor, augmented: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, 3, S, S) pixels, (B, C) student logits of the batch and of its augmentation -> (the scalar loss, the
        (B, C) outputs, detached)."""
        raise NotImplementedError

    def after_step(self) -> None:
        """What follows each optimiser step (nothing by default)."""

    def adapt(self, pixels: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        cfg = self.config
        losses, outputs = [], None
        for _ in range(cfg.steps):
            generator = update_generator(cfg.augment_seed, self.updates)
            student = self.logits(pixels)
            augmented = self.logits(augment_normalized(self.model, pixels, generator, soft=cfg.soft_augmentations,
                                                       gaussian_std=cfg.gaussian_std))
            loss, outputs = self.objective(pixels, student, augmented)
            losses.append(float(loss.detach()))
            self.step(loss)
            self.after_step()
            self.updates += 1
        extras = {"loss": losses[0], "last_loss": losses[-1]}
        return outputs, [dict(extras) for _ in range(pixels.shape[0])]
