"""Episodic test-time prompt tuning: TPT, C-TPT, O-TPT and R-TPT (RLCF's student too: methods/rlcf/).

One shared recipe (TPT, Shu et al. 2022): learnable context vectors start from the
embeddings of "a photo of a" for every image; the image tower is frozen, so the
views are encoded once and only the text tower runs per step; the most confident
views (lowest entropy) give an unsupervised loss; AdamW takes `steps` steps.

The variants differ in the loss and the readout:
- TPT: entropy of the mean probability of the selected views; predict view 0.
- C-TPT (Yoon et al. 2024): TPT's loss - lambda * ATFD (text feature dispersion).
- O-TPT (Sharifdeen et al. 2025): TPT's loss + lambda * an orthogonality penalty on the
  class features (how far each row of their Gram matrix is from unit length).
- R-TPT (Sheng et al. 2025): mean of the selected views' entropies; predict a
  reliability-weighted average of all views' tuned logits.

Several images are tuned together as one batch: each has its own context rows and,
because AdamW is elementwise, its own optimizer state, so results equal tuning the
images one at a time.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...models.text import ContextPrompt
from ..base import Method, MethodOutput
from ..common.confidence import marginal_entropy, mean_entropy, select_confident
from ..context import SampleContext
from .spec import (
    CTPTSpec,
    OTPTSpec,
    RTPTSpec,
    TPTSpec,
)


def text_dispersion(text_features: torch.Tensor) -> torch.Tensor:
    """ATFD: mean L2 distance of normalised class features to their mean: (..., C, D) -> (...)."""
    centre = text_features.mean(dim=-2, keepdim=True)
    return (text_features - centre).norm(dim=-1).mean(-1)


def orthogonality_penalty(text_features: torch.Tensor) -> torch.Tensor:
    """O-TPT's penalty: mean over classes of | ||row c of T T^T|| - 1 |, (..., C, D) normalised -> (...).

    The authors (otpt_classification.py:236-286) reflect each row w_c of W = T T^T with the Householder
    matrix that maps it onto its c-th axis, H_c w_c = ||w_c|| e_c (H_c = I - 2 v v^T, v along
    w_c - ||w_c|| e_c), and take the mean of ||H_c w_c - e_c||. That equals | ||w_c|| - 1 | for every T,
    so its value and its gradient are this closed form's; the closed form needs C x C memory where the
    authors' reflections need C x C x C (ImageNet's 1000 classes: 4 GB in float32)."""
    gram = text_features @ text_features.transpose(-1, -2)              # (..., C, C)
    return (gram.norm(dim=-1) - 1).abs().mean(-1)


def reliability_weights(image_features: torch.Tensor, k: int = 20, temperature: float = 0.01,
                        self_mask: str = "index", sim: torch.Tensor | None = None) -> torch.Tensor:
    """R-TPT's view weights: softmax(mean of each view's top-k neighbour similarities / T).

    `self_mask="index"` removes the diagonal by position (the evident intent);
    `"threshold"` reproduces the authors' rule, which drops every entry >= 1.0 and so
    keeps a view as its own neighbour whenever rounding leaves its self-similarity below 1.
    """
    sim = image_features @ image_features.transpose(-1, -2) if sim is None else sim.clone()
    n = sim.shape[-1]
    if self_mask == "index":
        eye = torch.eye(n, dtype=torch.bool, device=sim.device)
        sim = sim.masked_fill(eye, float("-inf"))
    elif self_mask == "threshold":
        sim = sim.masked_fill(sim >= 1.0, float("-inf"))
    else:
        raise ValueError(f"self_mask must be 'index' or 'threshold', got {self_mask!r}")
    score = sim.topk(min(k, n - 1), dim=-1).values.mean(-1)
    return (score / temperature).softmax(-1)


class PromptTuning(Method):
    """Shared machinery; subclasses define `loss` and `readout` (their specs: `PromptTuningSpec`'s)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        cfg = self.config
        init: str | torch.Tensor | None = cfg.ctx_init
        if cfg.ctx_checkpoint:
            state = torch.load(cfg.ctx_checkpoint, map_location="cpu", weights_only=True)
            state = state.get("state_dict", state)
            init = next(v for k, v in state.items() if k.endswith("ctx"))
        self.prompt = ContextPrompt(self.model, self.classnames, n_ctx=cfg.n_ctx, ctx_init=init,
                                    share_prefix=cfg.share_prefix)
        self.prompt.ctx.requires_grad_(False)

    def prepare(self) -> None:
        super().prepare()
        if self.config.steps > 0:
            self._initial_text_graph()

    def _initial_text_graph(self) -> tuple[torch.nn.Parameter, torch.Tensor]:
        """Class features at the initial context (C, D) with their autograd graph, computed once per run.

        The first tuning step of every image starts from the same context, so its text forward is
        the same computation each time; TPT, C-TPT and R-TPT of one run share it too (same prompt,
        same precision). Each image then costs one backward through this retained graph."""
        cfg = self.config
        key = ("initial_prompt_graph", cfg.n_ctx, cfg.ctx_init, cfg.ctx_checkpoint, self.prompt.share_prefix,
               self.precision.key)
        shared = self.heads.shared
        if key not in shared:
            ctx0 = torch.nn.Parameter(self.prompt.init_ctx.clone())
            with torch.enable_grad(), self.precision.autocast():
                shared[key] = (ctx0, self.prompt.features(ctx0))
        return shared[key]

    # -- variant hooks ------------------------------------------------------------
    def loss(self, selected_logits: torch.Tensor, text_features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Per-sample losses (B,) and per-sample extras {name: (B,) tensor}."""
        raise NotImplementedError

    def on_selection(self, selected: torch.Tensor) -> None:
        """The views the first step selected (B, k), once per tuning, before the first loss (RLCF encodes
        them with its reward model here)."""

    def readout(self, image_features: torch.Tensor, text_features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Tuned class features (B, C, D) -> logits (B, C) and extras."""
        scale = self.model.logit_scale
        return scale * torch.einsum("bd,bcd->bc", image_features[:, 0], text_features), {}

    # -- the tuning loop ----------------------------------------------------------
    def tune(self, image_features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """(B, N, D) frozen view features -> tuned context (B, n_ctx, W) and per-sample extras."""
        cfg = self.config
        b = image_features.shape[0]
        ctx = torch.nn.Parameter(self.prompt.init_ctx.unsqueeze(0).repeat(b, 1, 1))
        optimizer = torch.optim.AdamW([ctx], lr=cfg.lr, weight_decay=cfg.weight_decay)
        scale = self.model.logit_scale
        scaled = self.precision.loss_scaling
        selected = None
        extras: dict[str, torch.Tensor] = {}
        for step in range(cfg.steps):
            if step == 0:
                # every image's first step starts from the same context: reuse the run's shared forward
                ctx0, text0 = self._initial_text_graph()
                text = text0.detach().unsqueeze(0).repeat(b, 1, 1).requires_grad_(True)   # (B, C, D)
            else:
                with self.precision.autocast():
                    text = self.prompt.features(ctx)                                   # (B, C, D)
            with self.precision.autocast():
                logits = scale * torch.einsum("bnd,bcd->bnc", image_features.to(text.dtype), text)
            logits = logits.float()
            if selected is None:  # the authors select once, at the first step, and keep the views
                selected = select_confident(logits.detach(), cfg.selection_ratio)   # (B, k)
                self.on_selection(selected)
            chosen = torch.gather(logits, 1, selected.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
            losses, step_extras = self.loss(chosen, text.float())
            extras.setdefault("loss", losses.detach())
            for key, val in step_extras.items():
                extras.setdefault(key, val.detach())
            optimizer.zero_grad(set_to_none=True)
            before = ctx.detach().clone()
            total = losses.sum() * (cfg.loss_scale if scaled else 1.0)
            if step == 0:
                (grad_text,) = torch.autograd.grad(total, text)
                # one backward through the shared graph per image (the cotangents differ)
                ctx.grad = torch.stack([torch.autograd.grad(text0, ctx0, g, retain_graph=True)[0]
                                        for g in grad_text]).to(ctx.dtype)
            else:
                total.backward()
            if scaled:
                ctx.grad.div_(cfg.loss_scale)
            finite = torch.isfinite(ctx.grad).flatten(1).all(-1)
            optimizer.step()
            if scaled and not bool(finite.all()):
                # GradScaler skips the step on overflow; do so per image
                with torch.no_grad():
                    ctx[~finite] = before[~finite]
        if selected is not None:  # steps=0: no tuning, nothing selected (zero-shot with the prompt)
            extras["selected"] = selected
        return ctx.detach(), extras

    def auto_batch_size(self, n: int) -> int:
        """Images tuned together: 1 on CPU (keeps peak memory low); on CUDA as many as half the free
        memory holds, from the text tower's activation footprint per image."""
        if self.config.batch_size:
            return self.config.batch_size
        if self.model.device.type != "cuda":
            return 1
        clip = self.prompt.clip
        width = clip.token_embedding.weight.shape[1]
        layers = len(clip.transformer.resblocks)
        bytes_per = 2 if self.precision.amp_dtype is not None else 4
        # ~20 saved activations of `width` per token and layer (attention, MLP at 4x width, norms)
        per_image = self.prompt.n_classes * self.prompt.length * width * layers * 20 * bytes_per
        free, _ = torch.cuda.mem_get_info(self.model.device)
        return int(max(1, min(n, (free // 2) // max(per_image, 1))))

    def predict_batch(self, ctxs: Sequence[SampleContext]) -> list[MethodOutput]:
        return self.in_groups(ctxs, self.auto_batch_size(len(ctxs)), self._predict_group)

    def predict_context(self, ctx: SampleContext) -> MethodOutput:
        return self._predict_group([ctx])[0]

    def _predict_group(self, ctxs: Sequence[SampleContext]) -> list[MethodOutput]:
        feats = torch.stack([c.image_features for c in ctxs])                      # (B, N, D)
        with torch.enable_grad():
            tuned, extras = self.tune(feats)
        with torch.no_grad(), self.precision.autocast():
            text = self.prompt.features(tuned).float()
        logits, read_extras = self.readout(feats, text)
        extras.update(read_extras)
        outputs = []
        for i in range(len(ctxs)):
            ex = {k: _scalar(v[i]) for k, v in extras.items() if k != "selected"}
            if "selected" in extras:
                ex["selected"] = extras["selected"][i].tolist()
            outputs.append(MethodOutput(logits[i].float(), extras=ex))
        return outputs


def _scalar(value: torch.Tensor):
    return float(value) if value.numel() == 1 else value.tolist()


class TPT(PromptTuning):
    """TPT: marginal entropy of the confident views, one AdamW step, predict view 0."""
    spec = TPTSpec

    def loss(self, selected_logits: torch.Tensor, text_features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        return marginal_entropy(selected_logits), {}


class CTPT(PromptTuning):
    """C-TPT: TPT's loss - lambda * ATFD of the class features in the same forward pass."""
    spec = CTPTSpec

    def loss(self, selected_logits: torch.Tensor, text_features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        entropy_loss = marginal_entropy(selected_logits)
        atfd = text_dispersion(text_features)
        return entropy_loss - self.config.lambda_atfd * atfd, {"entropy_loss": entropy_loss, "atfd": atfd}

    def readout(self, image_features: torch.Tensor, text_features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        logits, extras = super().readout(image_features, text_features)
        return logits, {"atfd_after": text_dispersion(text_features)}


class OTPT(PromptTuning):
    """O-TPT: TPT's loss + lambda * the orthogonality penalty of the class features in the same forward pass."""
    spec = OTPTSpec

    def loss(self, selected_logits: torch.Tensor, text_features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        entropy_loss = marginal_entropy(selected_logits)
        penalty = orthogonality_penalty(text_features)
        return entropy_loss + self.config.lambda_ortho * penalty, {"entropy_loss": entropy_loss,
                                                                   "orthogonality": penalty}

    def readout(self, image_features: torch.Tensor, text_features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        logits, _ = super().readout(image_features, text_features)
        return logits, {"orthogonality_after": orthogonality_penalty(text_features)}


class RTPT(PromptTuning):
    """R-TPT: mean per-view entropy of the confident views; reliability-weighted ensemble of all views."""
    spec = RTPTSpec

    def loss(self, selected_logits: torch.Tensor, text_features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        return mean_entropy(selected_logits), {}

    def readout(self, image_features: torch.Tensor, text_features: torch.Tensor) -> tuple[torch.Tensor, dict]:
        cfg = self.config
        scale = self.model.logit_scale
        view_logits = scale * torch.einsum("bnd,bcd->bnc", image_features, text_features)
        weights = reliability_weights(image_features, cfg.k_neighbours, cfg.temperature, cfg.self_mask)
        logits = torch.einsum("bn,bnc->bc", weights, view_logits)
        w_entropy = -(weights * weights.clamp_min(1e-30).log()).sum(-1)
        return logits, {"weight_entropy": w_entropy}
