"""Token-alignment tuning (TAPT, PromptAlign: any `TokenAlignmentTuning`) as a differentiable function of its
attacked views (`--attack-target adaptive`, mode full+bpda+eot; `fn(method, views01 (B, N, 3, S, S) in [0, 1]) ->
logits (B, C)`).

The same computation as `TokenAlignmentTuning.tune` + the prediction of view 0, written so that the attacker's
gradient runs through it: each AdamW step of every prompt tensor written out (`prompt_tuning_adaptive.adamw_step`,
torch's update op for op) on the gradient of the method's loss taken with `create_graph=True`, second order through
the towers the prompts enter, so the tuned prompts are a differentiable function of the pixels. BPDA: the confident
views are chosen on the forward pass and their indices are constants on the backward pass. Not replicated:
GradScaler's skipped step on an fp16 overflow.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from .prompt_tuning_adaptive import adamw_step
from .token_alignment import like_prompts, prompt_tensors

if TYPE_CHECKING:
    from .token_alignment import TokenAlignmentTuning

AdamWStep = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def token_alignment_logits(method: TokenAlignmentTuning, views01: torch.Tensor,
                           step_fn: AdamWStep = adamw_step) -> torch.Tensor:
    """`step_fn`: the update (`adamw_step`'s arguments), which a method's own module passes so that a test can
    replace it there (one that cuts the gradient through the update measures what the update carries)."""
    cfg = method.config
    out = []
    # double backward through the towers' attention: the math kernel (the fused ones have none)
    with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):
        for views in views01:
            x = method.model.normalize(views)
            tensors = [t.clone().requires_grad_(True) for t in prompt_tensors(method.initial)]
            moments = [(torch.zeros_like(t), torch.zeros_like(t)) for t in tensors]
            chosen = None
            for step in range(1, cfg.steps + 1):
                loss, chosen = method.step_loss(x, like_prompts(method.initial, tensors), chosen)
                grads = torch.autograd.grad(loss, tensors, create_graph=True, allow_unused=True)
                # a tensor no block reads (depth past the towers) has no gradient: AdamW leaves it as it is
                updated = [(t, m, v) if g is None else step_fn(t, g, m, v, step, cfg.lr, cfg.weight_decay)
                           for t, g, (m, v) in zip(tensors, grads, moments, strict=True)]
                tensors = [u[0] for u in updated]
                moments = [(u[1], u[2]) for u in updated]
            logits, _ = method.forward(x[:1], like_prompts(method.initial, tensors))
            out.append(logits[0])
    return torch.stack(out).float()
