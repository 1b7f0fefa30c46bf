"""PromptAlign as a differentiable function of its attacked views (`--attack-target adaptive`, mode full+bpda+eot;
`fn(method, views01 (B, N, 3, S, S) in [0, 1]) -> logits (B, C)`).

The same computation as `PromptAlign.tune` + the prediction of view 0, written so that the attacker's gradient runs
through it: each AdamW step of every prompt tensor written out (`prompt_tuning_adaptive.adamw_step`, torch's
update op for op) on the gradient of PromptAlign's loss taken with `create_graph=True`, second order through both
towers, so the tuned prompts are a differentiable function of the pixels. BPDA: the confident views are chosen on
the forward pass and their indices are constants on the backward pass. Not replicated: GradScaler's skipped step
on an fp16 overflow.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..common.maple_prompts import MaPLePrompts
from ..common.prompt_tuning_adaptive import adamw_step

if TYPE_CHECKING:
    from .method import PromptAlign


def promptalign_logits(method: PromptAlign, views01: torch.Tensor) -> torch.Tensor:
    cfg = method.config
    out = []
    # double backward through the towers' attention: the math kernel (the fused ones have none)
    with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):
        for views in views01:
            x = method.model.normalize(views)
            prompts = MaPLePrompts(*(t.clone().requires_grad_(True) for t in method.initial))
            moments = [(torch.zeros_like(t), torch.zeros_like(t)) for t in prompts]
            chosen = None
            for step in range(1, cfg.steps + 1):
                logits, inputs = method.forward(x, prompts)
                if chosen is None:
                    chosen = method.select(logits)
                    entropy_views, align_views = chosen
                else:
                    entropy_views = align_views = chosen[1]
                loss = method.loss(logits, inputs, entropy_views, align_views)
                grads = torch.autograd.grad(loss, list(prompts), create_graph=True, allow_unused=True)
                # a tensor no block reads (depth past the towers) has no gradient: AdamW leaves it as it is
                updated = [(t, m, v) if g is None else adamw_step(t, g, m, v, step, cfg.lr, cfg.weight_decay)
                           for t, g, (m, v) in zip(prompts, grads, moments, strict=True)]
                prompts = MaPLePrompts(*(u[0] for u in updated))
                moments = [(u[1], u[2]) for u in updated]
            logits, _ = method.forward(x[:1], prompts)
            out.append(logits[0])
    return torch.stack(out).float()
