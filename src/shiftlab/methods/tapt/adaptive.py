"""TAPT as a differentiable function of its attacked views (`--attack-target adaptive`, mode full+bpda+eot;
`fn(method, views01 (B, N, 3, S, S) in [0, 1]) -> logits (B, C)`).

The same computation as `TAPT.tune` + the prediction of view 0, written so that the attacker's gradient runs
through it: each AdamW step of the prompts written out (`prompt_tuning_adaptive.adamw_step`, torch's update op
for op) on the gradient of TAPT's loss taken with `create_graph=True`, second order through the image tower, so
the tuned prompts are a differentiable function of the pixels. BPDA: the confident views are chosen on the
forward pass and their indices are constants on the backward pass. Not replicated: GradScaler's skipped step on
an fp16 overflow.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..common.prompt_tuning_adaptive import adamw_step

if TYPE_CHECKING:
    from .method import TAPT


def tapt_logits(method: TAPT, views01: torch.Tensor) -> torch.Tensor:
    cfg = method.config
    out = []
    # double backward through the tower's attention: the math kernel (the fused ones have none)
    with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):
        for views in views01:
            x = method.model.normalize(views)
            prompts = method.initial.clone().requires_grad_(True)
            exp_avg, exp_avg_sq = torch.zeros_like(prompts), torch.zeros_like(prompts)
            chosen = None
            for step in range(1, cfg.steps + 1):
                logits, inputs = method.forward(x, prompts)
                if chosen is None:
                    chosen = method.select(logits)
                    entropy_views, align_views = chosen
                else:
                    entropy_views = align_views = chosen[1]
                loss = method.loss(logits, inputs, entropy_views, align_views)
                (grad,) = torch.autograd.grad(loss, prompts, create_graph=True)
                prompts, exp_avg, exp_avg_sq = adamw_step(prompts, grad, exp_avg, exp_avg_sq, step, cfg.lr,
                                                          cfg.weight_decay)
            logits, _ = method.forward(x[:1], prompts)
            out.append(logits[0])
    return torch.stack(out).float()
