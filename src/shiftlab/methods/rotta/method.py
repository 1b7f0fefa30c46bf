"""RoTTA on CLIP (Yuan, Xie & Li, CVPR 2023), as CLIPTTA's toolkit runs it (github.com/MarcLafon/cliptta at
f4221f4, `ttavlm/methods/rotta.py` with `memory/cstu.py`), for every batch of test images (view 0 of each, through
the tower of `common.norm_adaptation`), `steps` times:

1. the EMA teacher labels each image (argmax) and scores its uncertainty (the entropy of its softmax at
   `loss_logit_scale`); image after image enters the category-balanced memory (`memory.py`) (rotta.py:55-63, 75-81);
2. when the images counted since the last update reach a multiple of `update_frequency` (`update_schedule`), one
   optimiser step on the memory: the student's cross-entropy to the teacher's target (`teacher_target`) weighted by
   each image's timeliness exp(-a) / (1 + exp(-a)) (a = age / capacity), then the teacher follows the student by
   an EMA of weight `nu` (rotta.py:65-99).

Then the batch's logits through the `output` tower, and its own OOD score recorded with each image. README.md lists
what differs from the authors' code.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..common.confidence import entropy
from ..common.norm_ema_teacher import NormEMATeacher
from ..common.ood_scores import OwnOODScoreMethod, ood_scores
from .memory import CategoryBalancedMemory
from .spec import RoTTASpec


def timeliness(ages: torch.Tensor) -> torch.Tensor:
    """(N,) ages / capacity -> (N,) weights exp(-a) / (1 + exp(-a)) (rotta.py:110-113)."""
    return torch.exp(-ages) / (1 + torch.exp(-ages))


class RoTTA(OwnOODScoreMethod):
    """RoTTA: a category-balanced memory trains the norm parameters against an EMA teacher."""
    spec = RoTTASpec

    def reset_extra(self) -> None:
        cfg = self.config
        if not hasattr(self, "memory"):
            self.memory = CategoryBalancedMemory(len(self.classnames), cfg.capacity, cfg.lambda_t, cfg.lambda_u)
            self.teacher = NormEMATeacher(self.model.clip, self.tower, getattr(cfg, "skip_top_layers", "none"))
        self.memory.reset()
        self.teacher.load(self.tower.norm_state())
        self.counted = 0          # images added since the last update (their current_instance)

    def episodic_reset(self) -> None:
        self.reset_tower()      # their reset: the parameters and the optimiser; memory, teacher and count run on

    def extra_state(self) -> dict[str, Any]:
        return {"memory": self.memory.state(), "teacher": self.teacher.state(), "counted": self.counted}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.memory.load(state["memory"])
        self.teacher.load(state["teacher"])
        self.counted = int(state["counted"])

    def cosines(self, pixels: torch.Tensor, tower: torch.nn.Module | None = None) -> torch.Tensor:
        """(B, C) cosines to the head through `tower` (the student by default), gradients kept."""
        if tower is None:
            return self.encode(pixels) @ self.head.T
        if self.model.channels_last:
            pixels = pixels.contiguous(memory_format=torch.channels_last)
        with self.precision.autocast():
            features = tower(pixels)
        return F.normalize(features.float(), dim=-1) @ self.head.T

    def update(self) -> float | None:
        """One step on the memory (rotta.py:83-99), then the teacher's EMA; the loss, None when it is empty."""
        cfg = self.config
        loss = None
        contents = self.memory.contents()
        if contents is not None:
            images, ages = contents
            with torch.no_grad():
                target = cfg.loss_logit_scale * self.cosines(images, self.teacher.tower)
            if cfg.teacher_target == "softmax":
                target = target.softmax(-1)
            student = cfg.loss_logit_scale * self.cosines(images)
            weights = timeliness(ages.to(student.device))
            loss = (weights * F.cross_entropy(student, target, reduction="none")).mean()
            self.step(loss)
        self.teacher.follow(self.tower, cfg.nu)
        return None if loss is None else float(loss.detach())

    def adapt(self, pixels: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        cfg = self.config
        losses, admitted, teacher_cosines = [], [], None
        for _ in range(cfg.steps):
            with torch.no_grad():
                cosines = self.cosines(pixels, self.teacher.tower)
            if teacher_cosines is None:
                teacher_cosines = cosines
            labels = cosines.argmax(-1).tolist()
            uncertainty = entropy(cfg.loss_logit_scale * cosines).tolist()
            admitted = []
            for image, c, u in zip(pixels, labels, uncertainty):
                admitted.append(self.memory.add(image.detach().clone(), c, u))
                self.counted += 1
                if cfg.update_schedule == "instance" and self.counted % cfg.update_frequency == 0:
                    losses.append(self.update())
            if cfg.update_schedule == "batch" and self.counted % cfg.update_frequency == 0:
                losses.append(self.update())
                self.counted = 0
        if cfg.output == "teacher":      # BIT-DA: the teacher's output before this batch's updates
            logits = self.scale * teacher_cosines
            scores = ood_scores(teacher_cosines, cfg.score, cfg.ood_logit_scale)
        else:
            logits, scores = self.scored_logits(pixels)
        done = [x for x in losses if x is not None]
        return logits, self.scored_extras(scores, done, {"admitted": admitted}, memory=len(self.memory),
                                          updates=len(losses))
