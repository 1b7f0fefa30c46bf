"""The mean-teacher machinery of CoTTA, RMT and SANTA (mariodoebler/test-time-adaptation's `methods/cotta.py`,
`rmt.py`, `santa.py` and `utils/misc.ema_update_model`): a student tower adapted by the optimiser, a teacher tower
that follows it as an exponential moving average (EMA), a frozen source (anchor) tower, the stochastic restore of
the student's weights to the source ones, and the per-batch generator their random draws come from here.

- `MeanTeacher`: a second private `NormTower` with the student's adapted parameters (never stepped, no gradient),
  updated by `update(student, momentum)`: teacher = momentum x teacher + (1 - momentum) x student, in their
  expression; `state` / `load_state` / `reset(initial)` for a method's checkpoint;
- `anchor_tower(clip)`: the source model as their deep copy runs it, the shared frozen weights with every BatchNorm
  on the batch's statistics (their configure_model runs before the copy);
- `stochastic_restore_(params, initial, p, generator)`: each entry of each parameter back to its initial value with
  probability p (CoTTA's restore: one uniform draw per entry, parameter by parameter in the tower's order);
- `update_generator(seed, update)`: the generator of one update's draws (one optimiser step: its augmentations,
  then its restore; ROID's and CMF's consistency augmentation draws from it too, `common/roid_training.py`),
  seeded from the run's seed and the update's index, so a run resumed at any batch draws what an uninterrupted one
  draws (no generator state to keep, only the count of updates).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn

from .norm_adaptation import NormTower


def update_seed(seed: int, update: int) -> int:
    """The seed of update `update` (0, 1, ...: the optimiser steps since the run's start) of a run seeded `seed`."""
    return (int(seed) * 1_000_003 + int(update)) % 2 ** 63


def update_generator(seed: int, update: int) -> torch.Generator:
    """A CPU generator seeded `update_seed(seed, update)` (the golden drivers seed torch's global one alike before
    each of their `forward_and_adapt` calls)."""
    return torch.Generator().manual_seed(update_seed(seed, update))


@torch.no_grad()
def ema_update_(teacher: Sequence[torch.Tensor], student: Sequence[torch.Tensor], momentum: float) -> None:
    """teacher <- momentum x teacher + (1 - momentum) x student, entry by entry, in place (ema_update_model,
    misc.py:8-13, in its order of operations so that the rounding is theirs)."""
    for t, s in zip(teacher, student, strict=True):
        t.copy_(momentum * t + (1 - momentum) * s.to(t.device))


@torch.no_grad()
def stochastic_restore_(params: Sequence[torch.Tensor], initial: Sequence[torch.Tensor], probability: float,
                        generator: torch.Generator) -> None:
    """Each entry of each of `params` set back to `initial`'s with probability `probability`, in place: a uniform
    draw per entry (CPU, `generator`), parameter by parameter in order (cotta.py:92-98; qinenergy/cotta
    imagenet/cotta.py:104-109)."""
    for p, p0 in zip(params, initial, strict=True):
        mask = (torch.rand(p.shape, generator=generator) < probability).float().to(p.device)
        p.copy_(p0 * mask + p * (1.0 - mask))


def anchor_tower(clip: nn.Module) -> NormTower:
    """The frozen source tower (CoTTA's `model_anchor`): the shared weights, BatchNorm on the batch's statistics."""
    tower = NormTower(clip)
    tower.requires_grad_(False)
    return tower


class MeanTeacher:
    """The EMA teacher of a student `NormTower` (same `adapt` and `skip_top_layers`, so the same parameter list)."""

    def __init__(self, clip: nn.Module, skip_top_layers: str = "none", adapt: str = "norm"):
        self.tower = NormTower(clip, skip_top_layers, adapt=adapt)
        self.tower.requires_grad_(False)

    def update(self, student: NormTower, momentum: float) -> None:
        """One EMA step towards the student's current parameters."""
        if student.parameter_names != self.tower.parameter_names:
            raise ValueError("the teacher and the student adapt different parameters")
        ema_update_(self.tower.adapted_parameters(), student.adapted_parameters(), momentum)

    def state(self) -> dict[str, torch.Tensor]:
        return self.tower.norm_state()

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        self.tower.load_norm_state(state)

    def reset(self, initial: dict[str, torch.Tensor]) -> None:
        """Back to `initial` (the student's initial parameters: both start as the source model)."""
        self.tower.load_norm_state(initial)


class TeacherAndUpdates:
    """Mixed in before `NormTTAMethod` by a method with a `teacher` (a MeanTeacher) and a count of `updates` (each
    update's random draws are seeded by it, `update_generator`): both restart with the student, are checkpointed beside
    it and restored exactly; an episodic reset restarts the student, its optimiser and the teacher (the authors' reset
    reloads all three) while the count runs on, as their global generator does."""
    teacher: MeanTeacher
    updates: int

    def reset_extra(self) -> None:
        self.teacher.reset(self._initial_norm)   # type: ignore[attr-defined]
        self.updates = 0

    def extra_state(self) -> dict[str, Any]:
        return {"teacher": self.teacher.state(), "updates": self.updates}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.teacher.load_state(state["teacher"])
        self.updates = int(state["updates"])

    def episodic_reset(self) -> None:
        self.reset_tower()                        # type: ignore[attr-defined]
        self.teacher.reset(self._initial_norm)   # type: ignore[attr-defined]
