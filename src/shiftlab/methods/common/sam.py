"""Sharpness-aware minimisation's first step, as the SAM optimiser CLIPTTA's toolkit wraps (github.com/MarcLafon/
cliptta at f4221f4, `ttavlm/optimizers/sam.py`, from davda54/sam), shared by SAR, SoTTA and STAMP."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


@torch.no_grad()
def sam_perturb(params: list[torch.nn.Parameter], rho: float, adaptive: bool) -> list[torch.Tensor]:
    """SAM's first step (sam.py:34-52): w <- w + rho x (w^2 if adaptive) g / ||(|w| if adaptive) g||; returns the
    weights before the move. Parameters without a gradient stay."""
    grads = [(p.abs() if adaptive else 1.0) * p.grad for p in params if p.grad is not None]
    norm = torch.norm(torch.stack([g.norm(p=2) for g in grads]), p=2) if grads else torch.tensor(0.0)
    scale = rho / (norm + 1e-12)
    olds = []
    for p in params:
        olds.append(p.detach().clone())
        if p.grad is not None:
            p.add_((torch.pow(p, 2) if adaptive else 1.0) * p.grad * scale.to(p))
    return olds


def memory_step(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], loss: torch.Tensor,
                again: Callable[[], torch.Tensor], rho: float, sam: bool) -> None:
    """One optimiser step on `loss`; with `sam`, on SAM's gradient instead: `again()` (the same loss) taken at the
    weights `sam_perturb` moved them to, the weights put back before the step (SoTTA's and STAMP's `--use_sam`).
    The gradients are cleared after the step."""
    loss.backward()
    if sam:
        olds = sam_perturb(params, rho, adaptive=False)
        optimizer.zero_grad(set_to_none=True)
        again().backward()
        with torch.no_grad():
            for p, old in zip(params, olds):
                p.copy_(old)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


class MemoryReplay:
    """Mixed in before the method's base by SoTTA and STAMP (a `memory_loss` of a batch of remembered test images,
    the config's `sam` and `rho`): their update on the remembered images."""
    config: Any
    optimizer: torch.optim.Optimizer
    tower: Any

    def memory_loss(self, images: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def step_on_memory(self, images: torch.Tensor) -> float:
        """One optimiser step on `memory_loss(images)` (SAM's with `sam`: `memory_step`); the loss's value."""
        loss = self.memory_loss(images)
        memory_step(self.optimizer, self.tower.adapted_parameters(), loss, lambda: self.memory_loss(images),
                    self.config.rho, self.config.sam)
        return float(loss.detach())
