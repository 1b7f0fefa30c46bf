"""GS-Bias: two logit biases tuned per test image, a global one on its views and a spatial one on its patch tokens.

As its authors' `run_gsbias.GSBias` computes it (hzhxmu/GS-Bias@0b62401), per image, with s the logit scale, W
the (C, D) class head, G the N views' unit features and P view 0's unit patch tokens (a ViT's, through `ln_post`
and `proj`):

1. b_g = b_s = 0 (C,), h_g = h_s = 0; at each of at most `steps` steps, the step's biases are
   c = m b + (1 - m) h (m = `momentum`);
2. the global loss: TPT's marginal entropy of the int(N x selection_p) lowest-entropy rows of s G W^T + c_g;
   the spatial loss: the same of the rows s P W^T + c_s of the `top_k` patches with the largest
   sum_c softmax_over_patches(s P W^T)[:, c] (a shift of a class's column by c_s leaves that softmax unchanged,
   so the patches do not depend on the bias);
3. from the second step on, once |loss_g / first loss_g - 1| > stop_change %, tuning stops here (no update);
4. else h = c and b -= step x dL/db, where dL/db = dL/dc on the first step (h is b itself there) and
   m dL/dc after (h no longer depends on the b being updated): their autograd.grad on b;
5. the prediction: s f_0 W^T + (m b_g + (1 - m) h_g) + (m b_s + (1 - m) h_s).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from ...models.tower_tokens import image_tokens, tower_kind
from ..base import MethodOutput
from ..common.confidence import marginal_entropy_as_tpt, select_confident
from ..context import SampleContext
from ..head_kinds import text_head
from ..kinds import EpisodicMethod
from .spec import GSBiasConfig, GSBiasSpec


@dataclass
class BiasTuning:
    """What one image's tuning did: the final logits (C,), the two biases added, and per step computed the losses,
    the confident views (k,) and, per update, the gradients with respect to b (their autograd.grad)."""
    logits: torch.Tensor
    global_bias: torch.Tensor
    spatial_bias: torch.Tensor
    patches: torch.Tensor
    losses_g: list[float] = field(default_factory=list)
    losses_s: list[float] = field(default_factory=list)
    selected: list[torch.Tensor] = field(default_factory=list)
    grads_g: list[torch.Tensor] = field(default_factory=list)
    grads_s: list[torch.Tensor] = field(default_factory=list)


def top_patches(patch_logits: torch.Tensor, k: int) -> torch.Tensor:
    """(P, C) patch logits -> the k patches with the largest sum over classes of their softmax over patches."""
    return torch.topk(patch_logits.softmax(dim=0).sum(dim=1), k).indices


def tune_biases(view_logits: torch.Tensor, patch_logits: torch.Tensor, cfg: GSBiasConfig) -> BiasTuning:
    """(N, C) view logits (view 0 the original) and (P, C) patch logits, both s x unit feature . class head, no
    bias -> GS-Bias's tuning and prediction (module docstring), in float32."""
    view_logits, patch_logits = view_logits.float().detach(), patch_logits.float().detach()
    patches = top_patches(patch_logits, cfg.top_k)
    chosen = patch_logits[patches]
    zeros = torch.zeros(view_logits.shape[-1], device=view_logits.device)
    b_g, b_s, h_g, h_s = zeros, zeros, zeros, zeros
    m = cfg.momentum
    out = BiasTuning(view_logits[0], zeros, zeros, patches)
    for step in range(cfg.steps):
        c_g = (m * b_g + (1 - m) * h_g).requires_grad_(True)
        c_s = (m * b_s + (1 - m) * h_s).requires_grad_(True)
        biased = view_logits + c_g
        selected = select_confident(biased.detach(), cfg.selection_p)
        loss_g = marginal_entropy_as_tpt(biased[selected])
        loss_s = marginal_entropy_as_tpt(chosen + c_s)
        out.losses_g.append(float(loss_g.detach()))
        out.losses_s.append(float(loss_s.detach()))
        out.selected.append(selected)
        first = out.losses_g[0]
        if step >= 1 and abs((out.losses_g[-1] - first) / first) * 100 > cfg.stop_change:
            break
        through = 1.0 if step == 0 else m
        grad_g = through * torch.autograd.grad(loss_g, c_g)[0]
        grad_s = through * torch.autograd.grad(loss_s, c_s)[0]
        out.grads_g.append(grad_g)
        out.grads_s.append(grad_s)
        h_g, h_s = c_g.detach(), c_s.detach()
        b_g, b_s = b_g - cfg.alpha * grad_g, b_s - cfg.beta * grad_s
    out.global_bias = m * b_g + (1 - m) * h_g
    out.spatial_bias = m * b_s + (1 - m) * h_s
    out.logits = view_logits[0] + out.global_bias + out.spatial_bias
    return out


class GSBias(EpisodicMethod):
    """GS-Bias: a global and a spatial logit bias, tuned on one image's views and patch tokens, then reset."""
    spec = GSBiasSpec

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        visual = self.model.clip.visual
        try:
            tower_kind(visual)          # a ResNet is refused before this (spec.towers)
        except ValueError as exc:
            raise ValueError(f"gs_bias: {self.model.name}: {exc}") from None
        patches = visual.grid_size[0] * visual.grid_size[1]
        if self.config.top_k > patches:
            raise ValueError(f"gs_bias.top_k: {self.config.top_k} is more than the {patches} patch tokens of "
                             f"{self.model.name}'s ViT")

    def prepare(self) -> None:
        _ = text_head(self)

    @property
    def scale(self) -> float:
        return self.config.logit_scale if self.config.logit_scale is not None else self.model.logit_scale

    def patch_tokens(self, view0: torch.Tensor) -> torch.Tensor:
        """(1, 3, S, S) normalised view 0 -> (P, D) unit patch tokens (the tower run under the run's precision)."""
        image = view0.to(self.model.input_dtype)
        if self.model.channels_last:
            image = image.contiguous(memory_format=torch.channels_last)
        with torch.inference_mode(), self.precision.autocast():
            tokens = image_tokens(self.model.clip.visual, image)
        return F.normalize(tokens[0, 1:].float(), dim=-1)

    def tune(self, ctx: SampleContext) -> BiasTuning:
        if ctx.views is None:
            raise ValueError("gs_bias reads view 0's patch tokens and needs its pixels, not stored features")
        head = text_head(self).float()
        view_logits = self.scale * ctx.image_features.float() @ head.T
        patch_logits = self.scale * self.patch_tokens(ctx.views[:1]).to(head.device) @ head.T
        with torch.enable_grad():
            return tune_biases(view_logits, patch_logits, self.config)

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        res = self.tune(ctx)
        return MethodOutput(res.logits, extras={"steps": len(res.losses_g), "updates": len(res.grads_g),
                                                "loss_g": res.losses_g[-1], "loss_s": res.losses_s[-1]})
