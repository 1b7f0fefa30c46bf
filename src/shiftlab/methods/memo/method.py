"""MEMO on CLIP, as mariodoebler/test-time-adaptation runs it (`classification/methods/memo.py`, 8b2ed63, built on
zhangmarvin/memo), for each image alone:

1. its augmented views (views 1..V-1) through a private copy of the image tower whose every weight and bias
   (each module's own, as their `collect_params` walks them, `base.py:154-167`) is trainable and whose BatchNorm
   layers mix in the batch's statistics (`common.norm_statistics.StatsTower`, their AlphaBatchNorm); logits =
   scale x cosine to the class head;
2. loss = the entropy of the views' marginal prediction (the mean of their probabilities, `marginal_entropy`);
   one optimiser step; steps 1-2 `steps` times;
3. the original (view 0) through the adapted tower: the prediction.

The tower returns to its initial weights and the optimiser to an empty state before every image (their
`MODEL.EPISODIC`). README.md lists what differs from the authors' code.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn

from ..base import MethodOutput
from ..common.norm_statistics import StatsTower, StatsTowerMethod
from ..context import SampleContext
from ..kinds import EpisodicMethod
from .spec import MEMOSpec


def marginal_entropy(logits: torch.Tensor) -> torch.Tensor:
    """(V, C) logits -> the entropy of the mean of their softmaxes, computed in log space (memo.py:63-68: the mean's
    log clamped at the dtype's lowest value, so that a zero probability counts 0)."""
    log_probs = logits - logits.logsumexp(dim=-1, keepdim=True)
    avg = log_probs.logsumexp(dim=0) - math.log(logits.shape[0])
    avg = avg.clamp(min=torch.finfo(avg.dtype).min)
    return -(avg * avg.exp()).sum(-1)


def own_weights(module: nn.Module) -> list[tuple[str, nn.Parameter, torch.Tensor]]:
    """Every module's own `weight` and `bias` in `module` made a trainable copy, in module order (their
    collect_params): (name, the copy, the shared tensor it was cloned from, which stays untouched)."""
    out = []
    for name, m in module.named_modules():
        for which, tensor in list(m.named_parameters(recurse=False)):
            if which in ("weight", "bias"):
                copy = nn.Parameter(tensor.detach().clone(), requires_grad=True)
                setattr(m, which, copy)
                out.append((f"{name}.{which}" if name else which, copy, tensor))
    return out


class MEMO(StatsTowerMethod, EpisodicMethod):
    """MEMO: marginal entropy over an image's augmented views, through every weight of the image tower."""
    spec = MEMOSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = self.config
        self.tower = StatsTower(self.model.clip, cfg.statistics, cfg.alpha)
        self.weights = own_weights(self.tower.visual)
        self.parameter_names = [name for name, _, _ in self.weights]
        params = [p for _, p, _ in self.weights]
        if cfg.optimizer == "sgd":        # their setup_optimizer (base.py:169-189), dampening 0
            self.optimizer: torch.optim.Optimizer = torch.optim.SGD(
                params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                nesterov=cfg.nesterov and cfg.momentum > 0)
        else:
            cls = torch.optim.Adam if cfg.optimizer == "adam" else torch.optim.AdamW
            self.optimizer = cls(params, lr=cfg.lr, betas=(cfg.adam_beta, 0.999), weight_decay=cfg.weight_decay)

    @torch.no_grad()
    def reset(self) -> None:
        for _, p, source in self.weights:
            p.copy_(source)
        self.optimizer.state.clear()
        self.optimizer.zero_grad(set_to_none=True)

    def logits(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.tower_logits(pixels)

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        views = self.recipe_views(ctx, "adapts the image tower on the image's views and needs their pixels")
        self.reset()
        losses = []
        with torch.enable_grad():
            for _ in range(self.config.steps):
                loss = marginal_entropy(self.logits(views[1:]))
                losses.append(float(loss.detach()))
                loss.backward()
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            logits = self.logits(views[:1])[0]
        return MethodOutput(logits.float(), extras={"loss": losses[0], "last_loss": losses[-1]})
