"""Prompt tuning (TPT, C-TPT, O-TPT, R-TPT, A-TPT, N-TPT: any `PromptTuning` whose `loss` and `readout` it calls)
as a differentiable function of the attacked views (`--attack-target adaptive`, mode full+bpda+eot;
`fn(method, views01 (B, N, 3, S, S) in [0, 1]) -> logits (B, C)`).

The same computation as `PromptTuning.tune` + `readout`, written so that the attacker's gradient runs through it:
the views through the image tower with their gradient, each AdamW step of the context written out (torch's AdamW
update, op for op) on the gradient of the method's own loss taken with `create_graph=True` (so the tuned context
is a differentiable function of the pixels, second order through the text tower), then the method's readout with
the tuned prompt. BPDA: the confident views are selected on the forward pass and their indices are constants on the
backward pass (a selection has no gradient). Not replicated: GradScaler's skipped step on an fp16 overflow (the
gradient here is unscaled) and TPT's shared first-step graph (a fresh forward gives the same numbers).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..common.confidence import select_confident
from ..common.differentiable import encode_views01

if TYPE_CHECKING:
    from .prompt_tuning import PromptTuning

BETAS = (0.9, 0.999)   # torch.optim.AdamW's defaults, which PromptTuning.tune (and the authors) keep
ADAM_EPS = 1e-8


def adamw_step(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, step: int,
               lr: float, weight_decay: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """torch.optim.AdamW's single-tensor update without in-place ops (so autograd sees it): -> param, m, v."""
    beta1, beta2 = BETAS
    param = param * (1 - lr * weight_decay)
    exp_avg = exp_avg + (grad - exp_avg) * (1 - beta1)
    exp_avg_sq = exp_avg_sq * beta2 + grad * grad * (1 - beta2)
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    denom = exp_avg_sq.sqrt() / math.sqrt(bias_correction2) + ADAM_EPS
    return param - (lr / bias_correction1) * exp_avg / denom, exp_avg, exp_avg_sq


def prompt_tuning_logits(method: PromptTuning, views01: torch.Tensor) -> torch.Tensor:
    cfg = method.config
    feats = encode_views01(method, views01)                                      # (B, N, D)
    b = feats.shape[0]
    scale = method.model.logit_scale
    ctx = method.prompt.init_ctx.detach().unsqueeze(0).repeat(b, 1, 1).requires_grad_(True)
    exp_avg = torch.zeros_like(ctx)
    exp_avg_sq = torch.zeros_like(ctx)
    selected = None
    # double backward through the text tower's attention: the math kernel (the fused ones have none)
    with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):
        for step in range(1, cfg.steps + 1):
            with method.precision.autocast():
                text = method.prompt.features(ctx)                               # (B, C, D)
                logits = scale * torch.einsum("bnd,bcd->bnc", feats.to(text.dtype), text)
            logits = logits.float()
            if selected is None:   # bpda: chosen once at the first step, as tune() does; constant on the backward
                selected = select_confident(logits.detach(), cfg.selection_ratio)
            chosen = torch.gather(logits, 1, selected.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
            losses, _ = method.loss(chosen, text.float())
            (grad,) = torch.autograd.grad(losses.sum(), ctx, create_graph=True)
            ctx, exp_avg, exp_avg_sq = adamw_step(ctx, grad, exp_avg, exp_avg_sq, step, cfg.lr, cfg.weight_decay)
        with method.precision.autocast():
            text = method.prompt.features(ctx).float()
    logits, _ = method.readout(feats, text)
    return logits.float()
